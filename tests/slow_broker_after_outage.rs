//! An outage the consumer announced (`Event::BrokersUnreachable`) ends at the first request of
//! the group member that gets through, not only at its next probe. The probe is a metadata
//! request given 1 s; a broker that comes back slow answers it too late every time, while the
//! member's commits (given 30 s) go through. Before, the consumer went on saying the brokers
//! could not be reached while it committed, for as long as the broker stayed slow (a
//! clean-clone run of the broker-restart test ended so: the member reconnected less than one
//! probe period before the end). The real broker cannot be made slow on demand, so this runs
//! on librdkafka's mock cluster: one broker taken down, then up again answering every request
//! after `SLOW`.

use std::time::Duration;

use catchup::{CatchupConsumer, Event, Mode};

mod support;

const RECORDS: usize = 10;
/// Longer than the probe's 1 s, far shorter than a commit's 30 s.
const SLOW: Duration = Duration::from_millis(2500);
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_gets_through_ends_the_announced_outage() {
    let (topic, group) = ("orders", "slow-broker-group");
    let (cluster, kafka) = support::mock_cluster(topic, group);
    kafka.produce(topic, 1, RECORDS).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let mut client = kafka.consumer_config(group);
    // The group outlives the outage: what is tested is the announcement, not a rejoin.
    client.set("session.timeout.ms", "45000");
    let config = support::test_config(dir.path(), Mode::Off, 100);
    let consumer = CatchupConsumer::new(&client, config).expect("consumer");
    let mut events = consumer.events();
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut taken = Vec::new();
    for _ in 0..RECORDS {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        taken.push(delivery);
    }
    let (before, after) = taken.split_at(RECORDS / 2);
    consumer.ack_many(before);
    consumer.commit().await.expect("commit before the outage");

    cluster.broker_down(1).expect("broker down");
    let unreachable = |e: &Event| matches!(e, Event::BrokersUnreachable { .. });
    support::wait_for_named_event(&mut events, WAIT, "BrokersUnreachable", unreachable).await;
    cluster
        .broker_round_trip_time(1, SLOW)
        .expect("slow broker");
    cluster.broker_up(1).expect("broker up");

    // The rest acknowledged: the next commit has something to send, and gets through.
    consumer.ack_many(after);
    let reachable = |e: &Event| matches!(e, Event::BrokersReachable);
    support::wait_for_named_event(&mut events, WAIT, "BrokersReachable", reachable).await;
    consumer.commit().await.expect("commit after the outage");
    cluster
        .broker_round_trip_time(1, Duration::ZERO)
        .expect("broker at speed");
    let committed = kafka.committed(group, topic, 1);
    assert_eq!(
        committed,
        vec![Some(RECORDS as i64)],
        "committed at the end"
    );
    consumer.close().await.expect("close");
}
