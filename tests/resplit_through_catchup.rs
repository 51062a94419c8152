//! A re-split whose two catch-up ranges are both fetched by the catch-up consumer, with the
//! log end less than 2,000 past the first boundary.
//!
//! A first life (Concurrent) processes catch-up `[0, 1000)` and live `[3000, 3200)` of a
//! split at `B1 = 3000`, commits (main log `G = 1000`, side entry `L = 3200`) and crashes.
//! The log grows to about 4,000, so the live lane is itself `min_lag` behind. A second life
//! with an empty buffer resumes and re-splits: catch-up `[1000, 3000)` and `[3200, HW)`, live
//! from `HW`. An end of partition seen for the first range was once applied to the second,
//! which lost `[3200, HW)` entirely: every one of those offsets must be delivered.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use catchup::{CatchupConfig, CatchupConsumer, DeliveryLane, Event, Mode};
use support::{Backlog, Kafka, catchup_consumer, side_value, wait_for_event};

const BACKLOG: i64 = 3000;
/// Records produced after the first split, so the live lane has some.
const FIRST_LIVE: usize = 600;
/// What the first life acknowledges: catch-up `[0, G1)`, live `[BACKLOG, L1)`.
const G1: i64 = 1000;
const L1: i64 = 3200;
/// Records produced while no one is in the group: the log end becomes 4,000.
const WHILE_DOWN: usize = 400;
/// Fresh records produced after the re-split.
const FRESH: usize = 20;
const MIN_LAG: u64 = 100;
const WAIT: Duration = Duration::from_secs(60);
const SIDE_TOPIC: &str = "__catchup_side";

fn config(dir: &Path, mode: Mode) -> CatchupConfig {
    support::test_config(dir, mode, MIN_LAG)
}

/// The side entry under `key` without its MAC (random with each split's secret).
fn side_body(kafka: &Kafka, key: &str) -> Option<String> {
    let value = side_value(kafka, SIDE_TOPIC, key)?;
    let (body, mac) = value
        .rsplit_once(" m=")
        .expect("a side entry carries a MAC");
    assert_eq!(mac.len(), 32, "a 128-bit MAC in hex: {value}");
    Some(body.to_owned())
}

/// The next delivery, or a panic naming what was awaited.
async fn next(consumer: &CatchupConsumer, what: &str) -> catchup::Delivery {
    support::next_delivery_or(consumer, WAIT, || {
        format!("no delivery within {WAIT:?} while waiting for {what}")
    })
    .await
}

