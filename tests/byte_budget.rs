//! The buffer's byte budget: above it the fetchers pause, below half of it they resume —
//! a large backlog never fills the disk, and everything is still delivered.

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, Event, Mode};
use support::{Kafka, catchup_consumer, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);
const RECORDS: usize = 20_000;
const BUDGET: u64 = 32 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetchers_pause_at_the_budget_and_resume_below_half() {
    let kafka = Kafka::connect();
    let topic = unique("budget");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, RECORDS).await;
    let group = unique("budget-group");
    kafka.commit_as_operator(&group, &topic, &[0]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = CatchupConfig {
        mode: Mode::Ordered,
        min_lag: 100,
        buffer_budget_bytes: BUDGET,
        ..CatchupConfig::new(dir.path())
    };
    let consumer = catchup_consumer(&kafka, &group, config);
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");

    // Nobody reads yet: the catch-up fetcher must stop long before the backlog is fetched.
    let paused = wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::Backpressure { paused: true, .. })
    })
    .await;
    let Event::Backpressure {
        fetcher,
        buffered_bytes,
        ..
    } = paused
    else {
        unreachable!()
    };
    assert_eq!(fetcher, "catch-up");
    assert!(buffered_bytes > BUDGET);
    let fetched = consumer.buffers().expect("buffers")[0].catchup.fetched_next;
    assert!(
        fetched < RECORDS as i64 / 2,
        "fetched {fetched} of {RECORDS} despite a {BUDGET}-byte budget"
    );

    // Reading and acknowledging frees the budget: fetching resumes, everything arrives.
    let mut next = 0;
    while next < RECORDS as i64 {
        let delivery = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .expect("in time")
            .expect("recv");
        assert_eq!(delivery.offset, next);
        next += 1;
        consumer.ack(&delivery);
    }
    let resumed = wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::Backpressure { paused: false, .. })
    })
    .await;
    assert!(
        matches!(resumed, Event::Backpressure { buffered_bytes, .. } if buffered_bytes <= BUDGET / 2)
    );
    consumer.close().await.expect("close");
}
