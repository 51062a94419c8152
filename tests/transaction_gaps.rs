//! Offset gaps: a transactional topic with an aborted transaction, read with
//! `read_committed`. Aborted records and transaction markers leave offsets that no record
//! shows; the catch-up lane still ends at the boundary and the split merges.

mod support;

use std::time::Duration;

use catchup::{CatchupConsumer, Event, Mode};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use support::{Kafka, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

fn transaction(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    range: std::ops::Range<usize>,
    commit: bool,
) {
    producer.begin_transaction().expect("begin");
    for index in range {
        let payload = format!("record-{index}");
        let key = format!("key-{index}");
        producer
            .send(
                BaseRecord::to(topic)
                    .key(&key)
                    .payload(&payload)
                    .partition(0),
            )
            .expect("send");
    }
    // Flushed first, so that an aborted transaction's records reach the log too.
    producer.flush(WAIT).expect("flush");
    if commit {
        producer
            .commit_transaction(WAIT)
            .expect("commit transaction");
    } else {
        producer.abort_transaction(WAIT).expect("abort transaction");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transactions_and_markers_do_not_stall_catch_up() {
    let kafka = Kafka::connect();
    let topic = unique("txn");
    kafka.create_topic(&topic, 1).await;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("transactional.id", unique("txn-producer"))
        .create()
        .expect("transactional producer");
    producer.init_transactions(WAIT).expect("init transactions");
    transaction(&producer, &topic, 0..60, true); // offsets 0..60, marker 60
    transaction(&producer, &topic, 60..90, false); // aborted 61..91, marker 91
    transaction(&producer, &topic, 90..150, true); // offsets 92..152, marker 152
    let (_, high) = kafka.watermarks(&topic, 1)[0];
    assert_eq!(high, 153, "three transactions, three markers");

    let group = unique("txn-group");
    kafka.commit_as_operator(&group, &topic, &[0]);
    let mut client = kafka.consumer_config(&group);
    client.set("isolation.level", "read_committed");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Ordered, 50);
    let consumer = CatchupConsumer::new(&client, config).expect("consumer");
    let (mut events, split) = support::subscribe_until_split(&consumer, &topic).await;
    assert!(
        matches!(
            split,
            Event::SplitStarted {
                from: 0,
                boundary: 153,
                ..
            }
        ),
        "{split:?}"
    );

    let mut payloads = Vec::new();
    while payloads.len() < 120 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        payloads.push(
            String::from_utf8(delivery.payload.as_deref().unwrap_or_default().to_vec())
                .expect("utf-8"),
        );
        consumer.ack(&delivery);
    }
    let expected: Vec<String> = (0..60)
        .chain(90..150)
        .map(|i| format!("record-{i}"))
        .collect();
    assert_eq!(payloads, expected, "committed records only, in order");
    wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::CatchupFetched { .. })
    })
    .await;
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&group, &topic, 1),
        vec![Some(153)],
        "merged past the last marker"
    );
    consumer.close().await.expect("close");
}
