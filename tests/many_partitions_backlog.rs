//! More partitions behind than the catch-up consumer has fetch queues (`kafka::fetch_queues`:
//! several partitions share a queue, a round splits what it takes into runs of one partition,
//! and a partition held to its read-ahead is paused instead of left in its queue, which
//! librdkafka answers by dropping what it prefetched of it and fetching it again on resume).
//! A member reads a backlog of 24 partitions through both lanes, under a budget whose
//! read-ahead (half a lane's share, about 11 KiB) is far below what one fetch of a partition
//! brings, so holds come and go all along; fresh records arrive once it is assigned. Every produced
//! record is delivered once with its own payload, in order, and the group ends committed at
//! every partition's end.

mod support;

use std::time::Duration;

use catchup::{Event, Mode};
use support::deliveries::Deliveries;
use support::{Kafka, catchup_consumer};

const PARTITIONS: i32 = 24;
const BACKLOG: usize = 48_000;
const FRESH: usize = 2_400;
/// Shared by every lane: about 21 KiB a lane, half of it each lane's read-ahead (one fetch
/// of a partition is more than the share: `fetch::read_ahead_share`).
const BUDGET: u64 = 1 << 20;
/// How long the member may go without a delivery it waits for.
const WAIT: Duration = Duration::from_secs(30);

async fn drains_through_shared_catchup_queues(mode: Mode) {
    let kafka = Kafka::connect();
    let backlog = kafka
        .backlog("many-partitions-backlog", PARTITIONS, BACKLOG)
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = catchup_consumer(
        &kafka,
        &backlog.group,
        support::test_config(dir.path(), mode, 100).buffer_budget_bytes(BUDGET),
    );
    let mut events = consumer.events();
    consumer.subscribe(&[&backlog.topic]).expect("subscribe");
    support::wait_for_named_event(&mut events, WAIT, "an assignment", |event| {
        matches!(event, Event::Assigned { .. })
    })
    .await;
    // After the boundary: the live lane's.
    let fresh = kafka
        .produce_from(&backlog.topic, PARTITIONS, BACKLOG, FRESH)
        .await;
    let produced: Vec<_> = backlog.produced.iter().chain(&fresh).cloned().collect();
    let ends = support::partition_ends(&produced, PARTITIONS);

    let mut seen = Deliveries::new(mode);
    while !seen.covers(&ends) {
        match tokio::time::timeout(WAIT, consumer.recv()).await {
            Ok(Ok(delivery)) => {
                seen.record(&delivery);
                consumer.ack(&delivery);
            }
            Ok(Err(err)) => panic!("recv failed: {err}"),
            Err(_) => panic!(
                "no delivery within {WAIT:?}; {} records never delivered (covered {:?})",
                seen.never_delivered(&produced).len(),
                seen.covered
            ),
        }
    }
    let wrong: Vec<_> = seen
        .wrong_payload(&produced)
        .iter()
        .map(|record| (record.partition, record.offset))
        .collect();
    assert!(wrong.is_empty(), "wrong payloads at {wrong:?}");
    assert!(
        seen.disorder.is_empty(),
        "out of order: {:?}",
        seen.disorder
    );
    let twice: Vec<_> = seen
        .records
        .iter()
        .filter(|(_, (times, _))| *times > 1)
        .map(|(at, _)| *at)
        .collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");

    // Everything acknowledged is committed at each partition's end.
    support::await_committed_at(
        &kafka,
        &consumer,
        &backlog.group,
        &backlog.topic,
        &ends,
        WAIT,
    )
    .await;
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_drains_many_partitions_through_shared_catchup_queues() {
    drains_through_shared_catchup_queues(Mode::Ordered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_drains_many_partitions_through_shared_catchup_queues() {
    drains_through_shared_catchup_queues(Mode::Concurrent).await;
}
