//! `auto_ack` acknowledges a record when `recv` hands it out, not when the reader queues it.
//! (Regression: the read-ahead of up to 256 records counted as processed, so a consumer that
//! took 10 records and closed committed far past them, and a restart skipped the rest.)
//! A consumer that received exactly 10 records commits exactly 10; the next member of the
//! group starts there and receives everything after.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use catchup::{CatchupConfig, CatchupConsumer, Mode};
use support::{Kafka, catchup_consumer, unique};

const RECORDS: i64 = 2_000;
const TAKEN: i64 = 10;
const WAIT: Duration = Duration::from_secs(60);

fn config(dir: &tempfile::TempDir) -> CatchupConfig {
    CatchupConfig {
        auto_ack: true,
        ..support::test_config(dir.path(), Mode::Off, 100)
    }
}

async fn next_offset(consumer: &CatchupConsumer) -> i64 {
    let delivery = tokio::time::timeout(WAIT, consumer.recv())
        .await
        .unwrap_or_else(|_| panic!("no delivery within {WAIT:?}"))
        .expect("recv");
    assert_eq!(delivery.partition, 0, "the topic has one partition");
    delivery.offset
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_commits_only_what_recv_handed_out() {
    let kafka = Kafka::connect();
    let topic = unique("auto-ack");
    kafka.create_topic(&topic, 1).await;
    let produced = kafka.produce(&topic, 1, RECORDS as usize).await;
    assert_eq!(
        produced.last().map(|r| r.offset),
        Some(RECORDS - 1),
        "produced offsets 0..{RECORDS}"
    );
    let group = unique("auto-ack-group");
    kafka.commit_as_operator(&group, &topic, &[0]);

    // First life: take exactly 10 records (auto-acked, never acked by hand), then close.
    let dir_a = tempfile::tempdir().expect("tempdir");
    let first = catchup_consumer(&kafka, &group, config(&dir_a));
    first.subscribe(&[&topic]).expect("subscribe");
    let mut taken = Vec::new();
    for _ in 0..TAKEN {
        taken.push(next_offset(&first).await);
    }
    assert_eq!(taken, (0..TAKEN).collect::<Vec<_>>(), "plain, in order");
    // `unacked` counts the reader's queue too (read from the buffer, not handed out).
    eprintln!("unacked after {TAKEN} hand-outs: {}", first.unacked());
    first.close().await.expect("close");
    let committed = kafka.committed(&group, &topic, 1)[0];
    assert!(
        committed.is_some_and(|c| c <= TAKEN),
        "committed {committed:?}: more than the {TAKEN} records handed out (the read-ahead \
         counted as processed)"
    );
    assert_eq!(
        committed,
        Some(TAKEN),
        "every record handed out counts as processed"
    );

    // Second life, fresh buffer: resumes at the commit and misses nothing after it.
    let dir_b = tempfile::tempdir().expect("tempdir");
    let second = catchup_consumer(&kafka, &group, config(&dir_b));
    second.subscribe(&[&topic]).expect("subscribe");
    let start = next_offset(&second).await;
    assert!(
        start <= TAKEN,
        "the second life starts at {start}, past the {TAKEN} records processed"
    );
    let mut seen = BTreeSet::from([start]);
    let mut last = start;
    while last < RECORDS - 1 {
        let offset = next_offset(&second).await;
        assert!(offset > last, "{offset} after {last}: not in order");
        seen.insert(offset);
        last = offset;
    }
    let missing: Vec<i64> = (TAKEN..RECORDS).filter(|o| !seen.contains(o)).collect();
    assert!(
        missing.is_empty(),
        "{} offsets never delivered, first {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    second.close().await.expect("close");
    assert_eq!(
        kafka.committed(&group, &topic, 1),
        vec![Some(RECORDS)],
        "everything handed out is committed at close"
    );
}
