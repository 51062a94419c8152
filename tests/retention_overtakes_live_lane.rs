//! Retention overtakes a paused live lane: in `Ordered` mode the live lane of a split partition
//! pauses at its share of the byte budget while the backlog waits to be read, and retention
//! (here `DeleteRecords`, which moves the log start the same way, at once) deletes records past
//! its position. When the lane resumes, its position is out of range: it must report the
//! truncation and continue at the new log start — not jump to the log end by itself (which
//! librdkafka's own `auto.offset.reset` would do, skipping records that still exist) and not
//! stop for good.

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, CatchupConsumer, Event, Mode};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use support::{Backlog, Kafka, subscribe_until_split, take_unacked_until_event, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);
const BACKLOG: usize = 3_000;
const DELETE_BEFORE: i64 = 5_000;
const LOG_END: i64 = 6_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_live_lane_reports_it_and_continues_at_the_log_start() {
    truncated_live_lane(None).await;
}

/// The same under an eager assignor: librdkafka refuses to seek a partition its out-of-range
/// error stopped, and refuses incremental changes outside a rebalance; a stable group never
/// rebalances, so the live lane must assign the whole assignment again itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_live_lane_continues_under_an_eager_assignor() {
    truncated_live_lane(Some("range")).await;
}

async fn truncated_live_lane(assignor: Option<&str>) {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("retention", 1, BACKLOG).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = CatchupConfig::new(dir.path())
        .mode(Mode::Ordered)
        .min_lag(100)
        .buffer_budget_bytes(32 << 10)
        .commit_interval(Duration::from_millis(200));
    let mut client = kafka.consumer_config(&group);
    if let Some(assignor) = assignor {
        client.set("partition.assignment.strategy", assignor);
    }
    let consumer = CatchupConsumer::new(&client, config).expect("catchup consumer");
    let (mut events, split) = subscribe_until_split(&consumer, &topic).await;
    assert!(matches!(split, Event::SplitStarted { boundary, .. } if boundary == BACKLOG as i64));

    // Fresh records the live lane fetches but cannot deliver before the backlog: both lanes
    // pause at their share of the budget — the live lane by itself, the catch-up lane once
    // the reader took records and acknowledged none (not taken, they would hold it to its
    // read-ahead, below its share).
    kafka.produce_from(&topic, 1, BACKLOG, 1_000).await;
    let mut paused: Vec<String> = Vec::new();
    let (taken, _) = take_unacked_until_event(&consumer, &mut events, WAIT, |e| {
        if let Event::Backpressure {
            fetcher,
            paused: true,
            ..
        } = e
        {
            if !paused.contains(fetcher) {
                paused.push(fetcher.clone());
            }
        }
        paused.len() == 2
    })
    .await;
    let buffers = consumer.buffers().expect("buffers");
    let (catchup_at, paused_at) = (
        buffers[0].catchup.fetched_next,
        buffers[0].live.fetched_next,
    );
    assert!(catchup_at < BACKLOG as i64, "the backlog was fetched whole");
    assert!(
        (BACKLOG as i64..DELETE_BEFORE).contains(&paused_at),
        "live lane paused at {paused_at}"
    );
    // More records arrive while it is paused, and retention deletes past both positions.
    kafka.produce_from(&topic, 1, 4_000, 2_000).await;
    let low = delete_records(&kafka.bootstrap, &topic, DELETE_BEFORE).await;
    assert_eq!(low, DELETE_BEFORE);

    // Read everything: what each lane held, then from the new log start.
    let mut delivered: Vec<i64> = taken.iter().map(|delivery| delivery.offset).collect();
    taken.iter().for_each(|delivery| consumer.ack(delivery));
    while delivered.last().is_none_or(|&last| last < LOG_END - 1) {
        let delivery = support::next_delivery_or(&consumer, WAIT, || {
            format!("stalled after {:?}", delivered.last())
        })
        .await;
        delivered.push(delivery.offset);
        consumer.ack(&delivery);
    }
    // Each lane reports what it lost: the rest of the backlog, and the live records between
    // the paused position and the new log start.
    let mut truncations = Vec::new();
    while truncations.len() < 2 {
        let event =
            wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Truncated { .. })).await;
        if let Event::Truncated { from, to, .. } = event {
            truncations.push((from, to));
        }
    }
    truncations.sort();
    assert_eq!(
        truncations,
        vec![(catchup_at, BACKLOG as i64), (paused_at, DELETE_BEFORE)]
    );
    let expected: Vec<i64> = (0..catchup_at)
        .chain(BACKLOG as i64..paused_at)
        .chain(DELETE_BEFORE..LOG_END)
        .collect();
    assert!(
        delivered == expected,
        "{} deliveries, not exactly [0, {catchup_at}), [{BACKLOG}, {paused_at}), [{DELETE_BEFORE}, {LOG_END}) in order",
        delivered.len()
    );
    consumer.commit().await.expect("commit");
    consumer.close().await.expect("close");
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(LOG_END)]);
}

/// Deletes the records of partition 0 below `before`; returns the new log start.
async fn delete_records(bootstrap: &str, topic: &str, before: i64) -> i64 {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(topic, 0, Offset::Offset(before))
        .expect("partition offset");
    let result = admin
        .delete_records(&offsets, &AdminOptions::new())
        .await
        .expect("delete records");
    let element = result
        .find_partition(topic, 0)
        .expect("partition 0 in the result");
    element.error().expect("records deleted");
    match element.offset() {
        Offset::Offset(low) => low,
        other => panic!("unexpected low watermark {other:?}"),
    }
}
