//! Counters, gauges and histograms through the `metrics` facade: records per lane, lag and
//! buffered bytes per lane, time to the first fresh record after an assignment — each
//! labelled with its group and described with its unit — and the same served to Prometheus
//! by `catchup run --metrics-addr`.

mod support;

use std::time::Duration;

use catchup::{Event, Mode};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{Backlog, Kafka, catchup_consumer, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_reports_its_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("metrics", 1, 300).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Concurrent, 100);
    let consumer = catchup_consumer(&kafka, &group, config);
    let (mut events, _split) = support::subscribe_until_split(&consumer, &topic).await;
    kafka.produce_from(&topic, 1, 300, 10).await;
    for _ in 0..310 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        consumer.ack(&delivery);
    }
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    let health = consumer.health();
    assert!(health.is_healthy(), "{health:?}");
    consumer.close().await.expect("close");
    let health = consumer.health();
    assert!(!health.is_healthy());
    assert_eq!(health.stopped.as_deref(), Some("the consumer was closed"));

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
    // 310 records processed as they came: none waited, none was written to disk.
    assert!(matches!(
        value("catchup_buffer_spilled_bytes_total", None),
        Some(DebugValue::Counter(0))
    ));
    // Every series names its group (two consumers in one process never share one), and
    // every metric has its unit and description.
    for (key, unit, description, _) in &snapshot {
        let name = key.key().name();
        if !name.starts_with("catchup_") {
            continue;
        }
        assert!(
            key.key()
                .labels()
                .any(|l| l.key() == "group" && l.value() == group),
            "{name} names its group"
        );
        assert!(
            unit.is_some() && description.is_some(),
            "{name} is described"
        );
    }
    let unit = |name: &str| {
        snapshot
            .iter()
            .find(|(key, ..)| key.key().name() == name)
            .and_then(|(_, unit, ..)| *unit)
    };
    assert_eq!(unit("catchup_buffered_bytes"), Some(Unit::Bytes));
    assert_eq!(
        unit("catchup_buffer_spilled_bytes_total"),
        Some(Unit::Bytes)
    );
    assert_eq!(
        unit("catchup_time_to_first_fresh_seconds"),
        Some(Unit::Seconds)
    );
}

/// `catchup run --metrics-addr` serves the same metrics to Prometheus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_run_serves_prometheus_metrics() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("metrics-cli", 1, 200).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args([
            "run",
            "--brokers",
            &kafka.bootstrap,
            "--group",
            &group,
            "--topic",
            &topic,
            "--discard",
            "--buffer-dir",
            &dir.path().join("buffer").display().to_string(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let fetched = format!("catchup_records_fetched_total{{group=\"{group}\",lane=\"live\"}} 200");
    let deadline = std::time::Instant::now() + WAIT;
    let page = loop {
        let page = scrape(port).unwrap_or_default();
        // The gauges are set at the first commit, a moment after the records arrive.
        if page.contains(&fetched)
            && page.contains("# TYPE catchup_buffered_bytes gauge")
            && page.contains("catchup_partition_live_lag_seconds{")
        {
            break page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {fetched} within {WAIT:?}; last page:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The consumer is open and the brokers answer: healthy.
    let (status, body) = get(port, "/healthz").expect("GET /healthz");
    assert_eq!((status.as_str(), body.as_str()), ("200", "ok\n"));
    let (status, _) = get(port, "/nothing").expect("GET /nothing");
    assert_eq!(status, "404");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        page.contains("# HELP catchup_records_fetched_total"),
        "{page}"
    );
    // Per partition: no backlog (no split), the live lane caught up with the log end.
    for gauge in [
        "catchup_partition_backlog_offsets",
        "catchup_partition_live_lag_offsets",
        "catchup_partition_live_lag_seconds",
    ] {
        let line = page
            .lines()
            .find(|line| line.starts_with(&format!("{gauge}{{")))
            .unwrap_or_else(|| panic!("no {gauge} in:\n{page}"));
        assert!(
            line.contains(&format!("topic=\"{topic}\"")) && line.contains("partition=\"0\""),
            "{line}"
        );
        assert!(line.ends_with(" 0"), "{line}");
    }
    // Time to fresh is a histogram with buckets, not a summary.
    assert!(
        page.contains("# TYPE catchup_time_to_first_fresh_seconds histogram")
            && page.contains("catchup_time_to_first_fresh_seconds_bucket{"),
        "{page}"
    );
}

/// The body of `GET /metrics` on 127.0.0.1:`port`.
fn scrape(port: u16) -> std::io::Result<String> {
    get(port, "/metrics").map(|(_, body)| body)
}

/// The status code and body of `GET path` on 127.0.0.1:`port` (plain HTTP/1.0).
fn get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
