//! A catch-up lane reads ahead of its reader about an eighth of its share of the byte
//! budget: behind a slow reader its next records wait in Kafka's client, not in sled (the
//! memory tier spills a lane's oldest records first, exactly those the reader takes next).
//! The read-ahead counts what is not handed out yet, not what is unacknowledged: an
//! application that acknowledges a batch only once it has all of it still gets every batch.

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, CatchupConsumer, Event, Mode};
use support::{Kafka, catchup_consumer, unique};
use tokio::sync::broadcast::error::TryRecvError;

const WAIT: Duration = Duration::from_secs(30);
const RECORDS: usize = 20_000;
const VALUE_BYTES: usize = 1_024;
/// One partition, split: two lanes share it, 16 MiB each; a catch-up lane reads ahead 2 MiB
/// (about 2,000 records), and holds its queue until the reader took half of that.
const BUDGET: u64 = 32 << 20;
/// Records of a lane's whole share (about 16,000): how far the lane ran ahead before.
const SHARE_RECORDS: i64 = (BUDGET / 2 / VALUE_BYTES as u64) as i64;

/// A topic of `RECORDS` 1 KiB records in one partition, and a consumer of a group committed
/// at its start, subscribed (the partition splits at its log end: all of it is backlog), its
/// events and its buffer directory.
async fn backlog(
    name: &str,
) -> (
    CatchupConsumer,
    tokio::sync::broadcast::Receiver<Event>,
    tempfile::TempDir,
) {
    let kafka = Kafka::connect();
    let topic = unique(name);
    kafka.create_topic(&topic, 1).await;
    let records: Vec<(String, String)> = (0..RECORDS)
        .map(|offset| (format!("key-{offset}"), format!("{offset:0>VALUE_BYTES$}")))
        .collect();
    for chunk in records.chunks(2_000) {
        kafka.produce_keyed(&topic, 0, chunk).await;
    }
    let group = unique(&format!("{name}-group"));
    kafka.commit_as_operator(&group, &topic, &[0]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = CatchupConfig::new(dir.path())
        .mode(Mode::Ordered)
        .min_lag(100)
        .buffer_budget_bytes(BUDGET);
    let consumer = catchup_consumer(&kafka, &group, config);
    let events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");
    (consumer, events, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catchup_lane_reads_ahead_an_eighth_of_its_share() {
    let (consumer, mut events, _dir) = backlog("read-ahead").await;
    let mut farthest_ahead = 0;
    for expected in 0..RECORDS as i64 {
        let delivery = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .expect("delivery in time")
            .expect("recv");
        assert_eq!(delivery.offset, expected);
        consumer.ack(&delivery);
        // About 250 µs of work per record (the timer's grain is a millisecond).
        if expected % 4 == 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if expected % 100 == 0 {
            let buffers = consumer.buffers().expect("buffers");
            let fetched = buffers.first().map_or(0, |b| b.catchup.fetched_next);
            farthest_ahead = farthest_ahead.max(fetched - delivery.offset - 1);
        }
    }
    eprintln!("the catch-up lane ran at most {farthest_ahead} records ahead of the reader");
    assert!(
        farthest_ahead > 1_000,
        "the fetcher did run ahead of the slow reader ({farthest_ahead} records)"
    );
    assert!(
        farthest_ahead < SHARE_RECORDS * 3 / 4,
        "the catch-up lane ran {farthest_ahead} records ahead of its reader: held at an eighth of its share, it stays far below the share's {SHARE_RECORDS}"
    );
    let mut paused = Vec::new();
    loop {
        match events.try_recv() {
            Ok(event @ Event::Backpressure { paused: true, .. }) => paused.push(event),
            Ok(_) => {}
            Err(TryRecvError::Empty) => break,
            Err(error) => panic!("the events could not all be seen: {error}"),
        }
    }
    assert!(
        paused.is_empty(),
        "the budget never had to pause: {paused:?}"
    );
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_acknowledging_whole_batches_gets_every_batch() {
    let (consumer, _events, _dir) = backlog("read-ahead-batches").await;
    // 4,000 records of 1 KiB: twice the read-ahead, a quarter of the share.
    const BATCH: usize = 4_000;
    let mut batch = Vec::with_capacity(BATCH);
    for expected in 0..RECORDS as i64 {
        let delivery = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("offset {expected} not delivered in time"))
            .expect("recv");
        assert_eq!(delivery.offset, expected);
        batch.push(delivery);
        if batch.len() == BATCH {
            batch.drain(..).for_each(|delivery| consumer.ack(&delivery));
        }
    }
    consumer.close().await.expect("close");
}
