//! `catchup run --exec`: records handed to a long-running command in batches, acknowledged
//! only when it answers `ok`; a command that dies is started again and the batch sent again;
//! a poison record stops the run or, with `--on-failure skip`, costs only itself;
//! `--max-records`.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::cli::{sink_lines, wait_with_deadline};
use support::{Kafka, unique};

const WAIT: Duration = Duration::from_secs(120);

/// Appends every record line to `out.jsonl` in the working directory and answers `ok N` at
/// the end of batch N; a batch with a record at `offset` 42 is answered `fail N poison`
/// (when `POISON` is set), every batch is (when `FAIL_ALL` is set); the second batch kills
/// the command once (when `CRASH_ONCE` is set, leaving `crashed` behind).
const COMMAND: &str = r#"batches=0
pending=""
while IFS= read -r line; do
  case "$line" in
    '{"end_of_batch"'*)
      batches=$((batches + 1))
      n=${line#*:}; n=${n%%,*}
      if [ -n "$CRASH_ONCE" ] && [ "$batches" = 2 ] && [ ! -e crashed ]; then
        touch crashed; exit 3
      fi
      if [ -n "$FAIL_ALL" ]; then
        echo "fail $n database down"
      elif [ -n "$POISON" ] && printf '%s' "$pending" | grep -q '"offset":42,'; then
        echo "fail $n poison"
      else
        printf '%s' "$pending" >> out.jsonl
        echo "ok $n"
      fi
      pending="" ;;
    *) pending="$pending$line
" ;;
  esac
done"#;

fn run(
    kafka: &Kafka,
    group: &str,
    topic: &str,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_catchup"));
    command
        .current_dir(dir)
        .args([
            "run",
            "--brokers",
            &kafka.bootstrap,
            "--group",
            group,
            "--topic",
            topic,
            "--buffer-dir",
            "buffer",
            "--exec",
            COMMAND,
            "--retry-backoff-ms",
            "50",
            "--exit-when-idle",
            "2",
            "--config",
            "session.timeout.ms=6000",
        ])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    wait_with_deadline(command.spawn().expect("spawn"), WAIT)
}

/// The (partition, offset) of every line the command kept.
fn kept(dir: &Path) -> Vec<(i64, i64)> {
    sink_lines(&dir.join("out.jsonl"))
        .iter()
        .map(|line| {
            (
                line["partition"].as_i64().unwrap_or(-1),
                line["offset"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_reaches_the_command_and_a_dead_command_is_started_again() {
    let kafka = Kafka::connect();
    let topic = unique("cli-exec");
    kafka.create_topic(&topic, 2).await;
    kafka.produce(&topic, 2, 3000).await;
    let group = unique("cli-exec-group");
    let temp = tempfile::tempdir().expect("tempdir");
    // Batches of up to 500: the second one kills the command.
    let output = run(
        &kafka,
        &group,
        &topic,
        temp.path(),
        &[],
        &[("CRASH_ONCE", "1")],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        temp.path().join("crashed").exists(),
        "the command was killed once"
    );
    assert!(stderr.contains("the command exited with 3"), "{stderr}");
    let kept: BTreeSet<(i64, i64)> = kept(temp.path()).into_iter().collect();
    let expected: BTreeSet<(i64, i64)> = (0..2)
        .flat_map(|p| (0..1500).map(move |o| (p, o)))
        .collect();
    assert_eq!(kept, expected, "every record reached the command");
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        vec![Some(1500), Some(1500)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_stops_the_run_or_is_skipped_alone() {
    let kafka = Kafka::connect();
    let topic = unique("cli-exec-poison");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 100).await;
    let poison = [("POISON", "1")];

    // stop: exit 1, and the group never commits past the poison record.
    let group = unique("cli-exec-stop");
    let temp = tempfile::tempdir().expect("tempdir");
    let output = run(
        &kafka,
        &group,
        &topic,
        temp.path(),
        &["--retries", "1"],
        &poison,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--on-failure stop"), "{stderr}");
    let committed = kafka.committed(&group, &topic, 1)[0];
    assert!(
        committed.is_none_or(|offset| offset <= 42),
        "committed {committed:?}"
    );
    assert!(!kept(temp.path()).contains(&(0, 42)));

    // skip: only the poison record is left out, named on stderr; the rest is committed.
    let group = unique("cli-exec-skip");
    let temp = tempfile::tempdir().expect("tempdir");
    let output = run(
        &kafka,
        &group,
        &topic,
        temp.path(),
        &["--retries", "1", "--on-failure", "skip"],
        &poison,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("skipped {topic}/0@42")),
        "{stderr}"
    );
    assert!(stderr.contains("(1 skipped"), "{stderr}");
    let kept: BTreeSet<i64> = kept(temp.path())
        .into_iter()
        .map(|(_, offset)| offset)
        .collect();
    let expected: BTreeSet<i64> = (0..100).filter(|offset| *offset != 42).collect();
    assert_eq!(kept, expected);
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(100)]);
}

/// `skip` skips what the command judges poison, not an outage: a command that fails every
/// record stops the run, and nothing is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_does_not_skip_through_an_outage() {
    let kafka = Kafka::connect();
    let topic = unique("cli-exec-outage");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 20).await;
    let group = unique("cli-exec-outage-group");
    let temp = tempfile::tempdir().expect("tempdir");
    let output = run(
        &kafka,
        &group,
        &topic,
        temp.path(),
        &["--retries", "0", "--on-failure", "skip"],
        &[("FAIL_ALL", "1")],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the command is failing, not a record"),
        "{stderr}"
    );
    assert!(!stderr.contains("skipped"), "{stderr}");
    assert_eq!(kafka.committed(&group, &topic, 1), vec![None]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_records_stops_after_that_many() {
    let kafka = Kafka::connect();
    let topic = unique("cli-exec-max");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 1000).await;
    let group = unique("cli-exec-max-group");
    let temp = tempfile::tempdir().expect("tempdir");
    let output = run(
        &kafka,
        &group,
        &topic,
        temp.path(),
        &["--max-records", "150"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("processed 150 record(s)"), "{stderr}");
    assert_eq!(kept(temp.path()).len(), 150);
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(150)]);
}
