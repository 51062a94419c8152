//! `auto_ack` acknowledges a record when `recv` hands it out, not when the reader queues it.
//! (Regression: the read-ahead of up to 256 records counted as processed, so a consumer that
//! took 10 records and closed committed far past them, and a restart skipped the rest.)
//! A consumer that received exactly 10 records commits exactly 10 at `close()`, and at a
//! revoke; the next owner starts there and receives everything after.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use catchup::{CatchupConfig, CatchupConsumer, Mode};
use support::{Backlog, Kafka, catchup_consumer, unique};

const RECORDS: i64 = 2_000;
const TAKEN: i64 = 10;
const WAIT: Duration = Duration::from_secs(60);

fn config(dir: &tempfile::TempDir) -> CatchupConfig {
    support::test_config(dir.path(), Mode::Off, 100).auto_ack(true)
}

async fn next_offset(consumer: &CatchupConsumer) -> i64 {
    let delivery = support::next_delivery(consumer, WAIT).await;
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

/// A revoke while the reader holds read-ahead of both partitions: nothing queued may count
/// as processed, so whichever partition moves, the member that takes it over starts at or
/// before the first record the old owner never handed out, and the two together miss nothing.
/// (Which partition moves is the assignor's choice; both hold queued records, so either way
/// the check bites.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_commits_only_what_recv_handed_out() {
    const PER_PARTITION: i64 = 100;
    const TOTAL: usize = 2 * PER_PARTITION as usize;
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("auto-ack-revoke", 2, TOTAL).await;

    let dir_a = tempfile::tempdir().expect("tempdir");
    let first = catchup_consumer(&kafka, &group, config(&dir_a));
    let mut first_events = first.events();
    first.subscribe(&[&topic]).expect("subscribe");
    // Both partitions buffered before the first hand-out, so the reader's first read-ahead
    // (up to 256 records) queues all of them.
    support::wait_until_buffered(&first, 2, PER_PARTITION).await;
    // Handed out per partition: the next offset not handed out.
    let mut handed = [0i64; 2];
    let mut seen = BTreeSet::new();
    for _ in 0..TAKEN {
        let delivery = support::next_delivery(&first, WAIT).await;
        let partition = delivery.partition as usize;
        assert_eq!(delivery.offset, handed[partition], "in order per partition");
        handed[partition] += 1;
        seen.insert((delivery.partition, delivery.offset));
    }
    assert_eq!(
        first.unacked(),
        TOTAL - TAKEN as usize,
        "the reader queues every record not handed out, of both partitions"
    );

    // A second member joins: the first loses a partition while its reader queues records of it.
    let dir_b = tempfile::tempdir().expect("tempdir");
    let second = catchup_consumer(&kafka, &group, config(&dir_b));
    second.subscribe(&[&topic]).expect("subscribe");
    let revoked = support::wait_for_event(
        &mut first_events,
        WAIT,
        |e| matches!(e, catchup::Event::Revoked { partitions, .. } if !partitions.is_empty()),
    )
    .await;
    let catchup::Event::Revoked { partitions, .. } = revoked else {
        unreachable!("matched above")
    };
    assert_eq!(
        partitions.len(),
        1,
        "one of two partitions moves: {partitions:?}"
    );
    let moved = partitions[0].1 as usize;
    // It has records to hand out unless the old owner's queue was committed as processed.
    let taken_over = tokio::time::timeout(WAIT, second.recv())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the new owner of partition {moved} received nothing in {WAIT:?}: the group \
                 committed {:?} with {handed:?} handed out",
                kafka.committed(&group, &topic, 2)
            )
        })
        .expect("recv");
    assert_eq!(
        taken_over.partition as usize, moved,
        "the second owns what moved"
    );
    assert!(
        taken_over.offset <= handed[moved],
        "the new owner of partition {moved} starts at {}, past the {} records the old owner \
         handed out (its queued records counted as processed)",
        taken_over.offset,
        handed[moved]
    );
    seen.insert((taken_over.partition, taken_over.offset));

    // Both go on; together they deliver every offset (`recv` is cancel-safe).
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < TOTAL {
        let delivery = tokio::select! {
            delivery = first.recv() => delivery,
            delivery = second.recv() => delivery,
            _ = tokio::time::sleep_until(deadline) => {
                panic!("{} of {TOTAL} offsets delivered", seen.len())
            }
        };
        let delivery = delivery.expect("recv");
        seen.insert((delivery.partition, delivery.offset));
    }
    first.close().await.expect("close");
    second.close().await.expect("close");
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        vec![Some(PER_PARTITION); 2],
        "everything handed out is committed at close"
    );
}
