//! A revoked partition's records stay in the buffer while a reassignment could still reuse
//! them: when the partition comes back, delivery resumes from disk at the group's position
//! instead of refetching everything buffered (eager rebalances and rolling restarts used to
//! refetch it all). Once another owner's commit shows the records can never be reused,
//! the member drops them — disk comes back (store audit D1).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use catchup::{CatchupConsumer, Event, Mode};
use support::{Kafka, test_config, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);
const PER_PARTITION: i64 = 1_000;

/// A first member buffering both partitions of a new topic (processing nothing), and a
/// second member joining: returns both, the first's events, and the partition that moved.
async fn second_member_takes_one(
    kafka: &Kafka,
    topic: &str,
    group: &str,
    dirs: &[tempfile::TempDir; 2],
) -> (
    CatchupConsumer,
    CatchupConsumer,
    tokio::sync::broadcast::Receiver<Event>,
    i32,
) {
    kafka.create_topic(topic, 2).await;
    kafka.produce(topic, 2, 2 * PER_PARTITION as usize).await;
    kafka.commit_as_operator(group, topic, &[0, 0]);
    let first = CatchupConsumer::new(
        &kafka.consumer_config(group),
        test_config(dirs[0].path(), Mode::Off, 100),
    )
    .expect("consumer");
    let mut events = first.events();
    first.subscribe(&[topic]).expect("subscribe");
    support::wait_until_buffered(&first, 2, PER_PARTITION).await;
    let second = CatchupConsumer::new(
        &kafka.consumer_config(group),
        test_config(dirs[1].path(), Mode::Off, 100),
    )
    .expect("consumer");
    second.subscribe(&[topic]).expect("subscribe");
    let revoked = wait_for_event(
        &mut events,
        WAIT,
        |e| matches!(e, Event::Revoked { partitions, .. } if !partitions.is_empty()),
    )
    .await;
    let Event::Revoked { partitions, .. } = revoked else {
        unreachable!("matched above")
    };
    assert_eq!(
        partitions.len(),
        1,
        "one of two partitions moves: {partitions:?}"
    );
    (first, second, events, partitions[0].1)
}

/// Receives and acknowledges `count` records of `partition` on `consumer`, in order from
/// `from`, and commits them.
async fn process(consumer: &CatchupConsumer, partition: i32, from: i64, count: i64) {
    for expected in from..from + count {
        let delivery = support::next_delivery(consumer, WAIT).await;
        assert_eq!(
            (delivery.partition, delivery.offset),
            (partition, expected),
            "the new owner reads the moved partition in order"
        );
        consumer.ack(&delivery);
    }
    consumer.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_comes_back_is_served_from_the_kept_records() {
    let kafka = Kafka::connect();
    let topic = unique("kept-reused");
    let group = unique("kept-reused-group");
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let (first, second, mut events, moved) =
        second_member_takes_one(&kafka, &topic, &group, &dirs).await;

    // The second member processes 300 records of the moved partition and leaves.
    process(&second, moved, 0, 300).await;
    second.close().await.expect("close");

    // The partition comes back with its 1,000 records still on disk: delivery resumes at the
    // group's 300 from the buffer.
    let reused = wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::LocalReused { partition, .. } if *partition == moved)
            || matches!(e, Event::LocalDiscarded { partition, .. } if *partition == moved)
    })
    .await;
    assert!(
        matches!(
            reused,
            Event::LocalReused {
                from: 300,
                to: PER_PARTITION,
                ..
            }
        ),
        "the kept records were reused: {reused:?}"
    );

    // Everything not processed yet arrives, and is committed.
    let mut wanted: BTreeSet<(i32, i64)> = (0..2)
        .flat_map(|partition| (0..PER_PARTITION).map(move |offset| (partition, offset)))
        .filter(|&(partition, offset)| partition != moved || offset >= 300)
        .collect();
    while !wanted.is_empty() {
        let delivery = support::next_delivery_or(&first, WAIT, || {
            format!("{} offsets never delivered", wanted.len())
        })
        .await;
        wanted.remove(&(delivery.partition, delivery.offset));
        first.ack(&delivery);
    }
    first.close().await.expect("close");
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        vec![Some(PER_PARTITION); 2],
        "everything processed is committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_another_owner_processed_are_dropped() {
    let kafka = Kafka::connect();
    let topic = unique("kept-pruned");
    let group = unique("kept-pruned-group");
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let (first, second, mut events, moved) =
        second_member_takes_one(&kafka, &topic, &group, &dirs).await;

    // The new owner processes all of it: the first member's copy can never be reused.
    process(&second, moved, 0, PER_PARTITION).await;
    let dropped = wait_for_event(
        &mut events,
        WAIT,
        |e| matches!(e, Event::LocalDiscarded { partition, .. } if *partition == moved),
    )
    .await;
    assert!(
        matches!(&dropped, Event::LocalDiscarded { reason, .. }
            if reason.contains("not assigned here") && reason.contains("past everything buffered")),
        "{dropped:?}"
    );
    second.close().await.expect("close");
    first.close().await.expect("close");
}
