//! A broker of the test's own, for faults the shared test broker must not see (restarts,
//! downtime): `scripts/kafka` on a fresh state directory.

use std::path::Path;
use std::process::{Command, Stdio};

/// A single-node broker only this test uses: `scripts/kafka` with a fresh temporary directory
/// as `CATCHUP_KAFKA_DIR` and `CATCHUP_BROKERS` removed, so it is never the shared broker.
/// Connect with [`Kafka::connect_to`](super::Kafka::connect_to)`(broker.bootstrap())`.
/// Stopped when dropped, also when the test panics (then the end of its log is printed).
pub struct PrivateBroker {
    dir: tempfile::TempDir,
    bootstrap: String,
}

impl PrivateBroker {
    /// Starts a broker on a fresh state directory; blocks for its start-up (seconds).
    pub fn new() -> Self {
        // The guard exists before the start, so a half-started broker is stopped too.
        let mut broker = Self {
            dir: tempfile::tempdir().expect("broker state directory"),
            bootstrap: String::new(),
        };
        broker.bootstrap =
            kafka_script(broker.dir.path(), "start").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            broker.bootstrap.starts_with("127.0.0.1:"),
            "scripts/kafka start printed {:?}, not a bootstrap address",
            broker.bootstrap
        );
        broker
    }

    /// `host:port`; the same across restarts.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The state directory (data, `broker.log`).
    pub fn state_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the broker (a controlled shutdown) and starts it again on the same data and port.
    pub async fn restart(&self) {
        self.run("restart").await;
    }

    /// Stops the broker; [`PrivateBroker::start`] brings it back.
    pub async fn stop(&self) {
        self.run("stop").await;
    }

    /// Starts the stopped broker again on the same data and port.
    pub async fn start(&self) {
        self.run("start").await;
    }

    /// Runs `scripts/kafka action` off the async workers; checks the broker kept its port.
    async fn run(&self, action: &'static str) {
        let dir = self.dir.path().to_owned();
        let printed = tokio::task::spawn_blocking(move || kafka_script(&dir, action))
            .await
            .expect("scripts/kafka task")
            .unwrap_or_else(|e| panic!("{e}"));
        if action != "stop" {
            assert_eq!(printed, self.bootstrap, "the broker keeps its port");
        }
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log =
                std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- last lines of the private broker's log ---\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
        if let Err(err) = kafka_script(self.dir.path(), "stop") {
            eprintln!("stopping the private broker: {err}");
        }
    }
}

/// Runs `scripts/kafka action` for the broker in `dir` (never the shared one), passes its
/// messages on to stderr and returns the last line of its stdout (the bootstrap address after
/// `start` and `restart`).
fn kafka_script(dir: &Path, action: &str) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka");
    let output = Command::new(&script)
        .arg(action)
        .env("CATCHUP_KAFKA_DIR", dir)
        .env_remove("CATCHUP_BROKERS")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {} {action}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "scripts/kafka {action} failed ({}):\n{stdout}\n{stderr}",
            output.status
        ));
    }
    for line in stderr.lines() {
        eprintln!("[private broker {}] {line}", dir.display());
    }
    Ok(stdout.lines().last().unwrap_or_default().trim().to_owned())
}
