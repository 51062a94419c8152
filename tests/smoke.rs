//! The test broker works end to end: produce, consume in a group, commit, read back.

mod support;

use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};

const RECORDS: usize = 10_000;
const PARTITIONS: i32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_arrives_exactly_once_and_commits_read_back() {
    let kafka = support::Kafka::connect();
    let topic = support::unique("smoke");
    kafka.create_topic(&topic, PARTITIONS).await;
    let produced = kafka.produce(&topic, PARTITIONS, RECORDS).await;
    assert_eq!(produced.len(), RECORDS);

    let group = support::unique("smoke-group");
    let consumer: StreamConsumer = kafka.consumer_config(&group).create().expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let consumed = support::consume_all(&consumer, RECORDS, Duration::from_secs(90)).await;

    assert_eq!(consumed.records.len(), RECORDS, "records missing");
    for record in &produced {
        let got = consumed.records.get(&(record.partition, record.offset));
        assert_eq!(
            got,
            Some(&(record.key.clone(), record.payload.clone())),
            "{record:?}"
        );
    }
    let repeated: Vec<_> = consumed
        .deliveries
        .iter()
        .filter(|(_, n)| **n != 1)
        .collect();
    assert!(
        repeated.is_empty(),
        "delivered more than once: {repeated:?}"
    );

    let watermarks = kafka.watermarks(&topic, PARTITIONS);
    let committed = kafka.committed(&group, &topic, PARTITIONS);
    for (partition, (low, high)) in watermarks.iter().enumerate() {
        assert_eq!(*low, 0);
        let in_partition = produced
            .iter()
            .filter(|r| r.partition == partition as i32)
            .count() as i64;
        assert_eq!(*high, in_partition, "partition {partition} high watermark");
        assert_eq!(
            committed[partition],
            Some(*high),
            "partition {partition} committed offset"
        );
    }
}
