//! A backlog that ends in offsets no record shows: its last transaction was aborted, read with
//! `read_committed`, and nothing is produced after the split. The catch-up lane's last append
//! then stores no record: it only proves the aborted offsets and the marker, long after the
//! reader took the last committed record. That append alone must wake the reader, which
//! reads the lane through the boundary and tells the backlog drained; the split merges and
//! commits past the marker. The last record stays unacknowledged until then: otherwise the
//! commit cycle reads through the trailing gap itself and wakes the reader, hiding a missing
//! report.
//!
//! The aborted transaction is several fetches long, so that the committed records reach the
//! reader well before the catch-up consumer reaches the end of the partition. (Should the
//! catch-up consumer prove the gap before the reader's first read, one read takes the records
//! and the gap, and the test passes without the lone report: it never fails for it.) Run with
//! the `strict-reads` feature (`scripts/test`): a reader that misses the report of that
//! append then never looks again, and the test stalls; without it, the reader looks again
//! after 100 ms.

mod support;

use std::time::Duration;

use catchup::{CatchupConsumer, Event, Mode};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use support::{Kafka, unique};

const WAIT: Duration = Duration::from_secs(60);
/// Committed records at the start of the backlog.
const COMMITTED: usize = 50;
/// Records of the aborted transaction that ends the backlog, and their size: 6 MiB, six
/// fetches of the partition at librdkafka's default `max.partition.fetch.bytes`.
const ABORTED: usize = 6_000;
const ABORTED_BYTES: usize = 1024;

/// A topic of one partition holding `COMMITTED` committed records (offsets 0..COMMITTED, its
/// marker at COMMITTED), then `ABORTED` aborted ones and their marker. Returns the log end.
async fn backlog_ending_aborted(kafka: &Kafka, topic: &str) -> i64 {
    kafka.create_topic(topic, 1).await;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("transactional.id", unique("gap-producer"))
        .create()
        .expect("transactional producer");
    producer.init_transactions(WAIT).expect("init transactions");

    producer.begin_transaction().expect("begin");
    for index in 0..COMMITTED {
        let payload = format!("record-{index}");
        send(&producer, topic, payload.as_bytes());
    }
    producer
        .commit_transaction(WAIT)
        .expect("commit transaction");

    producer.begin_transaction().expect("begin");
    let aborted = vec![b'x'; ABORTED_BYTES];
    for _ in 0..ABORTED {
        send(&producer, topic, &aborted);
    }
    // Flushed first, so that the aborted records reach the log.
    producer.flush(WAIT).expect("flush");
    producer.abort_transaction(WAIT).expect("abort transaction");

    // The coordinator writes a transaction's markers after it answers the abort.
    let expected = (COMMITTED + 1 + ABORTED + 1) as i64;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, high) = kafka.watermarks(topic, 1)[0];
        if high == expected {
            return high;
        }
        assert!(
            high < expected && tokio::time::Instant::now() < deadline,
            "log end {high}, expected the records and two markers: {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends one record to partition 0, waiting out a full producer queue.
fn send(producer: &ThreadedProducer<DefaultProducerContext>, topic: &str, payload: &[u8]) {
    let mut record = BaseRecord::<(), [u8]>::to(topic)
        .payload(payload)
        .partition(0);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                back,
            )) => {
                record = back;
                producer.poll(Duration::from_millis(10));
            }
            Err((err, _)) => panic!("send: {err}"),
        }
    }
}

async fn reads_through_the_gap(mode: Mode) {
    let kafka = Kafka::connect();
    let topic = unique("gap-end");
    let end = backlog_ending_aborted(&kafka, &topic).await;

    let group = unique("gap-end-group");
    kafka.commit_as_operator(&group, &topic, &[0]);
    let mut client = kafka.consumer_config(&group);
    client.set("isolation.level", "read_committed");
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = CatchupConsumer::new(&client, support::test_config(dir.path(), mode, 50))
        .expect("consumer");
    let (mut events, split) = support::subscribe_until_split(&consumer, &topic).await;
    assert!(
        matches!(split, Event::SplitStarted { from: 0, boundary, .. } if boundary == end),
        "{split:?}"
    );

    // The last record stays unacknowledged until the backlog is drained (see the top).
    let mut payloads = Vec::new();
    let mut last = None;
    while payloads.len() < COMMITTED {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        payloads.push(
            String::from_utf8(delivery.payload.as_deref().unwrap_or_default().to_vec())
                .expect("utf-8"),
        );
        if payloads.len() < COMMITTED {
            consumer.ack(&delivery);
        } else {
            last = Some(delivery);
        }
    }
    let expected: Vec<String> = (0..COMMITTED).map(|i| format!("record-{i}")).collect();
    assert_eq!(payloads, expected, "committed records only, in order");

    // The application waits in `recv` for more, as a consumer does: the reader reads the
    // lane through the gap and tells the backlog drained, with no record to hand out (the
    // commit cycle reads through a trailing gap on its own: the merge does not need it).
    let (mut drained, mut merged) = (false, false);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !(drained && merged) {
        if drained && let Some(last) = last.take() {
            consumer.ack(&last);
        }
        tokio::select! {
            event = events.recv() => match event {
                Ok(Event::CatchupDrained { .. }) => drained = true,
                Ok(Event::Merged { .. }) => merged = true,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(err) => panic!("event channel closed: {err}"),
            },
            // Cancel-safe: `recv` waits only before it hands a record out.
            delivery = consumer.recv() => panic!("nothing left to deliver: {delivery:?}"),
            _ = tokio::time::sleep_until(deadline) => {
                panic!("drained {drained}, merged {merged} within {WAIT:?}")
            }
        }
    }
    support::await_committed_at(&kafka, &consumer, &group, &topic, &[end], WAIT).await;
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_reads_through_a_backlog_ending_in_a_gap() {
    reads_through_the_gap(Mode::Ordered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_through_a_backlog_ending_in_a_gap() {
    reads_through_the_gap(Mode::Concurrent).await;
}
