//! The live lane is fetched while a commit waits for its answer. A commit cycle ran on the
//! group member's thread, which polled nothing until the broker answered: about a
//! millisecond of every 20–30 ms at full speed, and up to the request timeout (30 s) behind a
//! coordinator slow to answer. A cycle's round trips now run on a commit thread. The real
//! broker cannot hold an answer back on demand, so this runs on librdkafka's mock cluster,
//! whose broker is told to answer the next OffsetCommit only after `ANSWER_AFTER`.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use catchup::{CatchupConsumer, Mode};
use rdkafka::ClientConfig;
use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer as _};
use rdkafka::types::RDKafkaApiKey;

mod support;

/// The held answer's delay: below the group member's request timeout (30 s), so that the
/// commit it answers lands, and below its session timeout (the mock's coordinator answers
/// heartbeats on the same connection only after it).
const ANSWER_AFTER: Duration = Duration::from_secs(10);
/// The session timeout: the tests' 6 s would end the membership while the answer is held.
const SESSION_TIMEOUT_MS: &str = "45000";
/// Fresh records produced while the answer is held reach the reader within it.
const FRESH_WITHIN: Duration = Duration::from_secs(5);
const FRESH: i64 = 50;
const WAIT: Duration = Duration::from_secs(60);
const TOPIC: &str = "orders";
const GROUP: &str = "slow-commit-group";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_records_reach_the_reader_while_a_commit_waits_for_its_answer() {
    let held = consumer_with_a_held_commit(GROUP).await;
    let (kafka, consumer, held_since) = (&held.kafka, &held.consumer, held.held_since);

    // Produced now, fetched only by a group member that polls while its commit waits.
    kafka
        .produce_values(TOPIC, 1, FRESH, |_, _| "fresh".into())
        .await;
    for offset in 2..2 + FRESH {
        let delivery = tokio::time::timeout(FRESH_WITHIN, consumer.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "record {offset} not delivered within {FRESH_WITHIN:?} while a commit waited for its answer ({:?} so far)",
                    held_since.elapsed()
                )
            })
            .expect("recv");
        assert_eq!(delivery.offset, offset, "in order, none lost");
        consumer.ack(&delivery);
    }
    assert!(
        held_since.elapsed() < ANSWER_AFTER,
        "the fresh records came only after the commit's answer"
    );

    // The held commit lands, and the next ones after it: everything is committed.
    let all = 2 + FRESH;
    wait_until(
        || kafka.committed(GROUP, TOPIC, 1) == vec![Some(all)],
        "everything committed",
    )
    .await;
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_the_commit_under_way_and_commits_what_came_after() {
    let group = "slow-commit-close-group";
    let held = consumer_with_a_held_commit(group).await;
    let (kafka, consumer, held_since) = (&held.kafka, &held.consumer, held.held_since);
    // Closing with a cycle under way: the close answers (its own commit's result) once that
    // cycle was answered, and what was acknowledged after it is committed too. One more
    // record, acknowledged while the commit of the one before waits for its answer.
    kafka
        .produce_values(TOPIC, 1, 1, |_, _| "third".into())
        .await;
    take(consumer, 2).await;
    consumer.close().await.expect("close");
    assert!(
        held_since.elapsed() >= ANSWER_AFTER,
        "close returned before the commit under way was answered"
    );
    assert_eq!(
        kafka.committed(group, TOPIC, 1),
        vec![Some(3)],
        "the close committed what came after the commit under way"
    );
}

/// A consumer of `group` on a mock cluster whose next OffsetCommit's answer is held back
/// `ANSWER_AFTER`: it took and acknowledged offsets 0 (committed) and 1, whose commit was sent
/// and waits; `held_since` is from before it was sent.
struct Held {
    /// Holds the mock cluster.
    _host: BaseProducer,
    kafka: support::Kafka,
    consumer: CatchupConsumer,
    _dir: tempfile::TempDir,
    held_since: Instant,
}

async fn consumer_with_a_held_commit(group: &str) -> Held {
    let topic = TOPIC;
    // A mock cluster reached through a client of its own: its handle is needed to hold an
    // answer back, which rust-rdkafka does not offer.
    let host: BaseProducer = ClientConfig::new()
        .set("test.mock.num.brokers", "1")
        .create()
        .expect("mock cluster's client");
    let cluster = host.client().mock_cluster().expect("mock cluster");
    support::stock_mock_cluster(&cluster, topic, group);
    // SAFETY: the client created the mock cluster and outlives every use of its handle.
    let raw = unsafe { rd::rd_kafka_handle_mock_cluster(host.client().native_ptr()) };
    assert!(!raw.is_null(), "the mock cluster's handle");
    let kafka = support::Kafka::connect_to(&cluster.bootstrap_servers());
    kafka
        .produce_values(topic, 1, 1, |_, _| "first".into())
        .await;

    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Off, 100);
    let mut settings = kafka.consumer_config(group);
    settings.set("session.timeout.ms", SESSION_TIMEOUT_MS);
    let consumer = CatchupConsumer::new(&settings, config).expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    take(&consumer, 0).await;
    wait_until(
        || kafka.committed(group, topic, 1) == vec![Some(1)],
        "offset 1 committed",
    )
    .await;

    // The next OffsetCommit is answered only after ANSWER_AFTER; a record acknowledged makes
    // one due (every 200 ms).
    // SAFETY: a live mock cluster's handle; the variadic arguments are one (error, RTT in
    // ms) pair, as `cnt` says.
    unsafe {
        rd::rd_kafka_mock_start_request_tracking(raw);
        let err = rd::rd_kafka_mock_broker_push_request_error_rtts(
            raw,
            1,
            RDKafkaApiKey::OffsetCommit as i16,
            1,
            rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
            ANSWER_AFTER.as_millis() as c_int,
        );
        assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    kafka
        .produce_values(topic, 1, 1, |_, _| "second".into())
        .await;
    // Before the commit can be sent: its answer comes ANSWER_AFTER after this at the earliest.
    let held_since = Instant::now();
    take(&consumer, 1).await;
    wait_until(|| offset_commits(raw) > 0, "the held OffsetCommit sent").await;
    // Borrowed from the client, which keeps the cluster.
    drop(cluster);
    Held {
        _host: host,
        kafka,
        consumer,
        _dir: dir,
        held_since,
    }
}

/// Takes the next record, checks it is `offset`, and acknowledges it.
async fn take(consumer: &CatchupConsumer, offset: i64) {
    let delivery = support::next_delivery(consumer, WAIT).await;
    assert_eq!(delivery.offset, offset);
    consumer.ack(&delivery);
}

/// OffsetCommit requests the mock cluster received since tracking started.
fn offset_commits(raw: *mut rd::rd_kafka_mock_cluster_t) -> usize {
    let mut count = 0;
    // SAFETY: a live mock cluster's handle; the array and its requests are the caller's,
    // freed once read.
    unsafe {
        let requests = rd::rd_kafka_mock_get_requests(raw, &mut count);
        let commits = (0..count)
            .filter(|&at| {
                rd::rd_kafka_mock_request_api_key(*requests.add(at))
                    == RDKafkaApiKey::OffsetCommit as i16
            })
            .count();
        rd::rd_kafka_mock_request_destroy_array(requests, count);
        commits
    }
}

/// Waits (bounded by `WAIT`) until `done`.
async fn wait_until(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
