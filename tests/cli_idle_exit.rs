//! `catchup run --exit-when-idle` waits for its group before it calls anything idle: a
//! restart right after a SIGKILL (the dead member holds the partitions until its session
//! times out) still processes the whole backlog; a group with nothing to do still exits.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::cli::{sink_lines, wait_with_deadline};
use support::{Backlog, Kafka, unique};

fn sink_offsets(sink: &Path) -> Vec<i64> {
    sink_lines(sink)
        .iter()
        .map(|line| line["offset"].as_i64().expect("an offset"))
        .collect()
}

const SESSION_TIMEOUT: &str = "session.timeout.ms=8000";

fn run(kafka: &Kafka, group: &str, topic: &str, dir: &Path, sink: &Path, extra: &[&str]) -> Child {
    let dir = dir.display().to_string();
    let sink = sink.display().to_string();
    let mut args = vec![
        "run",
        "--brokers",
        &kafka.bootstrap,
        "--group",
        group,
        "--topic",
        topic,
        "--buffer-dir",
        &dir,
        "--sink",
        &sink,
        "--mode",
        "off",
        "--config",
        SESSION_TIMEOUT,
    ];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn catchup run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_right_after_a_sigkill_processes_the_backlog() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("idle-restart", 1, 2_000).await;
    let temp = tempfile::tempdir().expect("tempdir");

    // A slow first consumer, killed once it has processed something.
    let first_sink = temp.path().join("first.jsonl");
    let mut first = run(
        &kafka,
        &group,
        &topic,
        &temp.path().join("first"),
        &first_sink,
        &["--process-us", "2000"],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink_offsets(&first_sink).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first consumer processed nothing"
        );
        assert!(
            first.try_wait().expect("try_wait").is_none(),
            "the first consumer exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    kafka.produce_from(&topic, 1, 2_000, 500).await;

    // Restarted at once with a short idle time: the dead member keeps the partition for up to
    // its session timeout (8 s), far longer than the idle time.
    let second_sink = temp.path().join("second.jsonl");
    let second = run(
        &kafka,
        &group,
        &topic,
        &temp.path().join("second"),
        &second_sink,
        &["--exit-when-idle", "2"],
    );
    let output = wait_with_deadline(second, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}: {stderr}",
        output.status
    );
    assert!(
        stderr.contains(&format!("waiting for group {group}")),
        "no word about waiting for the group: {stderr}"
    );
    let processed: BTreeSet<i64> = sink_offsets(&first_sink)
        .into_iter()
        .chain(sink_offsets(&second_sink))
        .collect();
    let missing: Vec<i64> = (0..2_500).filter(|o| !processed.contains(o)).collect();
    assert!(
        missing.is_empty(),
        "{} offsets never processed, first {:?}",
        missing.len(),
        missing.first()
    );
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(2_500)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_nothing_to_do_still_exits() {
    let kafka = Kafka::connect();
    let topic = unique("idle-nothing");
    kafka.create_topic(&topic, 2).await;
    kafka.produce(&topic, 2, 200).await;
    let group = unique("idle-nothing-group");
    let ends: Vec<i64> = kafka
        .watermarks(&topic, 2)
        .iter()
        .map(|(_, high)| *high)
        .collect();
    kafka.commit_as_operator(&group, &topic, &ends);
    let temp = tempfile::tempdir().expect("tempdir");
    let sink = temp.path().join("sink.jsonl");
    let child = run(
        &kafka,
        &group,
        &topic,
        &temp.path().join("buffer"),
        &sink,
        &["--exit-when-idle", "1"],
    );
    let output = wait_with_deadline(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}: {stderr}",
        output.status
    );
    assert!(stderr.contains("processed 0 record(s)"), "{stderr}");
    assert!(sink_offsets(&sink).is_empty());
}
