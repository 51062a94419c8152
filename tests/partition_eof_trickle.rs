//! `enable.partition.eof=true` in the user's rdkafka settings, with records trickling in at
//! the log end: nothing is lost. (Regression: a poll error — the end-of-partition "error" —
//! dropped the batch polled before it, and the next batch covered those offsets as a gap.)
//! In every mode every produced record is delivered, with the key and value produced at its
//! offset (a batch of the fetcher mixes records and ends of partition), in offset order per
//! partition (per lane in `Concurrent`), and after `close` the group's offsets are the log
//! end.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use catchup::{DeliveryLane, Event, Mode};
use support::{Kafka, Produced, unique, wait_for_event};

const PARTITIONS: i32 = 2;
const BACKLOG: usize = 3_000;
const TRICKLE: usize = 1_000;
const BURST: usize = 20;
const WAIT: Duration = Duration::from_secs(60);
const DEADLINE: Duration = Duration::from_secs(60);

/// Produces `TRICKLE` records in bursts of `BURST` every 20 ms (load, not synchronisation).
async fn trickle(topic: String) -> Vec<Produced> {
    let kafka = Kafka::connect();
    let mut produced = Vec::with_capacity(TRICKLE);
    for burst in 0..TRICKLE / BURST {
        let first = BACKLOG + burst * BURST;
        produced.extend(kafka.produce_from(&topic, PARTITIONS, first, BURST).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    produced
}

/// Off: every record plain. Split: below the boundary the catch-up lane; from it the live
/// lane, tagged `Live` while split and `Plain` once merged.
fn lane_ok(mode: Mode, lane: DeliveryLane, offset: i64, boundary: i64) -> bool {
    match (mode, lane) {
        (Mode::Off, lane) => lane == DeliveryLane::Plain,
        (_, DeliveryLane::Catchup) => offset < boundary,
        (_, DeliveryLane::Live | DeliveryLane::Plain) => offset >= boundary,
    }
}

async fn nothing_lost_at_the_log_end(mode: Mode) {
    let kafka = Kafka::connect();
    let topic = unique("eof-trickle");
    kafka.create_topic(&topic, PARTITIONS).await;
    let backlog = kafka.produce(&topic, PARTITIONS, BACKLOG).await;
    let group = unique("eof-trickle-group");
    kafka.commit_as_operator(&group, &topic, &[0, 0]);

    let dir = tempfile::tempdir().expect("tempdir");
    let mut client = kafka.consumer_config(&group);
    client.set("enable.partition.eof", "true");
    let config = support::test_config(dir.path(), mode, 100);
    let consumer = catchup::CatchupConsumer::new(&client, config).expect("catchup consumer");
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");

    // Start the trickle once the partitions are ours (and, when splitting, split), so that
    // it arrives while the fetchers sit at the log end.
    let per_partition = (BACKLOG / PARTITIONS as usize) as i64;
    let mut boundaries: BTreeMap<i32, i64> = BTreeMap::new();
    while boundaries.len() < PARTITIONS as usize {
        match wait_for_event(&mut events, WAIT, |e| {
            matches!(e, Event::SplitStarted { .. } | Event::Assigned { .. })
        })
        .await
        {
            Event::SplitStarted {
                partition,
                from,
                boundary,
                ..
            } => {
                assert_eq!((from, boundary), (0, per_partition), "split of {partition}");
                boundaries.insert(partition, boundary);
            }
            Event::Assigned { partitions } if mode == Mode::Off => {
                boundaries.extend(partitions.iter().map(|(_, p)| (*p, 0)));
            }
            _ => {}
        }
    }
    let mut producer = tokio::spawn(trickle(topic.clone()));

    let mut missing: BTreeSet<(i32, i64)> = BTreeSet::new();
    // What was produced at each offset, and what the first delivery of it carried.
    let mut produced_at: HashMap<(i32, i64), (Vec<u8>, Vec<u8>)> = HashMap::new();
    let mut delivered_at: HashMap<(i32, i64), (Vec<u8>, Vec<u8>)> = HashMap::new();
    let mut note_produced = |records: Vec<Produced>, missing: &mut BTreeSet<(i32, i64)>| {
        for record in records {
            missing.insert((record.partition, record.offset));
            produced_at.insert(
                (record.partition, record.offset),
                (record.key, record.payload),
            );
        }
    };
    note_produced(backlog, &mut missing);
    let mut trickled = false;
    let mut seen: HashMap<(i32, i64), usize> = HashMap::new();
    let mut order: BTreeMap<(i32, bool), Vec<i64>> = BTreeMap::new();
    let mut tags: BTreeMap<DeliveryLane, usize> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !trickled || !missing.is_empty() {
        let delivery = tokio::select! {
            produced = &mut producer, if !trickled => {
                let produced = produced.expect("trickle task");
                assert_eq!(produced.len(), TRICKLE, "trickle produced");
                note_produced(produced, &mut missing);
                missing.retain(|at| !seen.contains_key(at));
                trickled = true;
                continue;
            }
            delivery = tokio::time::timeout_at(deadline, consumer.recv()) => delivery,
        };
        let delivery = delivery
            .unwrap_or_else(|_| {
                panic!(
                    "{mode:?}: {} produced records not delivered within {DEADLINE:?}, first {:?}",
                    missing.len(),
                    missing.iter().take(5).collect::<Vec<_>>()
                )
            })
            .expect("recv");
        consumer.ack(&delivery);
        let at = (delivery.partition, delivery.offset);
        *seen.entry(at).or_default() += 1;
        missing.remove(&at);
        delivered_at.entry(at).or_insert_with(|| {
            let bytes =
                |field: &Option<catchup::Bytes>| field.as_deref().unwrap_or_default().to_vec();
            (bytes(&delivery.key), bytes(&delivery.payload))
        });
        *tags.entry(delivery.lane).or_default() += 1;
        let boundary = boundaries
            .get(&delivery.partition)
            .copied()
            .expect("an assigned partition");
        assert!(
            lane_ok(mode, delivery.lane, delivery.offset, boundary),
            "{mode:?}: {at:?} came through {:?}, boundary {boundary}",
            delivery.lane
        );
        // Ordered and Off: one sequence per partition; Concurrent: one per lane (`Live` and,
        // after the merge, `Plain` are both the live lane).
        let lane = mode == Mode::Concurrent && delivery.lane == DeliveryLane::Catchup;
        order
            .entry((delivery.partition, lane))
            .or_default()
            .push(delivery.offset);
    }
    consumer.commit().await.expect("commit");

    let deliveries: usize = seen.values().sum();
    let duplicates = deliveries - seen.len();
    eprintln!(
        "{mode:?}: {deliveries} deliveries, {} distinct, {duplicates} duplicates, by tag {tags:?}",
        seen.len()
    );
    assert_eq!(
        seen.len(),
        BACKLOG + TRICKLE,
        "{mode:?}: only produced records are delivered"
    );
    for (at, delivered) in &delivered_at {
        assert_eq!(
            Some(delivered),
            produced_at.get(at),
            "{mode:?}: the key and value delivered at {at:?} are the ones produced there"
        );
    }
    for ((partition, catchup_lane), offsets) in &order {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "{mode:?}: partition {partition} (catch-up lane: {catchup_lane}) not strictly \
             increasing ({duplicates} duplicates)"
        );
    }
    consumer.close().await.expect("close");
    let ends: Vec<Option<i64>> = kafka
        .watermarks(&topic, PARTITIONS)
        .into_iter()
        .map(|(_, high)| Some(high))
        .collect();
    assert_eq!(
        ends,
        vec![Some(((BACKLOG + TRICKLE) / PARTITIONS as usize) as i64); PARTITIONS as usize],
        "log end"
    );
    assert_eq!(
        kafka.committed(&group, &topic, PARTITIONS),
        ends,
        "{mode:?}: after close the group's offsets are the log end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loses_nothing_with_partition_eof() {
    nothing_lost_at_the_log_end(Mode::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_loses_nothing_with_partition_eof() {
    nothing_lost_at_the_log_end(Mode::Ordered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loses_nothing_with_partition_eof() {
    nothing_lost_at_the_log_end(Mode::Concurrent).await;
}
