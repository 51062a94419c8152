//! More partitions than the group member has fetch queues (`kafka::live::queues`: several
//! partitions share a queue, and a round splits what it takes into runs of one partition).
//! A member reads a backlog of 24 partitions; a second member joins, takes some of them,
//! reads fresh records and leaves again, so partitions move between members and come back to
//! other queues; more fresh records follow. Every produced record is delivered with its own payload (a record
//! handed to another partition's run would carry the wrong one), in order within each
//! assignment, and the group ends committed at every partition's end.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use catchup::{CatchupConsumer, Event, Mode};
use support::deliveries::Deliveries;
use support::{Kafka, catchup_consumer};
use tokio::sync::Notify;

const PARTITIONS: i32 = 24;
const BACKLOG: usize = 24_000;
const FRESH: usize = 2_400;
/// How long a member may go without a delivery it waits for.
const WAIT: Duration = Duration::from_secs(30);

/// Reads from `consumer` into `seen`, acknowledging each, until `done` says so.
async fn read_until(
    consumer: &CatchupConsumer,
    seen: &mut Deliveries,
    who: &str,
    done: impl Fn(&Deliveries) -> bool,
) {
    while !done(seen) {
        match tokio::time::timeout(WAIT, consumer.recv()).await {
            Ok(Ok(delivery)) => {
                seen.record(&delivery);
                consumer.ack(&delivery);
            }
            Ok(Err(err)) => panic!("{who}: recv failed: {err}"),
            Err(_) => panic!(
                "{who}: no delivery within {WAIT:?} after {} (covered {:?})",
                seen.count, seen.covered
            ),
        }
    }
}

/// Reads from `consumer` into `seen`, acknowledging each, until `stop` is notified (it may
/// wait for records meanwhile: what it reads is not the point, that it reads is).
async fn read_until_notified(consumer: &CatchupConsumer, seen: &mut Deliveries, stop: &Notify) {
    loop {
        tokio::select! {
            () = stop.notified() => return,
            delivery = consumer.recv() => {
                let delivery = delivery.unwrap_or_else(|err| panic!("recv failed: {err}"));
                seen.record(&delivery);
                consumer.ack(&delivery);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_sharing_fetch_queues_move_between_members() {
    let kafka = Kafka::connect();
    let backlog = kafka.backlog("many-partitions", PARTITIONS, BACKLOG).await;
    let (first_dir, second_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    // `Off`: everything, the backlog included, comes through the group member's queues.
    let first = catchup_consumer(
        &kafka,
        &backlog.group,
        support::test_config(first_dir.path(), Mode::Off, 100),
    );
    first.subscribe(&[&backlog.topic]).expect("subscribe");
    let mut first_seen = Deliveries::new(Mode::Off);
    read_until(&first, &mut first_seen, "first member", |seen| {
        seen.count >= 4_000
    })
    .await;

    // A second member takes some partitions while the first reads on; fresh records go to
    // both once it has them.
    let second = catchup_consumer(
        &kafka,
        &backlog.group,
        support::test_config(second_dir.path(), Mode::Off, 100),
    );
    let mut second_events = second.events();
    second.subscribe(&[&backlog.topic]).expect("subscribe");
    let mut second_seen = Deliveries::new(Mode::Off);
    let second_done = Notify::new();
    let mut fresh = Vec::new();
    tokio::join!(
        async {
            support::wait_for_named_event(&mut second_events, WAIT, "an assignment", |e| {
                matches!(e, Event::Assigned { .. })
            })
            .await;
            fresh = kafka
                .produce_from(&backlog.topic, PARTITIONS, BACKLOG, FRESH)
                .await;
            read_until(&second, &mut second_seen, "second member", |seen| {
                seen.count >= FRESH as u64 / 4
            })
            .await;
            // A permit is kept if the first member is not waiting on it right now.
            second_done.notify_one();
        },
        read_until_notified(&first, &mut first_seen, &second_done),
    );
    // It leaves: its partitions come back to the first member, into queues that may not be
    // the ones they had; more fresh records go to every partition.
    tokio::time::timeout(WAIT, second.close())
        .await
        .expect("close in time")
        .expect("close");
    fresh.extend(
        kafka
            .produce_from(&backlog.topic, PARTITIONS, BACKLOG + FRESH, FRESH)
            .await,
    );

    // The first member gets every partition back, and reads on until every produced record
    // was delivered by one member or the other.
    let produced: Vec<_> = backlog.produced.iter().chain(&fresh).cloned().collect();
    let mut missing: BTreeSet<(i32, i64)> = produced
        .iter()
        .map(|record| (record.partition, record.offset))
        .filter(|at| !first_seen.records.contains_key(at) && !second_seen.records.contains_key(at))
        .collect();
    while let Some(&next) = missing.first() {
        match tokio::time::timeout(WAIT, first.recv()).await {
            Ok(Ok(delivery)) => {
                first_seen.record(&delivery);
                first.ack(&delivery);
                missing.remove(&(delivery.partition, delivery.offset));
            }
            Ok(Err(err)) => panic!("first member: recv failed: {err}"),
            Err(_) => panic!(
                "first member: no delivery within {WAIT:?}; {} records never delivered, the first {next:?}",
                missing.len()
            ),
        }
    }
    let ends = support::partition_ends(&produced, PARTITIONS);
    for (who, seen) in [("first", &first_seen), ("second", &second_seen)] {
        let wrong: Vec<_> = seen
            .wrong_payload(&produced)
            .iter()
            .map(|record| (record.partition, record.offset))
            .collect();
        assert!(
            wrong.is_empty(),
            "{who} member: wrong payloads at {wrong:?}"
        );
        assert!(
            seen.disorder.is_empty(),
            "{who} member: out of order: {:?}",
            seen.disorder
        );
    }
    assert!(
        second_seen.covered.len() < PARTITIONS as usize,
        "the second member read every partition: none stayed with the first"
    );

    // Everything acknowledged is committed at each partition's end.
    support::await_committed_at(&kafka, &first, &backlog.group, &backlog.topic, &ends, WAIT).await;
    first.close().await.expect("close");
}
