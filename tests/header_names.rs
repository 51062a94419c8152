//! A header whose name is not UTF-8 — Kafka's format allows any bytes, and rust-rdkafka's
//! header reader panics on one — reaches the application with its name read lossily, through
//! both lanes: the group member's (`off`) and the catch-up consumer's (`ordered`, behind a
//! backlog).

mod support;

use std::ffi::{CString, c_void};
use std::time::Duration;

use catchup::rdkafka::ClientConfig;
use catchup::rdkafka::bindings as rd;
use catchup::rdkafka::producer::{BaseProducer, Producer};
use catchup::{CatchupConsumer, DeliveryLane, Mode};
use support::{Kafka, test_config, unique};

const RECORDS: usize = 40;
const WAIT: Duration = Duration::from_secs(60);
/// The header's name: `h`, then two bytes that are not UTF-8 (NUL-terminated for librdkafka).
const NAME: [u8; 4] = [b'h', 0xff, 0xfe, 0];

/// Produces `RECORDS` records to partition 0, each with one header named [`NAME`] and valued
/// `v` (through librdkafka itself: rust-rdkafka's producer takes header names as `&str`).
fn produce_with_raw_header_names(kafka: &Kafka, topic: &str) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .create()
        .expect("producer");
    let topic = CString::new(topic).expect("topic name");
    let vu = |vtype, u| rd::rd_kafka_vu_t { vtype, u };
    for index in 0..RECORDS {
        let value = format!("value-{index}");
        let fields = [
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    cstr: topic.as_ptr(),
                },
            ),
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION,
                rd::rd_kafka_vu_s__bindgen_ty_1 { i32_: 0 },
            ),
            // librdkafka copies the value (the header it always copies).
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    i: rd::RD_KAFKA_MSG_F_COPY,
                },
            ),
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: value.as_ptr() as *mut c_void,
                        size: value.len(),
                    },
                },
            ),
            vu(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADER,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    header: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_2 {
                        name: NAME.as_ptr().cast(),
                        val: b"v".as_ptr().cast(),
                        size: 1,
                    },
                },
            ),
        ];
        // SAFETY: a live producer; every field points to memory alive during the call, and
        // librdkafka copies what it keeps (the value by the flag, the header always).
        let error = unsafe {
            rd::rd_kafka_produceva(
                producer.client().native_ptr(),
                fields.as_ptr(),
                fields.len(),
            )
        };
        assert!(error.is_null(), "librdkafka refused the record");
    }
    producer.flush(WAIT).expect("flush");
}

async fn read_through(mode: Mode, lane: DeliveryLane) {
    let kafka = Kafka::connect();
    let topic = unique("header-names");
    kafka.create_topic(&topic, 1).await;
    produce_with_raw_header_names(&kafka, &topic);
    let group = unique("header-names-group");
    kafka.commit_as_operator(&group, &topic, &[0]);
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = CatchupConsumer::new(
        &kafka.consumer_config(&group),
        test_config(dir.path(), mode, 10),
    )
    .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    for offset in 0..RECORDS as i64 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        assert_eq!((delivery.offset, delivery.lane), (offset, lane));
        let headers: Vec<(&str, Option<&[u8]>)> = delivery
            .headers
            .0
            .iter()
            .map(|header| (header.key.as_str(), header.value.as_deref()))
            .collect();
        assert_eq!(
            headers,
            vec![("h\u{FFFD}\u{FFFD}", Some(&b"v"[..]))],
            "offset {offset}"
        );
        assert_eq!(
            delivery.payload.as_deref(),
            Some(format!("value-{offset}").as_bytes())
        );
        consumer.ack(&delivery);
    }
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_members_lane_reads_a_header_name_that_is_not_utf8() {
    read_through(Mode::Off, DeliveryLane::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catchup_lane_reads_a_header_name_that_is_not_utf8() {
    read_through(Mode::Ordered, DeliveryLane::Catchup).await;
}
