//! `catchup run`: the reference consumer with its JSON-lines sink, idle exit, SIGTERM, and
//! bad usage.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::cli::{sink_lines, wait_with_deadline};
use support::{Kafka, unique};

fn catchup() -> Command {
    Command::new(env!("CARGO_BIN_EXE_catchup"))
}

fn run_args(kafka: &Kafka, group: &str, topic: &str, dir: &Path, sink: &Path) -> Vec<String> {
    [
        "run",
        "--brokers",
        &kafka.bootstrap,
        "--group",
        group,
        "--topic",
        topic,
        "--buffer-dir",
        &dir.display().to_string(),
        "--sink",
        &sink.display().to_string(),
        "--min-lag",
        "50",
        "--config",
        "session.timeout.ms=6000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_processes_everything_into_the_sink_and_exits_when_idle() {
    let kafka = Kafka::connect();
    let topic = unique("cli-run");
    kafka.create_topic(&topic, 2).await;
    kafka.produce(&topic, 2, 400).await;
    let group = unique("cli-run-group");
    kafka.commit_as_operator(&group, &topic, &[0, 100]);
    let temp = tempfile::tempdir().expect("tempdir");
    let sink = temp.path().join("sink.jsonl");
    let mut args = run_args(&kafka, &group, &topic, &temp.path().join("buffer"), &sink);
    args.extend(
        [
            "--mode",
            "concurrent",
            "--exit-when-idle",
            "2",
            "--process-us",
            "50",
        ]
        .map(String::from),
    );
    let child = catchup()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = wait_with_deadline(child, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "ERROR lines in a healthy run: {errors:#?}"
    );

    let lines = sink_lines(&sink);
    let seen: BTreeSet<(i64, i64)> = lines
        .iter()
        .map(|l| {
            (
                l["partition"].as_i64().unwrap_or(-1),
                l["offset"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let expected: BTreeSet<(i64, i64)> = (0..200)
        .map(|o| (0, o))
        .chain((100..200).map(|o| (1, o)))
        .collect();
    assert_eq!(seen, expected, "every record from the committed offsets on");
    for line in &lines {
        assert!(
            ["catchup", "live", "plain"].contains(&line["lane"].as_str().unwrap_or("")),
            "{line}"
        );
        assert!(
            line["value"]
                .as_str()
                .is_some_and(|v| v.starts_with(&topic)),
            "{line}"
        );
        assert!(
            line["processed_at_ms"]
                .as_u64()
                .is_some_and(|t| t > 1_700_000_000_000),
            "{line}"
        );
    }
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        vec![Some(200), Some(200)],
        "committed and merged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_what_was_processed_and_exits_0() {
    let kafka = Kafka::connect();
    let topic = unique("cli-sigterm");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 5000).await;
    let group = unique("cli-sigterm-group");
    let temp = tempfile::tempdir().expect("tempdir");
    let sink = temp.path().join("sink.jsonl");
    let mut args = run_args(&kafka, &group, &topic, &temp.path().join("buffer"), &sink);
    args.extend(["--process-us", "2000"].map(String::from)); // slow: SIGTERM lands mid-backlog
    let child = catchup()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Complete lines only: the child may be in the middle of writing one.
    let written =
        || std::fs::read(&sink).map_or(0, |bytes| bytes.iter().filter(|&&b| b == b'\n').count());
    while written() < 200 {
        assert!(Instant::now() < deadline, "nothing processed within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = wait_with_deadline(child, Duration::from_secs(60));
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let processed = sink_lines(&sink).len() as i64;
    assert!(processed < 5000, "SIGTERM should have stopped it early");
    let committed = kafka.committed(&group, &topic, 1)[0].expect("a commit on close");
    assert_eq!(
        committed, processed,
        "everything written to the sink, and nothing more, is committed"
    );
}

#[test]
fn bad_usage_exits_2() {
    let base = [
        "run",
        "--brokers",
        "127.0.0.1:1",
        "--group",
        "g",
        "--topic",
        "t",
        "--buffer-dir",
        "/tmp/x",
    ];
    let with = |extra: &[&'static str]| base.iter().chain(extra).copied().collect::<Vec<&str>>();
    let missing_group: Vec<&str> = base
        .iter()
        .copied()
        .filter(|a| *a != "--group" && *a != "g")
        .collect();
    for args in [
        missing_group,
        // No output: it would commit records it wrote nowhere.
        base.to_vec(),
        with(&["--sink", "-", "--exec", "cat"]),
        with(&["--config", "novalue"]),
        with(&["--mode", "fast"]),
        vec!["frobnicate"],
    ] {
        let output = catchup().args(&args).output().expect("run");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
