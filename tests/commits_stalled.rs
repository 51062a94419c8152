//! A reader does not run away from commits that do not land. The buffer keeps every record
//! the application acknowledged until its commit is in Kafka; while commits fail, a fast
//! reader went on taking records, and the buffer held up to half its budget of them in
//! memory (peak RSS above 256 MiB with the default budget when the broker stopped answering
//! for 300 ms). Now the reader hands out nothing more once an eighth of the budget waits for
//! a commit, and goes on when one lands, with nothing lost. The real broker cannot refuse
//! commits on demand, so this runs on librdkafka's mock cluster, whose coordinator answers
//! every OffsetCommit with an error until told to stop.

use std::time::Duration;

use catchup::{CatchupConsumer, Mode};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

mod support;

/// About 3 MB: the mock cluster keeps 5 MB of a partition's log.
const RECORDS: i64 = 3_000;
/// Each record's value: about a kibibyte.
const VALUE_BYTES: usize = 1_024;
/// Small, so that the lane's read-ahead (half its share here: one fetch is more than that) is
/// small beside what may wait for commits: the floor, 1 MiB (about 1,000 records).
const BUDGET: u64 = 512 << 10;
/// Far more than the records the floor holds, with the lane's read-ahead.
const AT_MOST_WHILE_FAILING: i64 = 2_000;
/// Fewer than may wait for commits (1 MiB of records of 1 KiB and their keys): the reader
/// must not hold back before it.
const AT_LEAST_WHILE_FAILING: i64 = 950;
/// No record within it, while records are there to take: the reader waits.
const QUIET: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(60);
/// The commit interval: a reader held back must not wait for it once commits land.
const INTERVAL: Duration = Duration::from_secs(30);
/// Once commits land, the reader goes on within it (commits are tried every 100 ms while it
/// holds back).
const RESUMES_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reader_waits_for_commits_that_do_not_land_and_goes_on_when_they_do() {
    let (topic, group) = ("orders", "stalled-commits-group");
    let (cluster, kafka) = support::mock_cluster(topic, group);
    kafka
        .produce_values(topic, 1, RECORDS, |_, offset| value(offset))
        .await;

    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Off, 100)
        .buffer_budget_bytes(BUDGET)
        .commit_interval(INTERVAL);
    let consumer = CatchupConsumer::new(&kafka.consumer_config(group), config).expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut next = 0;
    // The assignment done (its writes to Kafka are not what is tested), every commit fails.
    assert!(
        take(&consumer, &mut next, WAIT).await,
        "a first record in time"
    );
    let failing = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_COMMIT_OFFSET_SIZE; 10_000];
    cluster.request_errors(RDKafkaApiKey::OffsetCommit, &failing);

    while take(&consumer, &mut next, QUIET).await {
        assert!(
            next < AT_MOST_WHILE_FAILING,
            "{next} records handed out and acknowledged while no commit landed"
        );
    }
    assert!(
        next >= AT_LEAST_WHILE_FAILING,
        "the reader held back after {next} records, before 1 MiB waited"
    );
    let committed = kafka.committed(group, topic, 1)[0].unwrap_or(0);
    eprintln!("{next} records handed out, {committed} committed, when the reader held back");
    assert!(
        committed < next,
        "the reader waited although its records were committed ({committed} of {next})"
    );

    // Commits land again: the reader goes on, and everything is handed out and committed.
    cluster.clear_request_errors(RDKafkaApiKey::OffsetCommit);
    assert!(
        take(&consumer, &mut next, RESUMES_WITHIN).await,
        "the reader went on within {RESUMES_WITHIN:?} of commits landing (interval {INTERVAL:?})"
    );
    while next < RECORDS {
        assert!(
            take(&consumer, &mut next, WAIT).await,
            "record {next} in time once commits land"
        );
    }
    consumer.commit().await.expect("commit");
    assert_eq!(kafka.committed(group, topic, 1), vec![Some(RECORDS)]);
    consumer.close().await.expect("close");
}

/// Takes the next record within `within` (false if none came), checks it is `next` with its
/// value, and acknowledges it.
async fn take(consumer: &CatchupConsumer, next: &mut i64, within: Duration) -> bool {
    let Ok(delivery) = tokio::time::timeout(within, consumer.recv()).await else {
        return false;
    };
    let delivery = delivery.expect("recv");
    assert_eq!(delivery.offset, *next, "in order, none lost");
    assert_eq!(
        delivery.payload.as_deref(),
        Some(value(*next).as_bytes()),
        "the record's value"
    );
    consumer.ack(&delivery);
    *next += 1;
    true
}

/// The value produced at `offset`.
fn value(offset: i64) -> String {
    format!("{offset:0>VALUE_BYTES$}")
}
