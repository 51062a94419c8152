//! What the catch-up consumer relies on when it takes a partition's queue in runs
//! (librdkafka's `rd_kafka_consume_batch_queue`), checked against the real broker: the end of
//! partition it hands out names the offset the fetch stood at, the log end. The bundled
//! librdkafka then reports the position one past that offset (librdkafka issue 4844), over
//! an offset it never fetched; the catch-up lane trusts a position only up to the offset the
//! last end of partition named (`FetchCursor::end_of_partition`). The test prints which
//! position this librdkafka reports.

mod support;

use std::ffi::CString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use support::{Kafka, unique};

const RECORDS: usize = 25;
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_of_partition_taken_in_a_run_names_the_log_end() {
    let kafka = Kafka::connect();
    let topic = unique("batch-eof");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, RECORDS).await;
    let log_end = kafka.watermarks(&topic, 1)[0].1;
    assert_eq!(log_end, RECORDS as i64);

    let consumer: Arc<BaseConsumer> = Arc::new(
        kafka
            .consumer_config(&unique("batch-eof-group"))
            .set("enable.partition.eof", "true")
            .create()
            .expect("consumer"),
    );
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&topic, 0, Offset::Beginning)
        .expect("assignment");
    consumer.assign(&assignment).expect("assign");
    // Split off, as the catch-up consumer does, so the partition's queue is its own.
    let _split = consumer
        .split_partition_queue(&topic, 0)
        .expect("partition queue");
    let name = CString::new(topic.clone()).expect("topic name");
    // SAFETY: the consumer is alive for the whole test; the queue reference is released
    // below, before the consumer is dropped.
    let queue = unsafe {
        rd::rd_kafka_queue_get_partition(consumer.client().native_ptr(), name.as_ptr(), 0)
    };
    assert!(!queue.is_null(), "the partition's queue");

    let (mut offsets, mut end_named) = (Vec::new(), None);
    let deadline = Instant::now() + WAIT;
    while end_named.is_none() && Instant::now() < deadline {
        let mut run: [*mut rd::rd_kafka_message_t; 64] = [std::ptr::null_mut(); 64];
        // SAFETY: a live queue; librdkafka writes at most `run.len()` pointers.
        let count =
            unsafe { rd::rd_kafka_consume_batch_queue(queue, 100, run.as_mut_ptr(), run.len()) };
        let count = usize::try_from(count).expect("no error from the batch call");
        for &message in &run[..count] {
            // SAFETY: a message librdkafka handed over, freed right after it is read.
            let (err, offset) = unsafe { ((*message).err, (*message).offset) };
            unsafe { rd::rd_kafka_message_destroy(message) };
            match err {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => offsets.push(offset),
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF => end_named = Some(offset),
                other => panic!("unexpected error at {offset}: {other:?}"),
            }
        }
    }
    // SAFETY: the reference taken above, released once.
    unsafe { rd::rd_kafka_queue_destroy(queue) };

    let expected: Vec<i64> = (0..RECORDS as i64).collect();
    assert_eq!(offsets, expected, "every record, in order, before the end");
    assert_eq!(
        end_named,
        Some(log_end),
        "the end of partition names the log end"
    );
    let position = consumer.position().expect("position");
    let position = position
        .find_partition(&topic, 0)
        .and_then(|element| element.offset().to_raw())
        .expect("a position");
    eprintln!("log end {log_end}; position after the end of partition: {position}");
    assert!(
        position == log_end || position == log_end + 1,
        "the position ({position}) is the log end or one past it"
    );
}
