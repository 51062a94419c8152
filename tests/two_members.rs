//! Two members: a partition moves while its catch-up is running. No loss, and no
//! reprocessing beyond the last commit: the new owner starts exactly where the old one's
//! acknowledged work ends.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use catchup::{CatchupConfig, CatchupConsumer, Event, Mode};
use support::{Kafka, catchup_consumer, unique, wait_for_event};

const PER_PARTITION: i64 = 5000;
const WAIT: Duration = Duration::from_secs(60);

fn config(dir: &tempfile::TempDir) -> CatchupConfig {
    support::test_config(dir.path(), Mode::Ordered, 100)
}

/// Consumes (acking each record) until `partitions` are read through `end`; returns the
/// offsets per partition.
async fn consume_until(
    consumer: &CatchupConsumer,
    partitions: &[i32],
    end: i64,
) -> BTreeMap<i32, Vec<i64>> {
    let mut seen: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    while !partitions
        .iter()
        .all(|p| seen.get(p).and_then(|o| o.last()) == Some(&(end - 1)))
    {
        let delivery = support::next_delivery_or(consumer, WAIT, || {
            format!("no delivery for {partitions:?} within {WAIT:?}")
        })
        .await;
        seen.entry(delivery.partition)
            .or_default()
            .push(delivery.offset);
        consumer.ack(&delivery);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_moves_during_catch_up() {
    let kafka = Kafka::connect();
    let topic = unique("two-members");
    kafka.create_topic(&topic, 2).await;
    for partition in 0..2 {
        kafka
            .produce_to(&topic, partition, 0, PER_PARTITION as usize)
            .await;
    }
    let group = unique("two-members-group");
    kafka.commit_as_operator(&group, &topic, &[0, 0]);

    let dir_a = tempfile::tempdir().expect("tempdir");
    let member_a = catchup_consumer(&kafka, &group, config(&dir_a));
    let mut events_a = member_a.events();
    member_a.subscribe(&[&topic]).expect("subscribe");
    for _ in 0..2 {
        wait_for_event(&mut events_a, WAIT, |e| {
            matches!(e, Event::SplitStarted { .. })
        })
        .await;
    }
    // A processes the first 100 records it gets, then stays idle but in the group.
    let mut first_life: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    while first_life.values().map(Vec::len).sum::<usize>() < 100 {
        let delivery = support::next_delivery(&member_a, WAIT).await;
        first_life
            .entry(delivery.partition)
            .or_default()
            .push(delivery.offset);
        member_a.ack(&delivery);
    }

    // B joins: one partition moves from A to B.
    let dir_b = tempfile::tempdir().expect("tempdir");
    let member_b = catchup_consumer(&kafka, &group, config(&dir_b));
    let mut events_b = member_b.events();
    member_b.subscribe(&[&topic]).expect("subscribe");
    let revoked = wait_for_event(&mut events_a, WAIT, |e| matches!(e, Event::Revoked { .. })).await;
    let Event::Revoked { partitions, lost } = revoked else {
        unreachable!()
    };
    assert!(!lost);
    assert_eq!(
        partitions.len(),
        1,
        "cooperative: only the moved partition is revoked"
    );
    let moved = partitions[0].1;
    let kept = 1 - moved;
    let resumed = wait_for_event(&mut events_b, WAIT, |e| {
        matches!(e, Event::SplitResumed { .. })
    })
    .await;
    assert!(
        matches!(resumed, Event::SplitResumed { partition, epoch: 1, .. } if partition == moved),
        "{resumed:?}"
    );

    let a_last_moved = first_life
        .get(&moved)
        .and_then(|o| o.last())
        .copied()
        .unwrap_or(-1);
    let (kept_only, moved_only) = ([kept], [moved]);
    let (a_rest, b_all) = tokio::join!(
        consume_until(&member_a, &kept_only, PER_PARTITION),
        consume_until(&member_b, &moved_only, PER_PARTITION),
    );
    let b_moved = &b_all[&moved];
    assert_eq!(
        b_moved[0],
        a_last_moved + 1,
        "B starts right after A's last acknowledged record"
    );
    for partition in [moved, kept] {
        let mut all: Vec<i64> = first_life.get(&partition).cloned().unwrap_or_default();
        all.extend(if partition == moved {
            b_moved.clone()
        } else {
            a_rest[&kept].clone()
        });
        assert_eq!(
            all,
            (0..PER_PARTITION).collect::<Vec<_>>(),
            "partition {partition}: no loss, no repeat"
        );
    }
    assert!(
        !a_rest.contains_key(&moved),
        "A delivered nothing of the moved partition after losing it"
    );

    wait_for_event(
        &mut events_a,
        WAIT,
        |e| matches!(e, Event::Merged { partition, .. } if *partition == kept),
    )
    .await;
    wait_for_event(
        &mut events_b,
        WAIT,
        |e| matches!(e, Event::Merged { partition, .. } if *partition == moved),
    )
    .await;
    member_a.commit().await.expect("commit");
    member_b.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        vec![Some(PER_PARTITION), Some(PER_PARTITION)]
    );
    member_b.close().await.expect("close");
    member_a.close().await.expect("close");
}
