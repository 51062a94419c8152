//! An assignment of eight partitions, one of whose leader is down, must not hold the
//! rebalance callback: its time counts against `max.poll.interval.ms`, and a member that
//! overruns it leaves the group and rejoins in a loop. The test broker is a single node and
//! cannot take one partition offline alone, so this runs on librdkafka's mock cluster (two
//! brokers; the offline partition's leader is the one taken down), side by side with the same
//! assignment with every partition online.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use catchup::{CatchupConsumer, ClientHooks, Mode};
use rdkafka::ClientConfig;
use rdkafka::mocking::{MockCluster, MockCoordinator};

mod support;

const PARTITIONS: i32 = 8;
const OFFLINE: i32 = 3;
const WAIT: Duration = Duration::from_secs(60);
/// The default side topic (the mock cluster cannot create topics through the admin API).
const SIDE_TOPIC: &str = "__catchup_side";
/// What one offline partition may add to the assignment: one watermark read's timeout
/// (5 s) and some slack. A read per partition with the request timeout (30 s), as before,
/// exceeds it.
const OFFLINE_COST: Duration = Duration::from_secs(10);

/// When the assignment was reconciled (the hook runs at the end of the callback).
#[derive(Default)]
struct Assigned(Mutex<Option<Instant>>);

impl ClientHooks for Assigned {
    fn assigned(&self, partitions: &[(String, i32)]) {
        if !partitions.is_empty() {
            let mut at = self.0.lock().unwrap_or_else(|p| p.into_inner());
            at.get_or_insert_with(Instant::now);
        }
    }
}

/// From `subscribe` to the end of the callback that reconciled the assignment.
async fn time_to_assigned(offline: bool) -> Duration {
    let cluster = MockCluster::new(2).expect("mock cluster");
    let topic = "orders";
    let group = "offline-group";
    cluster
        .create_topic(topic, PARTITIONS, 1)
        .expect("mock topic");
    cluster.create_topic(SIDE_TOPIC, 1, 1).expect("side topic");
    for partition in 0..PARTITIONS {
        let leader = if offline && partition == OFFLINE {
            2
        } else {
            1
        };
        cluster
            .partition_leader(topic, partition, Some(leader))
            .expect("leader");
    }
    cluster
        .partition_leader(SIDE_TOPIC, 0, Some(1))
        .expect("side leader");
    cluster
        .coordinator(MockCoordinator::Group(group.into()), 1)
        .expect("coordinator");
    if offline {
        // Its leader answers nothing within any of the consumer's timeouts.
        cluster
            .broker_round_trip_time(2, Duration::from_secs(120))
            .expect("slow broker");
    }
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("group.id", group);
    let dir = tempfile::tempdir().expect("tempdir");
    let assigned = Arc::new(Assigned::default());
    let config = support::test_config(dir.path(), Mode::Ordered, 100).hooks(assigned.clone());
    let consumer = CatchupConsumer::new(&client, config).expect("consumer");
    let started = Instant::now();
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = started + WAIT;
    let at = loop {
        if let Some(at) = *assigned.0.lock().unwrap_or_else(|p| p.into_inner()) {
            break at;
        }
        assert!(Instant::now() < deadline, "never assigned");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(consumer);
    at - started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_partition_does_not_hold_the_assignment() {
    let online = time_to_assigned(false).await;
    let offline = time_to_assigned(true).await;
    eprintln!(
        "subscribe to reconciled: all online {online:?}, one of {PARTITIONS} offline {offline:?}"
    );
    assert!(
        offline < online + OFFLINE_COST,
        "one offline partition held the assignment {:?} longer",
        offline.saturating_sub(online)
    );
}
