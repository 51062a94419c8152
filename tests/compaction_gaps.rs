//! Offset gaps from compaction: the catch-up lane of a compacted topic still ends at the
//! boundary, every surviving record is delivered in order, and the split merges.

mod support;

use std::time::{Duration, Instant};

use catchup::{Event, Mode};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use support::{Kafka, catchup_consumer, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

/// Offsets currently in the log, read from the beginning.
fn surviving_offsets(kafka: &Kafka, topic: &str, high: i64) -> Vec<i64> {
    let reader: BaseConsumer = kafka
        .consumer_config(&unique("compaction-reader"))
        .create()
        .expect("reader");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("offset");
    reader.assign(&list).expect("assign");
    let mut offsets = Vec::new();
    let deadline = Instant::now() + WAIT;
    while offsets.last().is_none_or(|&last| last + 1 < high) {
        assert!(
            Instant::now() < deadline,
            "reading the compacted topic timed out"
        );
        if let Some(message) = reader.poll(Duration::from_millis(100)) {
            offsets.push(message.expect("message").offset());
        }
    }
    offsets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_backlog_still_ends_at_the_boundary() {
    let kafka = Kafka::connect();
    let topic = unique("compacted");
    let configs = [
        ("cleanup.policy", "compact"),
        ("segment.ms", "100"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("min.compaction.lag.ms", "0"),
    ];
    kafka.create_topic_with(&topic, 1, &configs).await;
    // 1000 records over 10 keys; the last one sits in its own segment, so the first
    // segment can be compacted down to one record per key.
    for round in 0..100 {
        let records: Vec<(String, String)> = (0..10)
            .map(|k| (format!("key-{k}"), format!("v{round}-{k}")))
            .collect();
        kafka.produce_keyed(&topic, 0, &records).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // let segment.ms pass: the next append rolls
    kafka
        .produce_keyed(&topic, 0, &[("key-last".into(), "last".into())])
        .await;
    let high = 1001;
    let deadline = Instant::now() + WAIT;
    let survivors = loop {
        let survivors = surviving_offsets(&kafka, &topic, high);
        if survivors.len() < 1000 {
            break survivors;
        }
        assert!(
            Instant::now() < deadline,
            "the log cleaner did not compact the topic"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    let group = unique("compacted-group");
    kafka.commit_as_operator(&group, &topic, &[0]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Ordered, 10);
    let consumer = catchup_consumer(&kafka, &group, config);
    let (mut events, split) = support::subscribe_until_split(&consumer, &topic).await;
    assert!(
        matches!(
            split,
            Event::SplitStarted {
                from: 0,
                boundary: 1001,
                ..
            }
        ),
        "{split:?}"
    );
    // The cleaner may compact further while we read: read up to the last record (it sits in
    // the active segment, which is never compacted).
    let mut delivered = Vec::new();
    while delivered.last() != Some(&(high - 1)) {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        delivered.push(delivery.offset);
        consumer.ack(&delivery);
    }
    assert!(
        delivered.windows(2).all(|w| w[0] < w[1]),
        "in order: {delivered:?}"
    );
    let after = surviving_offsets(&kafka, &topic, high);
    let delivered_set: std::collections::BTreeSet<i64> = delivered.iter().copied().collect();
    assert!(
        after.iter().all(|o| delivered_set.contains(o)),
        "a record still in the log was not delivered"
    );
    assert!(
        delivered.iter().all(|o| survivors.contains(o)),
        "delivered a record compacted before we started"
    );
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.commit().await.expect("commit");
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(high)]);
    consumer.close().await.expect("close");
}
