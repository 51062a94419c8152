//! The side topic unreadable during an assignment (findings F13 and F6), injected with
//! librdkafka's mock cluster: the real broker cannot make one partition leaderless while
//! keeping its data. (Every other fault test runs on the real broker.)
//!
//! A first life splits at 3,000, processes catch-up `[0, 1000)` and live `[3000, 3200)`,
//! commits (main log 1,000, side entry `l=3200`) and crashes. While the second life is
//! assigned the partition, the side topic's partition has no leader. Reading a side entry
//! that exists as "no entry" would make the split stale and overwrite the live progress
//! (F13); leaving the partition assigned without a runtime would stall it (F6). The partition
//! must wait, deliver nothing, and once the side topic is back resume the split: catch-up
//! from 1,000, live from 3,200 — nothing of `[3000, 3200)` again, nothing missing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use catchup::{CatchupConfig, CatchupConsumer, DeliveryLane, Event, Mode};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const TOPIC: &str = "orders";
const SIDE_TOPIC: &str = "catchup-side-mock";
const GROUP: &str = "mock-group";
const BACKLOG: i64 = 3000;
const FRESH: i64 = 500;
const G1: i64 = 1000;
const L1: i64 = 3200;
const WAIT: Duration = Duration::from_secs(90);

fn client(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", GROUP)
        .set("session.timeout.ms", "6000")
        .set("enable.partition.eof", "false");
    config
}

async fn produce(bootstrap: &str, from: i64, count: i64) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("producer");
    for index in from..from + count {
        let value = format!("record-{index}");
        producer
            .send(
                FutureRecord::to(TOPIC)
                    .key(&value)
                    .payload(&value)
                    .partition(0),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|(err, _)| panic!("producing to the mock cluster: {err}"));
    }
}

fn config(dir: &std::path::Path, mode: Mode) -> CatchupConfig {
    CatchupConfig::new(dir)
        .mode(mode)
        .min_lag(100)
        .side_topic(SIDE_TOPIC)
        .commit_interval(Duration::from_millis(200))
}

async fn next(consumer: &CatchupConsumer, what: &str) -> catchup::Delivery {
    tokio::time::timeout(WAIT, consumer.recv())
        .await
        .unwrap_or_else(|_| panic!("no delivery within {WAIT:?} while waiting for {what}"))
        .expect("recv")
}

async fn wait_for(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    what: &str,
    mut matches: impl FnMut(&Event) -> bool,
) -> Event {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(event)) if matches(&event) => return event,
            Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(err)) => panic!("event channel closed: {err}"),
            Err(_) => panic!("no {what} within {WAIT:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_side_topic_defers_the_partition_and_loses_no_progress() {
    let cluster = MockCluster::new(3).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic(TOPIC, 1, 1).expect("topic");
    cluster.create_topic(SIDE_TOPIC, 1, 1).expect("side topic");
    cluster.partition_leader(TOPIC, 0, Some(1)).expect("leader");
    cluster
        .partition_leader(SIDE_TOPIC, 0, Some(2))
        .expect("leader");
    produce(&bootstrap, 0, BACKLOG).await;
    {
        // The group starts at 0.
        let operator: BaseConsumer = client(&bootstrap).create().expect("consumer");
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(TOPIC, 0, Offset::Offset(0))
            .expect("offset");
        operator
            .commit(&offsets, rdkafka::consumer::CommitMode::Sync)
            .expect("commit 0");
    }

    // First life, Concurrent: catch-up [0, G1) and live [BACKLOG, L1) processed, then a crash.
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let first = CatchupConsumer::new(&client(&bootstrap), config(dir.path(), Mode::Concurrent))
            .expect("consumer");
        let mut events = first.events();
        first.subscribe(&[TOPIC]).expect("subscribe");
        let split = wait_for(&mut events, "split", |e| {
            matches!(e, Event::SplitStarted { .. })
        })
        .await;
        assert!(
            matches!(
                split,
                Event::SplitStarted {
                    from: 0,
                    boundary: BACKLOG,
                    ..
                }
            ),
            "{split:?}"
        );
        produce(&bootstrap, BACKLOG, FRESH).await;
        let (mut catchup_next, mut live_next) = (0, BACKLOG);
        while catchup_next < G1 || live_next < L1 {
            let delivery = next(&first, "the first life's records").await;
            match delivery.lane {
                DeliveryLane::Catchup if delivery.offset < G1 => {
                    first.ack(&delivery);
                    catchup_next = delivery.offset + 1;
                }
                DeliveryLane::Live if delivery.offset < L1 => {
                    first.ack(&delivery);
                    live_next = delivery.offset + 1;
                }
                _ => {}
            }
        }
        first.commit().await.expect("commit");
        // dropped without close: a crash
    }

    // The side topic's partition loses its leader: the side log cannot be read.
    cluster
        .partition_leader(SIDE_TOPIC, 0, None)
        .expect("leaderless");
    let dir_b = tempfile::tempdir().expect("tempdir");
    let second = CatchupConsumer::new(&client(&bootstrap), config(dir_b.path(), Mode::Ordered))
        .expect("consumer");
    let mut events = second.events();
    second.subscribe(&[TOPIC]).expect("subscribe");
    let assigned = wait_for(&mut events, "assignment", |e| {
        matches!(e, Event::Assigned { .. })
    })
    .await;
    assert_eq!(
        assigned,
        Event::Assigned {
            partitions: vec![(TOPIC.to_owned(), 0)]
        }
    );
    wait_for(&mut events, "an error reading the side topic", |e| {
        matches!(e, Event::Error { message } if message.contains(SIDE_TOPIC) && message.contains("wait"))
    })
    .await;
    // Nothing may be delivered while the split cannot be read.
    let early = tokio::time::timeout(Duration::from_secs(3), second.recv()).await;
    assert!(
        early.is_err(),
        "delivered while the side topic was unreadable: {early:?}"
    );

    cluster
        .partition_leader(SIDE_TOPIC, 0, Some(2))
        .expect("leader back");
    let resumed = wait_for(&mut events, "the split's resumption", |e| {
        matches!(
            e,
            Event::SplitResumed { .. } | Event::SplitStarted { .. } | Event::StaleState { .. }
        )
    })
    .await;
    // Resumed, or re-split because the live lane is itself `min_lag` behind: either way from
    // the side entry's live progress (a stale entry would split again from G1).
    assert!(
        matches!(
            resumed,
            Event::SplitResumed { .. } | Event::SplitStarted { from: L1, .. }
        ),
        "the split resumes with its live progress, not {resumed:?}"
    );
    let mut delivered = BTreeSet::new();
    let first = next(&second, "the first record after the outage").await;
    assert_eq!(
        first.offset, G1,
        "catch-up resumes at the main log's offset"
    );
    delivered.insert(first.offset);
    let end = BACKLOG + FRESH;
    while delivered.len() < (end - G1 - (L1 - BACKLOG)) as usize {
        let delivery = next(&second, "the rest").await;
        assert!(
            !(BACKLOG..L1).contains(&delivery.offset),
            "offset {} of the live progress already processed came again: the side entry was overwritten",
            delivery.offset
        );
        delivered.insert(delivery.offset);
        second.ack(&delivery);
    }
    let expected: BTreeSet<i64> = (G1..BACKLOG).chain(L1..end).collect();
    assert_eq!(delivered, expected);
    second.close().await.expect("close");
}
