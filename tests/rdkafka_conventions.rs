//! catchup fits code written for rust-rdkafka: a `Delivery` is an `rdkafka::Message` that
//! reads exactly like the message a plain rdkafka consumer gets for the same record (key,
//! null value, headers with null and empty values, timestamp); `stream()` is `Unpin`;
//! `try_recv` does not wait; `close(&self)` works through an `Arc` while another task waits
//! in `recv`, which then returns `Error::Closed`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use catchup::rdkafka::consumer::{BaseConsumer, Consumer};
use catchup::rdkafka::message::{Header, Headers, OwnedHeaders};
use catchup::rdkafka::producer::{FutureProducer, FutureRecord};
use catchup::rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use catchup::{CatchupConsumer, DeliveryLane, Error, Mode};
use futures::StreamExt;
use support::{Kafka, test_config, unique};

const RECORDS: i64 = 30;
const WAIT: Duration = Duration::from_secs(30);

/// What a handler written against rdkafka's trait sees of a message.
#[derive(Debug, PartialEq)]
struct Seen {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Option<Vec<(String, Option<Vec<u8>>)>>,
    timestamp: Option<i64>,
}

fn seen(message: &impl Message) -> Seen {
    Seen {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key().map(<[u8]>::to_vec),
        payload: message.payload().map(<[u8]>::to_vec),
        headers: message.headers().map(|headers| {
            headers
                .iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect()
        }),
        timestamp: message.timestamp().to_millis(),
    }
}

async fn produce(kafka: &Kafka, topic: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .create()
        .expect("producer");
    for i in 0..RECORDS {
        let key = format!("key-{i}");
        let payload = format!("value-{i}");
        let mut record = FutureRecord::to(topic).partition(0).key(&key);
        // Every third record is a tombstone; headers vary from none to several, with null
        // and empty values.
        if i % 3 != 0 {
            record = record.payload(&payload);
        }
        if i % 2 == 0 {
            let mut headers = OwnedHeaders::new().insert(Header {
                key: "trace",
                value: Some(key.as_bytes()),
            });
            if i % 4 == 0 {
                headers = headers
                    .insert(Header::<&[u8]> {
                        key: "null",
                        value: None,
                    })
                    .insert(Header {
                        key: "empty",
                        value: Some(&b""[..]),
                    });
            }
            record = record.headers(headers);
        }
        producer
            .send(record, Duration::from_secs(20))
            .await
            .unwrap_or_else(|(err, _)| panic!("produce: {err}"));
    }
}

/// The same records as a plain rdkafka consumer reads them.
fn read_plainly(kafka: &Kafka, topic: &str) -> Vec<Seen> {
    let consumer: BaseConsumer = kafka
        .consumer_config(&unique("plain"))
        .create()
        .expect("plain consumer");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&assignment).expect("assign");
    let mut read = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while read.len() < RECORDS as usize {
        assert!(
            std::time::Instant::now() < deadline,
            "plain consumer: {} read",
            read.len()
        );
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            read.push(seen(&message.expect("plain poll")));
        }
    }
    read
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_reads_like_an_rdkafka_message() {
    let kafka = Kafka::connect();
    let topic = unique("rdkafka-conventions");
    kafka.create_topic(&topic, 1).await;
    produce(&kafka, &topic).await;
    let expected = read_plainly(&kafka, &topic);
    assert!(
        expected.iter().any(|s| s.payload.is_none()),
        "tombstones produced"
    );
    assert!(
        expected.iter().any(|s| s.headers.is_none()),
        "records without headers"
    );

    let group = unique("rdkafka-conventions-group");
    kafka.commit_as_operator(&group, &topic, &[0]);
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = Arc::new(
        CatchupConsumer::new(
            &kafka.consumer_config(&group),
            test_config(dir.path(), Mode::Ordered, 10),
        )
        .expect("consumer"),
    );
    consumer.subscribe(&[&topic]).expect("subscribe");

    // `stream()` is Unpin: `next()` needs no pinning.
    let mut delivered = Vec::new();
    {
        let mut stream = consumer.stream();
        while delivered.len() < RECORDS as usize {
            let delivery = tokio::time::timeout(WAIT, stream.next())
                .await
                .expect("delivered in time")
                .expect("the stream never ends")
                .expect("delivery");
            // The backlog's lane: the catch-up consumer's records, whose fields are read from
            // librdkafka directly (as the group member's are), must read like a message.
            assert_eq!(delivery.lane, DeliveryLane::Catchup);
            consumer.ack(&delivery);
            delivered.push(seen(&delivery));
        }
    }
    assert_eq!(delivered, expected);

    // Nothing more is there: `try_recv` answers at once, without awaiting.
    assert!(consumer.try_recv().expect("try_recv").is_none());

    // Closing through the Arc while another task waits in `recv`: that `recv` ends with
    // `Closed`, and so does any later one; closing again is fine.
    let waiting = {
        let consumer = consumer.clone();
        tokio::spawn(async move { consumer.recv().await })
    };
    // Time to start waiting (not needed for the outcome: a recv after close ends the same).
    tokio::time::sleep(Duration::from_millis(200)).await;
    consumer.close().await.expect("close");
    let ended = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the waiting recv ends after close")
        .expect("task");
    assert!(matches!(ended, Err(Error::Closed)), "{ended:?}");
    assert!(matches!(consumer.recv().await, Err(Error::Closed)));
    consumer.close().await.expect("closing twice");
    // The stream yields the error once and ends (it would only repeat).
    let mut stream = consumer.stream();
    assert!(matches!(stream.next().await, Some(Err(Error::Closed))));
    assert!(stream.next().await.is_none(), "the stream ended");
    assert_eq!(
        kafka.committed(&group, &topic, 1),
        [Some(RECORDS)],
        "close committed every acked record"
    );
}

#[test]
fn the_consumer_and_its_stream_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<CatchupConsumer>();
    send_sync::<catchup::Delivery>();
    let _ = |consumer: &CatchupConsumer| send(&consumer.stream());
}
