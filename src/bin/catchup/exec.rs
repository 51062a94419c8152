//! The `--exec` sink of `catchup run`: records go to a long-running command, in batches, and a
//! batch is acknowledged only once the command answers for it (`docs/cli.md`, "The exec
//! protocol").
//!
//! To the command's stdin, per batch: one JSON line per record (the schema of the file
//! sink), then `{"end_of_batch":N,"records":K}`. From its stdout, one line per batch: `ok`
//! (every record of the batch is processed) or `fail` with an optional reason. Anything else,
//! the command exiting, or no answer within the timeout is a failure too, and the command is
//! started again. A failed batch is sent again after a backoff (0.5 s doubling to 30 s), up to
//! the retries allowed; then the failure policy decides: `stop` ends the run with nothing of
//! the batch acknowledged, `skip` sends its records one at a time and skips only those that
//! still fail — reported, counted, acknowledged.

use std::process::Stdio;
use std::time::Duration;

use catchup::Delivery;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::Failure;

/// What to do with a batch whose every attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnFailure {
    /// End the run (exit 1): nothing of the batch is acknowledged, so the next run starts
    /// with it.
    Stop,
    /// Send the batch's records one at a time and skip those that still fail (reported on
    /// stderr, acknowledged).
    Skip,
}

/// How the command is run and retried.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// The command, run with `sh -c`.
    pub command: String,
    /// How long an answer may take.
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: u32,
    pub on_failure: OnFailure,
    /// The first wait before an attempt again (doubling, at most `MAX_BACKOFF`).
    pub backoff: Duration,
}

/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The command while it runs.
struct Running {
    child: Child,
    stdin: ChildStdin,
    answers: Lines<BufReader<ChildStdout>>,
}

/// The sink: the command (started on first use, again after it failed) and its batches.
pub struct ExecSink {
    options: ExecOptions,
    running: Option<Running>,
    /// Batches sent so far (every attempt is a batch of its own).
    batches: u64,
    /// Records skipped under `--on-failure skip`.
    pub skipped: u64,
}

impl ExecSink {
    pub fn new(options: ExecOptions) -> Self {
        Self {
            options,
            running: None,
            batches: 0,
            skipped: 0,
        }
    }

    fn start(&mut self) -> Result<&mut Running, String> {
        if self.running.is_none() {
            let mut child = Command::new("sh")
                .arg("-c")
                .arg(&self.options.command)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("cannot start `{}`: {e}", self.options.command))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err("the command's stdin or stdout is not a pipe".into());
            };
            self.running = Some(Running {
                child,
                stdin,
                answers: BufReader::new(stdout).lines(),
            });
        }
        self.running
            .as_mut()
            .ok_or_else(|| "the command is not running".to_owned())
    }

    /// Stops the command (it is started again for the next attempt).
    async fn kill(&mut self) {
        if let Some(mut running) = self.running.take() {
            let _ = running.child.kill().await;
        }
    }

    /// One attempt: the lines and the end of the batch out, one answer back.
    async fn attempt(&mut self, lines: &[String]) -> Result<(), String> {
        self.batches += 1;
        let end = serde_json::json!({"end_of_batch": self.batches, "records": lines.len()});
        let timeout = self.options.timeout;
        let running = self.start()?;
        let exchange = async {
            let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
            for line in lines {
                text.push_str(line);
                text.push('\n');
            }
            text.push_str(&end.to_string());
            text.push('\n');
            running
                .stdin
                .write_all(text.as_bytes())
                .await
                .map_err(|e| format!("writing to the command: {e}"))?;
            running
                .stdin
                .flush()
                .await
                .map_err(|e| format!("writing to the command: {e}"))?;
            loop {
                match running.answers.next_line().await {
                    Ok(Some(answer)) if answer.trim().is_empty() => continue,
                    Ok(Some(answer)) => return Ok(answer),
                    Ok(None) => return Err("the command exited".to_owned()),
                    Err(e) => return Err(format!("reading the command's answer: {e}")),
                }
            }
        };
        let answer = match tokio::time::timeout(timeout, exchange).await {
            Ok(answered) => answered,
            Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
        };
        match answer.as_deref().map(str::trim).map_err(String::clone) {
            Ok("ok") => Ok(()),
            Ok(failed) if failed == "fail" || failed.starts_with("fail ") => {
                let reason = failed.trim_start_matches("fail").trim();
                Err(if reason.is_empty() {
                    "the command answered fail".to_owned()
                } else {
                    format!("the command answered fail: {reason}")
                })
            }
            Ok(other) => {
                self.kill().await;
                Err(format!(
                    "the command answered {other:?} (expected `ok` or `fail [reason]`); started again"
                ))
            }
            Err(reason) => {
                self.kill().await;
                Err(reason)
            }
        }
    }

    /// Sends `lines` until the command takes them, at most `retries` times more, waiting
    /// between attempts; the last failure's reason when it never does.
    async fn with_retries(&mut self, lines: &[String]) -> Result<(), String> {
        let mut wait = self.options.backoff;
        let mut attempt = 0;
        loop {
            let reason = match self.attempt(lines).await {
                Ok(()) => return Ok(()),
                Err(reason) => reason,
            };
            if attempt >= self.options.retries {
                return Err(reason);
            }
            attempt += 1;
            eprintln!(
                "catchup: --exec batch of {} record(s) failed ({reason}); attempt {} of {} in {:.1} s",
                lines.len(),
                attempt + 1,
                self.options.retries + 1,
                wait.as_secs_f64()
            );
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_BACKOFF);
        }
    }

    /// Hands `batch` (rendered as `lines`, one per delivery) to the command. `Ok` once every
    /// record is processed or, under `skip`, skipped; an error ends the run.
    pub async fn deliver(&mut self, batch: &[Delivery], lines: &[String]) -> Result<(), Failure> {
        let reason = match self.with_retries(lines).await {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        match self.options.on_failure {
            OnFailure::Stop => Err(Failure::Runtime(format!(
                "--exec: a batch of {} record(s) from {} failed {} time(s), last: {reason}; stopping (--on-failure stop): nothing from it on is committed",
                batch.len(),
                describe(batch.first()),
                self.options.retries + 1
            ))),
            OnFailure::Skip if batch.len() == 1 => {
                self.skip(&batch[0], &reason);
                Ok(())
            }
            OnFailure::Skip => {
                eprintln!(
                    "catchup: --exec batch of {} record(s) failed {} time(s) ({reason}); sending its records one at a time",
                    batch.len(),
                    self.options.retries + 1
                );
                for (delivery, line) in batch.iter().zip(lines) {
                    if let Err(reason) = self.with_retries(std::slice::from_ref(line)).await {
                        self.skip(delivery, &reason);
                    }
                }
                Ok(())
            }
        }
    }

    fn skip(&mut self, delivery: &Delivery, reason: &str) {
        self.skipped += 1;
        eprintln!(
            "catchup: --exec skipped {} ({reason}; --on-failure skip)",
            describe(Some(delivery))
        );
    }

    /// Closes the command's stdin and waits (at most `timeout`) for it to exit.
    pub async fn finish(&mut self) {
        if let Some(mut running) = self.running.take() {
            drop(running.stdin);
            if tokio::time::timeout(self.options.timeout, running.child.wait())
                .await
                .is_err()
            {
                let _ = running.child.kill().await;
            }
        }
    }
}

/// `topic/partition@offset` of a delivery.
fn describe(delivery: Option<&Delivery>) -> String {
    delivery.map_or_else(
        || "nothing".to_owned(),
        |d| format!("{}/{}@{}", d.topic, d.partition, d.offset),
    )
}
