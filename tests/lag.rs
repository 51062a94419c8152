//! `catchup lag` and `catchup::group_lag` during a real split: the group's committed offset
//! (all that standard lag tools see) reports the whole backlog, while the true state — the
//! backlog left, where the live lane stands, read from the split token and the verified side
//! entry — agrees with what the consumer itself reports (`buffers()`, `backlog()`).

mod support;

use std::process::Command;
use std::time::Duration;

use catchup::{DeliveryLane, Mode, SideStatus};
use support::{Backlog, Kafka, catchup_consumer, test_config, unique};

const WAIT: Duration = Duration::from_secs(60);
const BACKLOG: usize = 2000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_during_a_split_agrees_with_the_consumer() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("lag", 1, BACKLOG).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = catchup_consumer(
        &kafka,
        &group,
        test_config(dir.path(), Mode::Concurrent, 100),
    );
    let (_events, _split) = support::subscribe_until_split(&consumer, &topic).await;
    kafka.produce_from(&topic, 1, BACKLOG, 30).await;

    // Process part of the backlog and some fresh records, then commit both lanes.
    let (mut backlog, mut fresh) = (0, 0);
    while backlog < 300 || fresh < 10 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        match delivery.lane {
            DeliveryLane::Catchup if backlog < 300 => backlog += 1,
            DeliveryLane::Live if fresh < 10 => fresh += 1,
            // Past what this test processes: not acked, not counted.
            _ => continue,
        }
        consumer.ack(&delivery);
    }
    consumer.commit().await.expect("commit");
    let buffers = consumer.buffers().expect("buffers");
    let mine = &buffers[0];
    let boundary = mine.boundary.expect("split");

    let lags = catchup::group_lag(
        &kafka.consumer_config(&unique("lag-reader")),
        &group,
        &[&topic],
        "__catchup_side",
    )
    .expect("group lag");
    assert_eq!(lags.len(), 1);
    let lag = &lags[0].lag;
    let log_end = (BACKLOG + 30) as i64;
    assert_eq!(lag.split, Some((mine.epoch, boundary)));
    assert_eq!(lag.side, SideStatus::Verified);
    assert_eq!(lag.committed, Some(mine.catchup.processed_next));
    assert_eq!(lag.live_next, Some(mine.live.processed_next));
    assert_eq!(
        lag.catchup_remaining,
        boundary - mine.catchup.processed_next
    );
    assert_eq!(lag.log_end, log_end);
    assert_eq!(lag.live_lag, Some(log_end - mine.live.processed_next));
    assert_eq!(
        lag.reported_lag,
        Some(log_end - mine.catchup.processed_next)
    );
    assert!(
        lag.reported_lag > lag.live_lag,
        "standard tools see the backlog: {lag:?}"
    );
    // The consumer's own `backlog()` counts the same: from the group's offset to the log end.
    assert_eq!(
        consumer.backlog().await.expect("backlog"),
        (log_end - mine.catchup.processed_next) as u64
    );

    // The command line says the same.
    let output = Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args([
            "lag",
            "--brokers",
            &kafka.bootstrap,
            "--group",
            &group,
            "--topic",
            &topic,
            "--json",
        ])
        .output()
        .expect("catchup lag");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    let partition = &report["partitions"][0];
    assert_eq!(partition["live_next"], mine.live.processed_next);
    assert_eq!(partition["committed"], mine.catchup.processed_next);
    assert_eq!(
        partition["catchup_remaining"],
        boundary - mine.catchup.processed_next
    );
    assert_eq!(partition["side_entry"], "verified");

    // Without --topic, as `kafka-consumer-groups --describe`: the partitions the group
    // committed, the same report.
    let output = Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args([
            "lag",
            "--brokers",
            &kafka.bootstrap,
            "--group",
            &group,
            "--json",
        ])
        .output()
        .expect("catchup lag");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let by_group: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(by_group["partitions"], report["partitions"]);
    // A group that never committed has nothing to show.
    let nothing = catchup::group_lag(
        &kafka.consumer_config(&unique("lag-reader")),
        &unique("never-committed"),
        &[],
        "__catchup_side",
    )
    .expect("group lag");
    assert!(nothing.is_empty(), "{nothing:?}");
    consumer.close().await.expect("close");
}
