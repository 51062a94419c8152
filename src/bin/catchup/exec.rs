//! The `--exec` sink of `catchup run`: records go to a long-running command, in batches, and a
//! batch is acknowledged only once the command answers for it (`docs/cli.md`, "The exec
//! protocol").
//!
//! To the command's stdin, per batch: one JSON line per record (the schema of the file
//! sink), then `{"end_of_batch":N,"records":K}`. From its stdout, one line per batch, naming
//! it: `ok N` (every record of batch N is processed) or `fail N` with an optional reason.
//! Anything else — another batch's number, the command exiting, no answer within the
//! timeout — means the command itself is failing: it is stopped (its whole process group)
//! and started again. A failed batch is sent again after a backoff (0.5 s doubling to 30 s),
//! up to the retries allowed; then the failure policy decides. `stop` ends the run with
//! nothing of the batch acknowledged. `skip` sends its records one at a time and skips those
//! the command answers `fail` for while it processes others — a command that fails every
//! record, or fails itself, stops the run instead: an outage must not be skipped through.

use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Send the batch's records one at a time and skip those the command still answers
    /// `fail` for (reported on stderr, acknowledged).
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
    /// Raised by SIGINT or SIGTERM: whatever the command is doing, the batch is given up
    /// (not acknowledged) at once.
    pub stop: Arc<AtomicBool>,
}

/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often a wait looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Why an attempt did not go through.
#[derive(Debug, Clone)]
enum Attempt {
    /// The command answered `fail` for the batch: it judged the records.
    Failed(String),
    /// The command itself failed (exited, hung, answered out of protocol).
    Broken(String),
    /// A signal asked the run to stop.
    Stopped,
}

impl Attempt {
    fn reason(&self) -> &str {
        match self {
            Attempt::Failed(reason) | Attempt::Broken(reason) => reason,
            Attempt::Stopped => "stopped by a signal",
        }
    }
}

