//! A byte budget too small for any read-ahead (0 bytes: half a lane's share is 0)
//! slows the lanes to a record at a time but stops none: a split partition still hands out
//! every record, in order, and its catch-up lane drains. (Regression: a catch-up queue polled
//! only up to the room its read-ahead left was never polled again once that room was 0.)

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, Event, Mode};
use support::{Backlog, Kafka, catchup_consumer};

const RECORDS: usize = 40;
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_zero_still_drains_a_split() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("tiny-budget", 1, RECORDS).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = CatchupConfig::new(dir.path())
        .mode(Mode::Ordered)
        .min_lag(10)
        .buffer_budget_bytes(0)
        .auto_ack(true);
    let consumer = catchup_consumer(&kafka, &group, config);
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");
    for expected in 0..RECORDS as i64 {
        let delivery = support::next_delivery_or(&consumer, WAIT, || {
            format!("offset {expected} not delivered within {WAIT:?}")
        })
        .await;
        assert_eq!(delivery.offset, expected, "in order, nothing skipped");
    }
    let mut split = false;
    let drained = tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(Event::SplitStarted { .. }) => split = true,
                Ok(Event::CatchupDrained { .. }) => return true,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return false,
            }
        }
    })
    .await;
    assert_eq!(drained, Ok(true), "the catch-up lane drained");
    assert!(
        split,
        "the partition was split: its backlog went through the catch-up lane"
    );
    consumer.close().await.expect("close");
}
