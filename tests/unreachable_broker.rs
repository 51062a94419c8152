//! Brokers that cannot be reached: said once, not at every retry of each client, and
//! `catchup run --connect-timeout N` gives up with exit 1 after N seconds (before, it printed
//! four ERROR lines every half second, three clients repeating each other, and never exited).

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::cli::wait_with_deadline;

#[test]
fn connect_timeout_exits_1_after_one_warn_line() {
    let temp = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_catchup"))
        .env_remove("CATCHUP_BROKERS")
        .env_remove("RUST_LOG")
        .args([
            "run",
            "--brokers",
            "127.0.0.1:1",
            "--group",
            "g",
            "--topic",
            "t",
            "--discard",
            "--buffer-dir",
            &temp.path().join("buffer").display().to_string(),
            "--connect-timeout",
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = wait_with_deadline(child, Duration::from_secs(60));
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let warnings: Vec<&&str> = lines.iter().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one WARN line, naming the broker: {stderr}"
    );
    assert!(warnings[0].contains("127.0.0.1:1"), "{stderr}");
    assert!(!stderr.contains("ERROR"), "no ERROR lines: {stderr}");
    assert_eq!(
        lines.last().copied(),
        Some("catchup: cannot reach the brokers (127.0.0.1:1) for 3 s"),
        "{stderr}"
    );
}
