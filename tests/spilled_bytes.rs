//! What waits goes to disk, and an operator can see how much: in `Ordered`, fresh records
//! fetched while the backlog is not processed wait behind it, beyond the memory tier's
//! allowance (a quarter of the byte budget), and are spilled to sled. The consumer counts
//! those bytes in `catchup_buffer_spilled_bytes_total` and still hands every record out, in
//! order, from disk.

mod support;

use std::time::Duration;

use catchup::{Event, Mode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{Backlog, Kafka, catchup_consumer, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);
const BACKLOG: usize = 300;
const FRESH: usize = 5_000;
/// A quarter of it may wait in memory (16 KiB): the fresh records are several times that.
const BUDGET: u64 = 64 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_records_behind_a_backlog_are_spilled_and_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let spilled = || {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(key, ..)| key.key().name() == "catchup_buffer_spilled_bytes_total")
            .and_then(|(.., value)| match value {
                DebugValue::Counter(bytes) => Some(bytes),
                _ => None,
            })
    };

    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("spilled", 1, BACKLOG).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Ordered, 100).buffer_budget_bytes(BUDGET);
    let consumer = catchup_consumer(&kafka, &group, config);
    let (mut events, _split) = support::subscribe_until_split(&consumer, &topic).await;
    kafka.produce_from(&topic, 1, BACKLOG, FRESH).await;

    // Nothing is read yet: the live lane fetches the fresh records behind the backlog, and
    // the next commit cycle reports what the tier spilled of them.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if spilled().is_some_and(|bytes| bytes > 0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing spilled within {WAIT:?} (counter {:?})",
            spilled()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for expected in 0..(BACKLOG + FRESH) as i64 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        assert_eq!(delivery.offset, expected, "in order, none lost");
        consumer.ack(&delivery);
    }
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.close().await.expect("close");
}
