//! A topic deleted and recreated while a buffer holds its records: the new incarnation numbers
//! its offsets from 0 again, with other data, and Kafka drops the group's offsets. The records
//! of the old incarnation left in the buffer must never be delivered as the new one's
//! (finding F8), even where the new start offset falls inside what the buffer holds — and
//! even when the group has committed on the new incarnation since (another member processed
//! it), which made the old records look like a buffer that fits: only the topic id tells.

mod support;

use std::time::{Duration, Instant};

use catchup::{CatchupConsumer, Event, Mode};
use support::{Kafka, key_and_payload, test_config, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);
/// Records of the new incarnation are numbered from here, so their payloads differ.
const NEW_INDEX: usize = 100_000;

/// Buffers 5,000 records of `topic` after processing and committing 1,000, crashes, and
/// recreates the topic with 3,000 other records. Returns the consumer settings to restart with.
async fn buffer_then_recreate(
    kafka: &Kafka,
    topic: &str,
    group: &str,
    dir: &std::path::Path,
) -> (rdkafka::ClientConfig, catchup::CatchupConfig) {
    kafka.create_topic(topic, 1).await;
    kafka.produce(topic, 1, 5_000).await;
    kafka.commit_as_operator(group, topic, &[0]);
    let config = test_config(dir, Mode::Off, 1_000);
    let mut client = kafka.consumer_config(group);
    client.set("auto.offset.reset", "latest");

    // The first consumer processes and commits 1,000 records and buffers all 5,000, then
    // crashes.
    let first = CatchupConsumer::new(&client, config.clone()).expect("consumer");
    first.subscribe(&[topic]).expect("subscribe");
    for expected in 0..1_000 {
        let delivery = support::next_delivery(&first, WAIT).await;
        assert_eq!(delivery.offset, expected);
        first.ack(&delivery);
    }
    first.commit().await.expect("commit");
    let deadline = Instant::now() + WAIT;
    while first.buffers().expect("buffers")[0].live.fetched_next < 5_000 {
        assert!(Instant::now() < deadline, "the backlog was not buffered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first);

    // The topic is recreated with 3,000 other records; the group's offsets go with the old one.
    kafka.delete_topic(topic).await;
    kafka.create_topic(topic, 1).await;
    kafka.produce_from(topic, 1, NEW_INDEX, 3_000).await;
    assert_eq!(kafka.committed(group, topic, 1), vec![None]);
    (client, config)
}

/// Restarts on the old buffer; the first event about the partition must discard the old
/// records, and offsets `from..3_100` must carry the new incarnation's records.
async fn restart_reads_the_new_incarnation(
    kafka: &Kafka,
    topic: &str,
    group: &str,
    (client, config): (rdkafka::ClientConfig, catchup::CatchupConfig),
    from: i64,
) {
    let second = CatchupConsumer::new(&client, config).expect("consumer");
    let mut events = second.events();
    second.subscribe(&[topic]).expect("subscribe");
    let discarded = wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::LocalDiscarded { .. } | Event::Assigned { .. })
            && !matches!(e, Event::Assigned { partitions } if partitions.is_empty())
    })
    .await;
    assert!(
        matches!(&discarded, Event::LocalDiscarded { reason, .. } if reason.contains("incarnation")),
        "the old records were not discarded: {discarded:?}"
    );
    // Produced once the start is decided: `latest` would start after records produced before.
    wait_for_event(
        &mut events,
        WAIT,
        |e| matches!(e, Event::Assigned { partitions } if !partitions.is_empty()),
    )
    .await;
    kafka.produce_from(topic, 1, NEW_INDEX + 3_000, 100).await;
    for expected in from..3_100 {
        let delivery = support::next_delivery(&second, WAIT).await;
        assert_eq!(delivery.offset, expected);
        let (_, payload) = key_and_payload(topic, NEW_INDEX + expected as usize);
        assert_eq!(
            delivery.payload.as_deref(),
            Some(payload.as_slice()),
            "offset {expected} delivered the old incarnation's record"
        );
        second.ack(&delivery);
    }
    second.close().await.expect("close");
    assert_eq!(kafka.committed(group, topic, 1), vec![Some(3_100)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_incarnation_is_never_delivered() {
    let kafka = Kafka::connect();
    let topic = unique("recreated");
    let group = unique("recreated-group");
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = buffer_then_recreate(&kafka, &topic, &group, dir.path()).await;
    // `latest` starts the group at 3,000, inside the 1,000..5,000 the buffer holds.
    restart_reads_the_new_incarnation(&kafka, &topic, &group, settings, 3_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_the_new_incarnation_does_not_revive_the_old_records() {
    let kafka = Kafka::connect();
    let topic = unique("recreated-committed");
    let group = unique("recreated-committed-group");
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = buffer_then_recreate(&kafka, &topic, &group, dir.path()).await;
    // Another member processed 2,000 records of the new topic: the buffer's 1,000..5,000
    // seems to cover Kafka's 2,000.
    kafka.commit_as_operator(&group, &topic, &[2_000]);
    restart_reads_the_new_incarnation(&kafka, &topic, &group, settings, 2_000).await;
}
