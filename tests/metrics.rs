//! Counters, gauges and histograms through the `metrics` facade: records per lane, lag and
//! buffered bytes per lane, time to the first fresh record after an assignment.

mod support;

use std::time::Duration;

use catchup::{Event, Mode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{Kafka, catchup_consumer, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_reports_its_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let kafka = Kafka::connect();
    let topic = unique("metrics");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 300).await;
    let group = unique("metrics-group");
    kafka.commit_as_operator(&group, &topic, &[0]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Concurrent, 100);
    let consumer = catchup_consumer(&kafka, &group, config);
    let (mut events, _split) = support::subscribe_until_split(&consumer, &topic).await;
    kafka.produce_from(&topic, 1, 300, 10).await;
    for _ in 0..310 {
        let delivery = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .expect("in time")
            .expect("recv");
        consumer.ack(&delivery);
    }
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.close().await.expect("close");

    let snapshot = snapshotter.snapshot().into_vec();
    let value = |name: &str, lane: Option<&str>| {
        snapshot
            .iter()
            .find(|(key, ..)| {
                key.key().name() == name
                    && lane.is_none_or(|lane| key.key().labels().any(|l| l.value() == lane))
            })
            .map(|(.., value)| value)
    };
    assert!(matches!(
        value("catchup_records_fetched_total", Some("catchup")),
        Some(DebugValue::Counter(300))
    ));
    assert!(
        matches!(value("catchup_records_fetched_total", Some("live")), Some(DebugValue::Counter(n)) if *n >= 10)
    );
    assert!(matches!(
        value("catchup_records_delivered_total", Some("catchup")),
        Some(DebugValue::Counter(300))
    ));
    assert!(
        matches!(value("catchup_time_to_first_fresh_seconds", None), Some(DebugValue::Histogram(h)) if h.len() == 1)
    );
    assert!(matches!(
        value("catchup_lag_offsets", Some("live")),
        Some(DebugValue::Gauge(_))
    ));
    assert!(matches!(
        value("catchup_buffered_bytes", Some("catchup")),
        Some(DebugValue::Gauge(_))
    ));
    assert!(matches!(
        value("catchup_merges_total", None),
        Some(DebugValue::Counter(1))
    ));
}
