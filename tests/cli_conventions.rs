//! The command line as people drive kcat and friends: connection settings from the
//! environment, rdkafka properties from a file (secrets stay off the command line), the
//! sink on stdout with `--sink -`, the record schema `dump` prints, and shell completions.

mod support;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::cli::wait_with_deadline;
use support::{Backlog, Kafka};

fn catchup() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_catchup"));
    // Only what each test sets: the suite's own CATCHUP_BROKERS must not leak in.
    command
        .env_remove("CATCHUP_BROKERS")
        .env_remove("CATCHUP_GROUP")
        .env_remove("CATCHUP_CONFIG");
    command
}

/// The fields of a record in `dump` and in the sink (see the README).
const SCHEMA: [&str; 9] = [
    "topic",
    "partition",
    "lane",
    "offset",
    "timestamp",
    "timestamp_type",
    "key",
    "value",
    "headers",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_config_file_and_sink_on_stdout() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("cli-conventions", 1, 50).await;
    let temp = tempfile::tempdir().expect("tempdir");
    let properties = temp.path().join("client.properties");
    std::fs::write(
        &properties,
        "# connection settings, kept off the command line\n\nsession.timeout.ms = 6000\nclient.id=cli-conventions\n",
    )
    .expect("write properties");

    let child = catchup()
        .env("CATCHUP_BROKERS", &kafka.bootstrap)
        .env("CATCHUP_GROUP", &group)
        .env(
            "CATCHUP_CONFIG",
            "client.rack=rack-1\nfetch.wait.max.ms=100",
        )
        .args([
            "run",
            "--topic",
            &topic,
            "--buffer-dir",
            &temp.path().join("buffer").display().to_string(),
            "--config-file",
            &properties.display().to_string(),
            "--sink",
            "-",
            "--exit-when-idle",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = wait_with_deadline(child, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr: {stderr}");
    let lines = support::cli::stdout_lines(&output);
    let offsets: BTreeSet<i64> = lines.iter().filter_map(|l| l["offset"].as_i64()).collect();
    assert_eq!(offsets, (0..50).collect(), "every record, on stdout");
    for line in &lines {
        let fields: BTreeSet<&str> = line
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        let expected: BTreeSet<&str> = SCHEMA
            .into_iter()
            .chain(["assignment", "processed_at_ms"])
            .collect();
        assert_eq!(fields, expected, "{line}");
        assert_eq!(line["timestamp_type"], "create_time", "{line}");
    }
    assert!(stderr.contains("processed 50 record(s)"), "{stderr}");
    assert_eq!(kafka.committed(&group, &topic, 1), [Some(50)]);
}

/// Every connection flag has an environment variable: `CATCHUP_CONFIG` holds `--config`
/// properties, one per line, checked as strictly.
#[test]
fn config_properties_from_the_environment_are_checked() {
    let temp = tempfile::tempdir().expect("tempdir");
    let output = catchup()
        .env("CATCHUP_BROKERS", "127.0.0.1:1")
        .env("CATCHUP_GROUP", "g")
        .env("CATCHUP_CONFIG", "client.rack=rack-1\nnovalue")
        .args(["run", "--topic", "t", "--discard", "--buffer-dir"])
        .arg(temp.path().join("buffer"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("novalue"), "{stderr}");
    assert!(!temp.path().join("buffer").exists(), "nothing was started");
}

/// An empty `CATCHUP_CONFIG`, or one ending in a newline (as a here-document writes it), sets
/// nothing more: the run starts (and gives up on a broker that is not there), where it exited
/// 2 with "invalid value ''" before.
#[test]
fn blank_config_lines_from_the_environment_set_nothing() {
    for config in ["", "client.rack=rack-1\n", "\nclient.rack=rack-1\n\n"] {
        let temp = tempfile::tempdir().expect("tempdir");
        let output = catchup()
            .env("CATCHUP_BROKERS", "127.0.0.1:1")
            .env("CATCHUP_GROUP", "g")
            .env("CATCHUP_CONFIG", config)
            .args(["run", "--topic", "t", "--discard", "--connect-timeout", "1"])
            .arg("--buffer-dir")
            .arg(temp.path().join("buffer"))
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{config:?}: {stderr}");
        assert!(
            stderr.contains("cannot reach the brokers"),
            "{config:?}: {stderr}"
        );
    }
}

#[test]
fn a_bad_config_file_is_usage_naming_the_line() {
    let temp = tempfile::tempdir().expect("tempdir");
    let properties = temp.path().join("bad.properties");
    std::fs::write(
        &properties,
        "# fine\nsecurity.protocol=PLAINTEXT\nno equals sign here\n",
    )
    .expect("write");
    let output = catchup()
        .args([
            "run",
            "--brokers",
            "127.0.0.1:1",
            "--group",
            "g",
            "--topic",
            "t",
            "--buffer-dir",
            &temp.path().join("buffer").display().to_string(),
            "--config-file",
            &properties.display().to_string(),
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{} line 3", properties.display())),
        "{stderr}"
    );
    assert!(!temp.path().join("buffer").exists(), "nothing was started");
}

#[test]
fn shell_completions() {
    for (shell, marker) in [
        ("bash", "_catchup()"),
        ("zsh", "#compdef catchup"),
        ("fish", "complete -c catchup"),
    ] {
        let output = catchup()
            .args(["completions", shell])
            .output()
            .expect("run");
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&output.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(
            script.contains("buffer-dir"),
            "{shell} completes run's flags"
        );
    }
}
