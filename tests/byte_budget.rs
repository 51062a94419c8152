//! The buffer's byte budget: above it the fetchers pause, below half of it they resume —
//! a large backlog never fills the disk, and everything is still delivered. What counts is
//! what is not acknowledged: a reader that takes records and acknowledges none makes the
//! fetcher pause (one that takes nothing holds the lane to its read-ahead first, at most half
//! its share: `tests/read_ahead.rs`).

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, Event, Mode};
use support::{Backlog, Kafka, catchup_consumer, take_unacked_until_event, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);
const RECORDS: usize = 20_000;
const BUDGET: u64 = 32 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetchers_pause_at_the_budget_and_resume_below_half() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("budget", 1, RECORDS).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = CatchupConfig::new(dir.path())
        .mode(Mode::Ordered)
        .min_lag(100)
        .buffer_budget_bytes(BUDGET);
    let consumer = catchup_consumer(&kafka, &group, config);
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");

    // The reader takes records and acknowledges none yet: the catch-up fetcher must pause the
    // partition long before the backlog is fetched. Its pause is the event to wait for,
    // whatever the other fetcher does.
    let mut seen = Vec::new();
    let (taken, paused) = take_unacked_until_event(&consumer, &mut events, WAIT, |e| {
        seen.push(e.clone());
        matches!(e, Event::Backpressure { fetcher, paused: true, .. } if fetcher == "catch-up")
    })
    .await;
    let Event::Backpressure {
        buffered_bytes,
        share,
        ..
    } = paused
    else {
        unreachable!()
    };
    // Two slots (the live and the catch-up lane of the one partition) share the budget.
    assert_eq!(share, BUDGET / 2);
    assert!(
        buffered_bytes > share,
        "{buffered_bytes} bytes paused at a share of {share}"
    );
    let fetched = consumer.buffers().expect("buffers")[0].catchup.fetched_next;
    assert!(
        fetched < RECORDS as i64 / 2,
        "fetched {fetched} of {RECORDS} despite a {BUDGET}-byte budget"
    );

    // Acknowledging frees the budget: fetching resumes, everything arrives.
    let offsets: Vec<i64> = taken.iter().map(|d| d.offset).collect();
    assert_eq!(
        offsets,
        (0..taken.len() as i64).collect::<Vec<_>>(),
        "in order"
    );
    taken.iter().for_each(|delivery| consumer.ack(delivery));
    let mut next = taken.len() as i64;
    while next < RECORDS as i64 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        assert_eq!(delivery.offset, next);
        next += 1;
        consumer.ack(&delivery);
    }
    let resumed = wait_for_event(&mut events, WAIT, |e| {
        seen.push(e.clone());
        matches!(e, Event::Backpressure { fetcher, paused: false, .. } if fetcher == "catch-up")
    })
    .await;
    assert!(
        matches!(resumed, Event::Backpressure { buffered_bytes, share, .. } if buffered_bytes <= share / 2)
    );
    // The live lane holds nothing (no record was produced after the split): it is never
    // paused for the catch-up lane's bytes (finding F14: in Ordered mode those bytes used to
    // pause every partition's live lane).
    let live_pauses: Vec<&Event> = seen
        .iter()
        .filter(|e| matches!(e, Event::Backpressure { fetcher, .. } if fetcher == "live"))
        .collect();
    assert!(live_pauses.is_empty(), "live lane paused: {live_pauses:?}");
    consumer.close().await.expect("close");
}
