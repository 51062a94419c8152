//! `Concurrent` keeps the backlog moving when the application is slower than the live rate:
//! fresh records come first, but the catch-up lane still gets its share of the deliveries,
//! so the split ends (a backlog that never drains would never merge, and the group's offset
//! would never move). Fresh records arrive at 500/s, the application takes 250/s.

mod support;

use std::time::{Duration, Instant};

use catchup::{DeliveryLane, Mode};
use support::{Backlog, Kafka, catchup_consumer, test_config};

const BACKLOG: usize = 6_000;
const RUN_FOR: Duration = Duration::from_secs(12);
/// The application's time per record: 250 records/s.
const PER_RECORD: Duration = Duration::from_millis(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_gets_a_share_while_fresh_records_outpace_the_application() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("share", 1, BACKLOG).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = catchup_consumer(
        &kafka,
        &group,
        test_config(dir.path(), Mode::Concurrent, 100),
    );
    consumer.subscribe(&[&topic]).expect("subscribe");

    // Fresh records at 500/s, in batches of 25 every 50 ms, for as long as the run lasts.
    let fresh_topic = topic.clone();
    let fresh = tokio::spawn(async move {
        let kafka = Kafka::connect();
        let mut next = BACKLOG;
        let started = Instant::now();
        while started.elapsed() < RUN_FOR + Duration::from_secs(2) {
            kafka.produce_from(&fresh_topic, 1, next, 25).await;
            next += 25;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    let (mut catchup, mut live) = (0u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < RUN_FOR {
        let delivery = support::next_delivery(&consumer, Duration::from_secs(30)).await;
        match delivery.lane {
            DeliveryLane::Catchup => catchup += 1,
            DeliveryLane::Live => live += 1,
            DeliveryLane::Plain => panic!("the partition was not split"),
        }
        consumer.ack(&delivery);
        // The application's work (it is slower than the records arrive).
        tokio::time::sleep(PER_RECORD).await;
    }
    fresh.abort();
    let total = catchup + live;
    eprintln!(
        "{total} deliveries in {RUN_FOR:?}: {catchup} from the backlog ({:.0} %), {live} fresh",
        100.0 * catchup as f64 / total as f64
    );
    assert!(live > 0, "no fresh record was delivered");
    assert!(
        catchup * 5 >= total,
        "the backlog got {catchup} of {total} deliveries: less than a fifth"
    );
    consumer.close().await.expect("close");
}