/// The first life: splits at `BACKLOG`, acknowledges catch-up `[0, G1)` and live
/// `[BACKLOG, L1)` only, commits, checks what Kafka holds and returns the split epoch.
/// Dropped without close by the caller (a crash).
async fn first_life(kafka: &Kafka, consumer: &CatchupConsumer, topic: &str, group: &str) -> u64 {
    let (mut events, split) = support::subscribe_until_split(consumer, topic).await;
    let Event::SplitStarted {
        epoch,
        from,
        boundary,
        partition,
        ..
    } = split
    else {
        unreachable!("subscribe_until_split returns a SplitStarted")
    };
    assert_eq!(
        (partition, from, boundary),
        (0, 0, BACKLOG),
        "first split: catch-up [0, {BACKLOG}), live from {BACKLOG}"
    );
    kafka
        .produce_from(topic, 1, BACKLOG as usize, FIRST_LIVE)
        .await;

    // Concurrent: both lanes at once, each in offset order.
    let (mut next_catchup, mut next_live) = (0i64, BACKLOG);
    let (mut acked_catchup, mut acked_live) = (0i64, 0i64);
    while next_catchup < G1 || next_live < L1 {
        let delivery = next(consumer, "the first life's records").await;
        assert_eq!(delivery.partition, 0);
        match delivery.lane {
            DeliveryLane::Catchup => {
                assert_eq!(delivery.offset, next_catchup, "catch-up lane in order");
                next_catchup += 1;
                if delivery.offset < G1 {
                    consumer.ack(&delivery);
                    acked_catchup += 1;
                }
            }
            DeliveryLane::Live => {
                assert_eq!(delivery.offset, next_live, "live lane in order");
                next_live += 1;
                if delivery.offset < L1 {
                    consumer.ack(&delivery);
                    acked_live += 1;
                }
            }
            DeliveryLane::Plain => panic!("a split partition delivered a plain record"),
        }
    }
    assert_eq!((acked_catchup, acked_live), (G1, L1 - BACKLOG));
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(group, topic, 1),
        vec![Some(G1)],
        "the main log holds catch-up progress only"
    );
    let side = side_body(kafka, &format!("{group}/{topic}/0"));
    assert_eq!(
        side.as_deref(),
        Some(format!("catchup-side/2 e={epoch} b={BACKLOG} l={L1} r={G1}-{BACKLOG}").as_str()),
        "the side entry holds live progress"
    );
    let unexpected: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok())
        .filter(|e| {
            matches!(
                e,
                Event::Merged { .. } | Event::Truncated { .. } | Event::Revoked { .. }
            )
        })
        .collect();
    assert!(unexpected.is_empty(), "first life: {unexpected:?}");
    epoch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resplit_fetches_both_catch_up_ranges() {
    let started = Instant::now();
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("resplit", 1, BACKLOG as usize).await;

    let dir_a = tempfile::tempdir().expect("tempdir");
    let first_epoch = {
        let consumer_a = catchup_consumer(&kafka, &group, config(dir_a.path(), Mode::Concurrent));
        first_life(&kafka, &consumer_a, &topic, &group).await
        // dropped here without close: a crash
    };

    kafka
        .produce_from(&topic, 1, BACKLOG as usize + FIRST_LIVE, WHILE_DOWN)
        .await;
    let (_, high) = kafka.watermarks(&topic, 1)[0];
    assert!(
        high - L1 >= MIN_LAG as i64 && high - BACKLOG < 2000,
        "layout: HW {high} must be min_lag past L {L1} and < 2000 past B1 {BACKLOG}"
    );

    // Second life: same group, a new buffer directory (nothing local to reuse), Ordered.
    let dir_b = tempfile::tempdir().expect("tempdir");
    let consumer = catchup_consumer(&kafka, &group, config(dir_b.path(), Mode::Ordered));
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");
    let decided = wait_for_event(&mut events, WAIT, |e| {
        matches!(
            e,
            Event::SplitResumed { .. }
                | Event::SplitStarted { .. }
                | Event::StaleState { .. }
                | Event::Merged { .. }
                | Event::Truncated { .. }
        )
    })
    .await;
    assert_eq!(
        decided,
        Event::SplitStarted {
            topic: topic.clone(),
            partition: 0,
            epoch: first_epoch + 1,
            from: L1,
            boundary: high,
        },
        "the resumed split re-splits: the live lane's backlog [L, HW) becomes a catch-up range"
    );
    let buffers = consumer.buffers().expect("buffers");
    assert_eq!(buffers.len(), 1, "{buffers:?}");
    let buffered = &buffers[0];
    assert_eq!(buffered.epoch, first_epoch + 1, "{buffered:?}");
    assert_eq!(buffered.boundary, Some(high), "{buffered:?}");
    let ranges: Vec<(i64, i64)> = buffered
        .catchup
        .ranges
        .iter()
        .map(|r| (r.start, r.end))
        .collect();
    assert_eq!(
        ranges,
        vec![(G1, BACKLOG), (L1, high)],
        "two catch-up ranges: {buffered:?}"
    );
    assert_eq!(
        kafka.committed(&group, &topic, 1),
        vec![Some(G1)],
        "the re-split keeps G"
    );
    assert_eq!(
        side_body(&kafka, &format!("{group}/{topic}/0")).as_deref(),
        Some(
            format!(
                "catchup-side/2 e={} b={high} l={high} r={G1}-{BACKLOG},{L1}-{high}",
                first_epoch + 1
            )
            .as_str()
        ),
        "the side entry of the new epoch"
    );

    kafka
        .produce_from(&topic, 1, BACKLOG as usize + FIRST_LIVE + WHILE_DOWN, FRESH)
        .await;
    let (_, end) = kafka.watermarks(&topic, 1)[0];
    assert_eq!(end, high + FRESH as i64);

    let mut delivered = Vec::new();
    while delivered.last() != Some(&(end - 1)) {
        let delivery = next(&consumer, &format!("offset {}", end - 1)).await;
        assert_eq!(delivery.partition, 0);
        if let Some(&previous) = delivered.last() {
            assert!(
                delivery.offset > previous,
                "Ordered: {} after {previous}",
                delivery.offset
            );
        }
        let lane = if delivery.offset < high {
            DeliveryLane::Catchup
        } else {
            DeliveryLane::Live
        };
        assert_eq!(delivery.lane, lane, "lane of offset {}", delivery.offset);
        delivered.push(delivery.offset);
        consumer.ack(&delivery);
    }
    let delivered: BTreeSet<i64> = delivered.into_iter().collect();
    let expected: BTreeSet<i64> = (G1..BACKLOG).chain(L1..end).collect();
    let missing: Vec<i64> = expected.difference(&delivered).copied().collect();
    let extra: Vec<i64> = delivered.difference(&expected).copied().collect();
    assert!(
        missing.is_empty(),
        "{} offsets never delivered, from {:?} to {:?} (second range [{L1}, {high}))",
        missing.len(),
        missing.first(),
        missing.last()
    );
    assert!(
        extra.is_empty(),
        "offsets the first life had committed were delivered again: {} from {:?}",
        extra.len(),
        extra.first()
    );

    // The merge moves G to the live progress at that moment: at least the boundary.
    let merged = wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    assert!(
        matches!(&merged, Event::Merged { topic: t, partition: 0, offset } if *t == topic && (high..=end).contains(offset)),
        "{merged:?}"
    );
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&group, &topic, 1),
        vec![Some(end)],
        "merged: G is the log end"
    );
    assert_eq!(
        side_value(&kafka, SIDE_TOPIC, &format!("{group}/{topic}/0")),
        None,
        "side entry gone after the merge"
    );
    let discarded: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok())
        .filter(|e| matches!(e, Event::LocalDiscarded { .. } | Event::Truncated { .. }))
        .collect();
    assert!(discarded.is_empty(), "{discarded:?}");
    consumer.close().await.expect("close");
    eprintln!(
        "resplit: ranges [{G1}, {BACKLOG}) and [{L1}, {high}), end {end}, {} delivered, {:?}",
        delivered.len(),
        started.elapsed()
    );
}