/// How a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handed {
    /// Every record processed or (under `skip`) skipped: acknowledge the batch.
    Done,
    /// A signal stopped the run first: acknowledge nothing.
    Stopped,
}

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

    fn start(&mut self) -> Result<&mut Running, Attempt> {
        if self.running.is_none() {
            let mut child = Command::new("sh")
                .arg("-c")
                .arg(&self.options.command)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                // A group of its own: stopping it reaches whatever it started, and a Ctrl-C
                // meant for catchup does not kill it mid-batch.
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| {
                    Attempt::Broken(format!("cannot start `{}`: {e}", self.options.command))
                })?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err(Attempt::Broken(
                    "the command's stdin or stdout is not a pipe".into(),
                ));
            };
            self.running = Some(Running {
                child,
                stdin,
                answers: BufReader::new(stdout).lines(),
            });
        }
        self.running
            .as_mut()
            .ok_or_else(|| Attempt::Broken("the command is not running".into()))
    }

    /// Stops the command and everything in its process group (started again for the next
    /// attempt).
    async fn kill(&mut self) {
        if let Some(mut running) = self.running.take() {
            kill_group(&running.child);
            let _ = running.child.kill().await;
        }
    }

    /// Waits until the stop flag is raised.
    async fn stopped(stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(STOP_CHECK).await;
        }
    }

    /// One attempt: the lines and the end of the batch out, its answer back.
    async fn attempt(&mut self, lines: &[String]) -> Result<(), Attempt> {
        self.batches += 1;
        let batch = self.batches;
        let end = serde_json::json!({"end_of_batch": batch, "records": lines.len()});
        let (timeout, stop) = (self.options.timeout, self.options.stop.clone());
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
                    Ok(None) => {
                        let status = running.child.wait().await.ok();
                        return Err(match status {
                            Some(status) => match (status.code(), status.signal()) {
                                (Some(code), _) => format!("the command exited with {code}"),
                                (_, Some(signal)) => {
                                    format!("the command was killed by signal {signal}")
                                }
                                _ => "the command exited".to_owned(),
                            },
                            None => "the command exited".to_owned(),
                        });
                    }
                    Err(e) => return Err(format!("reading the command's answer: {e}")),
                }
            }
        };
        let answer = tokio::select! {
            answered = tokio::time::timeout(timeout, exchange) => match answered {
                Ok(answered) => Some(answered),
                Err(_) => Some(Err(format!("no answer within {} s", timeout.as_secs()))),
            },
            () = Self::stopped(stop) => None,
        };
        let Some(answer) = answer else {
            self.kill().await;
            return Err(Attempt::Stopped);
        };
        let verdict = answer.map_err(Attempt::Broken).and_then(|answer| {
            let mut words = answer.split_whitespace();
            let (word, number) = (words.next(), words.next());
            let rest: Vec<&str> = words.collect();
            match (word, number.and_then(|n| n.parse::<u64>().ok())) {
                (Some("ok"), Some(n)) if n == batch && rest.is_empty() => Ok(()),
                (Some("fail"), Some(n)) if n == batch => Err(Attempt::Failed(if rest.is_empty() {
                    "the command answered fail".to_owned()
                } else {
                    format!("the command answered fail: {}", rest.join(" "))
                })),
                _ => Err(Attempt::Broken(format!(
                    "the command answered {answer:?} for batch {batch} (expected `ok {batch}` or `fail {batch} [reason]`)"
                ))),
            }
        });
        if let Err(Attempt::Broken(_)) = &verdict {
            self.kill().await;
        }
        verdict
    }

    /// Sends `lines` until the command takes them, at most `retries` times more, waiting
    /// between attempts; why the last attempt failed when none went through.
    async fn with_retries(&mut self, lines: &[String]) -> Result<(), Attempt> {
        let mut wait = self.options.backoff;
        let mut attempt = 0;
        loop {
            let failure = match self.attempt(lines).await {
                Ok(()) => return Ok(()),
                Err(Attempt::Stopped) => return Err(Attempt::Stopped),
                Err(failure) => failure,
            };
            if attempt >= self.options.retries {
                return Err(failure);
            }
            attempt += 1;
            eprintln!(
                "catchup: --exec batch of {} record(s) failed ({}); attempt {} of {} in {:.1} s",
                lines.len(),
                failure.reason(),
                attempt + 1,
                self.options.retries + 1,
                wait.as_secs_f64()
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = Self::stopped(self.options.stop.clone()) => return Err(Attempt::Stopped),
            }
            wait = (wait * 2).min(MAX_BACKOFF);
        }
    }

    /// Hands `batch` (rendered as `lines`, one per delivery) to the command. `Done` once every
    /// record is processed or, under `skip`, skipped; an error ends the run with nothing of
    /// the batch acknowledged.
    pub async fn deliver(
        &mut self,
        batch: &[Delivery],
        lines: &[String],
    ) -> Result<Handed, Failure> {
        let attempts = self.options.retries + 1;
        let failure = match self.with_retries(lines).await {
            Ok(()) => return Ok(Handed::Done),
            Err(Attempt::Stopped) => return Ok(Handed::Stopped),
            Err(failure) => failure,
        };
        let give_up = |why: &str| {
            Failure::Runtime(format!(
                "--exec: a batch of {} record(s) from {} failed {attempts} time(s), last: {}; {why}: nothing from it on is committed",
                batch.len(),
                describe(batch.first()),
                failure.reason(),
            ))
        };
        match (self.options.on_failure, &failure) {
            (OnFailure::Stop, _) => Err(give_up("stopping (--on-failure stop)")),
            (OnFailure::Skip, Attempt::Broken(_)) => Err(give_up(
                "the command itself fails, and --on-failure skip skips only records it answers fail for; stopping",
            )),
            (OnFailure::Skip, _) => {
                eprintln!(
                    "catchup: --exec batch of {} record(s) failed {attempts} time(s) ({}); sending its records one at a time",
                    batch.len(),
                    failure.reason()
                );
                let mut refused = Vec::new();
                let mut processed = 0;
                for (delivery, line) in batch.iter().zip(lines) {
                    match self.with_retries(std::slice::from_ref(line)).await {
                        Ok(()) => processed += 1,
                        Err(Attempt::Stopped) => return Ok(Handed::Stopped),
                        Err(Attempt::Failed(reason)) => refused.push((delivery, reason)),
                        Err(Attempt::Broken(reason)) => {
                            return Err(Failure::Runtime(format!(
                                "--exec: the command failed ({reason}) while its batch from {} was sent one record at a time; stopping: nothing from it on is committed",
                                describe(batch.first())
                            )));
                        }
                    }
                }
                // A command that fails every record is down, not fed poison: skipping would
                // commit records nothing processed.
                if processed == 0 {
                    return Err(give_up(
                        "every record failed on its own as well, so the command is failing, not a record; stopping",
                    ));
                }
                for (delivery, reason) in refused {
                    self.skipped += 1;
                    eprintln!(
                        "catchup: --exec skipped {} ({reason}; --on-failure skip)",
                        describe(Some(delivery))
                    );
                }
                Ok(Handed::Done)
            }
        }
    }

    /// Closes the command's stdin and waits (at most the timeout) for it to exit.
    pub async fn finish(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        let Running {
            mut child, stdin, ..
        } = running;
        drop(stdin);
        if tokio::time::timeout(self.options.timeout, child.wait())
            .await
            .is_err()
        {
            kill_group(&child);
            let _ = child.kill().await;
        }
    }
}

/// SIGKILL to the process group `child` leads (it was spawned into a group of its own).
fn kill_group(child: &Child) {
    if let Some(group) = child.id().and_then(|id| i32::try_from(id).ok()) {
        // SAFETY: a plain system call, on the group the child leads.
        unsafe {
            libc::killpg(group, libc::SIGKILL);
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
