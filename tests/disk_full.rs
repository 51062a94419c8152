//! A full disk. The buffer directory lives on a small filesystem of its own (a tmpfs mount:
//! the test needs root, as in CI, and skips with a message elsewhere).
//!
//! * With the free-space floor, `catchup run` says at start that the room above it is short of
//!   its budget, pauses fetching before the disk fills and says so once; once the backlog it
//!   buffered is processed (its live records wait behind the backlog) it fetches the backlog
//!   on below the floor; it stops within the deadline on SIGTERM with exit 0, and a second run
//!   after space was freed processes every record.
//! * With the floor disabled, the disk fills for real: sled fails the write, the run exits 1
//!   with a message naming the buffer instead of hanging, and after the filesystem grows a
//!   second run processes every record.
//!
//! Before, such a run stopped making progress after 500 records, logged nothing, and ignored
//! SIGTERM until SIGKILL.
//!
//! What fills the disk is what waits: fresh records, produced once the first run has split
//! its partitions, fetched by the live lanes while a run (`ordered`) that processes 500
//! records a second is still on the backlog (40 s of it). (A lane the reader can take reads
//! ahead only its read-ahead, at most half its share: a backlog alone, or live lanes whose
//! backlog is handed out, would stay in Kafka rather than fill the disk.)

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::cli::{sink_lines, wait_with_deadline};
use support::{Kafka, unique};

const PARTITIONS: i32 = 2;
const PER_PARTITION: usize = 40_000;
/// Produced before the first run starts: each partition's backlog, which splits it.
const BACKLOG: usize = 10_000;
const VALUE_BYTES: usize = 400;

/// A budget of 32 MiB (a live lane's share is 8 MiB while its partition catches up): the
/// fresh records (24 MB) are fetched while the slow first run processes its backlog, up to
/// 16 MiB of them, the memory tier holds 8 MiB, and what waits beyond (about 8 MB, which sled
/// writes as half as much again) goes to disk: more than the 8 MiB above the floor, and more
/// than the 12 MiB filesystem. (A larger budget spills larger bursts, which overshoot the
/// floor further.)
const WAITS_ON_DISK: [&str; 2] = ["--budget-mib", "32"];

/// A tmpfs mounted for the test, unmounted when dropped.
struct SmallFilesystem {
    dir: tempfile::TempDir,
}

impl SmallFilesystem {
    /// `None` (after saying why) where this process may not mount.
    fn mount(size_mib: u64) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::piped())
            .output();
        match status {
            Ok(output) if output.status.success() => Some(Self { dir }),
            Ok(output) => {
                eprintln!(
                    "SKIPPED: cannot mount a {size_mib} MiB tmpfs for the buffer ({}); this test needs root, as in CI",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                None
            }
            Err(err) => {
                eprintln!("SKIPPED: cannot run mount ({err}); this test needs root, as in CI");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn resize(&self, size_mib: u64) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size_mib}m")])
            .arg(self.path())
            .status()
            .expect("mount -o remount");
        assert!(status.success(), "resizing the tmpfs failed");
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Fills `path` with `mib` MiB of zeros.
fn filler(path: &Path, mib: usize) {
    std::fs::write(path, vec![0u8; mib << 20]).expect("writing the filler file");
}

/// Produces the records `offsets` of every partition, of `VALUE_BYTES` each.
async fn produce(kafka: &Kafka, topic: &str, offsets: std::ops::Range<usize>) {
    for partition in 0..PARTITIONS {
        let records: Vec<(String, String)> = offsets
            .clone()
            .map(|i| {
                (
                    format!("key-{i}"),
                    format!("{i:0>width$}", width = VALUE_BYTES),
                )
            })
            .collect();
        for chunk in records.chunks(2_000) {
            kafka.produce_keyed(topic, partition, chunk).await;
        }
    }
}

/// A `catchup run` with its stderr lines forwarded to a channel.
struct Run {
    child: Child,
    stderr: mpsc::Receiver<String>,
}

fn run(kafka: &Kafka, group: &str, topic: &str, dir: &Path, sink: &Path, extra: &[&str]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args(["run", "--brokers", &kafka.bootstrap, "--group", group])
        .args(["--topic", topic, "--mode", "ordered", "--min-lag", "500"])
        .arg("--buffer-dir")
        .arg(dir)
        .arg("--sink")
        .arg(sink)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn catchup run");
    let (lines, stderr) = mpsc::channel();
    let pipe = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    Run { child, stderr }
}

impl Run {
    /// Waits (bounded) for a stderr line containing `needle`; returns it.
    fn wait_for_line(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!(
                    "no stderr line with {needle:?} within {limit:?}; last lines:\n{}",
                    seen[seen.len().saturating_sub(20)..].join("\n")
                ),
            }
        }
    }

    /// Waits (bounded) for the exit; returns the status, how long it took, and the rest of
    /// stderr.
    fn wait(self, limit: Duration) -> (ExitStatus, Duration, String) {
        let started = Instant::now();
        let output = wait_with_deadline(self.child, limit);
        let took = started.elapsed();
        // The process is gone, but the forwarding thread may still hold its last lines (the
        // error a failed run ends with): taken until it hangs up at the pipe's end, not only
        // what arrived by now.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut rest = Vec::new();
        while let Ok(line) = self
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            rest.push(line);
        }
        (output.status, took, rest.join("\n"))
    }
}

/// Every (partition, offset) in the sinks.
fn processed(sinks: &[PathBuf]) -> BTreeSet<(i64, i64)> {
    sinks
        .iter()
        .flat_map(|sink| sink_lines(sink))
        .map(|line| {
            let field = |name: &str| line[name].as_i64().expect("a number");
            (field("partition"), field("offset"))
        })
        .collect()
}

/// A topic with a backlog of `BACKLOG` records a partition, and a group committed at its
/// start.
async fn topic_and_group(name: &str) -> (Kafka, String, String) {
    let kafka = Kafka::connect();
    let topic = unique(name);
    kafka.create_topic(&topic, PARTITIONS).await;
    produce(&kafka, &topic, 0..BACKLOG).await;
    let group = unique(&format!("{name}-group"));
    kafka.commit_as_operator(&group, &topic, &[0, 0]);
    (kafka, topic, group)
}

/// Once `first` processed its first record (its partitions are split at their log ends),
/// produces the rest of every partition: fresh records, for its live lanes.
async fn produce_fresh(kafka: &Kafka, topic: &str, first_sink: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink_lines(first_sink).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first run processed nothing within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    produce(kafka, topic, BACKLOG..PER_PARTITION).await;
}

fn every_offset() -> BTreeSet<(i64, i64)> {
    (0..PARTITIONS as i64)
        .flat_map(|p| (0..PER_PARTITION as i64).map(move |o| (p, o)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_floor_fetching_pauses_sigterm_exits_and_nothing_is_lost() {
    let Some(fs) = SmallFilesystem::mount(64) else {
        return;
    };
    let (kafka, topic, group) = topic_and_group("disk-floor").await;
    // 40 MiB left; the floor is 32 MiB: fetching must stop after about 8 MiB. (A floor this
    // high above its half, the hard limit, leaves room to go on below it after an overshoot.)
    let filler_file = fs.path().join("filler");
    filler(&filler_file, 24);
    let buffer = fs.path().join("buffer");
    let sinks_dir = tempfile::tempdir().expect("tempdir");
    let first_sink = sinks_dir.path().join("first.jsonl");
    let floor = ["--min-free-mib", "32", "--min-free-percent", "0"];
    let slow = ["--process-us", "2000"];
    let first = run(
        &kafka,
        &group,
        &topic,
        &buffer,
        &first_sink,
        &[&floor[..], &slow[..], &WAITS_ON_DISK[..]].concat(),
    );
    // 8 MiB above the floor, and a budget that may take 176 MiB: said at start.
    let short = first.wait_for_line("above the free-space floor", Duration::from_secs(30));
    assert!(
        short.contains("WARN") && short.contains("Ordered mode"),
        "a WARN at start that the room above the floor is short of the budget: {short}"
    );
    produce_fresh(&kafka, &topic, &first_sink).await;
    let warning = first.wait_for_line("below its free-space floor", Duration::from_secs(90));
    assert!(
        warning.contains("WARN") && warning.contains(&buffer.display().to_string()),
        "one WARN line naming the buffer: {warning}"
    );
    let space = catchup::store::free_space(fs.path())
        .expect("statvfs")
        .available;
    // Below the floor by at most what each fetcher's last append costs on disk (about
    // 3 MiB: 1 MiB of records, as sled writes them). Measured before every append, the
    // buffer still wrote 7-9 MiB below it when one append's spill was not bounded by the
    // free space and sled's unwritten buffers were not counted.
    assert!(
        space > 26 << 20,
        "fetching paused with {space} bytes still free (the floor keeps the last 32 MiB)"
    );
    let before = processed(std::slice::from_ref(&first_sink)).len();
    assert!(
        before < every_offset().len(),
        "paused before everything was processed ({before})"
    );
    // The live records wait behind the backlog (`ordered`): once the backlog the buffer holds
    // is processed, nothing in it can be processed before more is written, and the backlog
    // is fetched on below the floor. Before, the run waited here for free space for good.
    let resumed = first.wait_for_line("fetching resumes below", Duration::from_secs(60));
    assert!(
        resumed.contains(&buffer.display().to_string()),
        "the resume names the buffer: {resumed}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let now = processed(std::slice::from_ref(&first_sink)).len();
        if now > before + 1000 {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the backlog went on only to {now} records processed (paused at {before})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let Run { child, stderr } = first;
    signal(&child, "TERM");
    let (status, took, rest) = Run { child, stderr }.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM while paused: exit 0, got {status}; stderr:\n{rest}"
    );
    assert!(
        took <= Duration::from_secs(10),
        "SIGTERM took {took:?} to stop the run"
    );
    eprintln!(
        "paused with {:.1} MiB free after {before} records processed, {after} once it went on below the floor; SIGTERM stopped the run in {took:?}",
        space as f64 / (1 << 20) as f64
    );
    // Said once per change: pauses and resumes alternate (a resume was the last line read).
    let changes: Vec<bool> = rest
        .lines()
        .filter(|line| line.contains("fetching paused") || line.contains("fetching resumes"))
        .map(|line| line.contains("fetching paused"))
        .collect();
    assert!(
        changes.iter().step_by(2).all(|&pause| pause)
            && changes.iter().skip(1).step_by(2).all(|&pause| !pause),
        "pauses and resumes alternate, each said once:\n{rest}"
    );

    // Space comes back; a second run processes the rest.
    std::fs::remove_file(&filler_file).expect("removing the filler");
    let second = Second {
        kafka: &kafka,
        group: &group,
        topic: &topic,
        buffer: &buffer,
    };
    second.processes_the_rest(sinks_dir.path(), first_sink, &floor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_fails_ends_the_run_with_an_error_and_loses_nothing() {
    let Some(fs) = SmallFilesystem::mount(12) else {
        return;
    };
    let (kafka, topic, group) = topic_and_group("disk-full").await;
    let buffer = fs.path().join("buffer");
    let sinks_dir = tempfile::tempdir().expect("tempdir");
    let first_sink = sinks_dir.path().join("first.jsonl");
    let no_floor = ["--min-free-mib", "0", "--min-free-percent", "0"];
    let first = run(
        &kafka,
        &group,
        &topic,
        &buffer,
        &first_sink,
        &[
            &no_floor[..],
            &["--process-us", "2000"][..],
            &WAITS_ON_DISK[..],
        ]
        .concat(),
    );
    produce_fresh(&kafka, &topic, &first_sink).await;
    let (status, _, rest) = first.wait(Duration::from_secs(120));
    assert_eq!(status.code(), Some(1), "a failed write is exit 1:\n{rest}");
    assert!(
        rest.contains("can no longer be written") && rest.contains(&buffer.display().to_string()),
        "the error names the buffer and what to do:\n{rest}"
    );

    // sled may have kept a torn state after the failed write: the buffer is marked, and the
    // next start empties it and refetches from Kafka.
    assert!(
        buffer.join("UNTRUSTED").exists(),
        "the failed buffer is marked untrusted"
    );
    fs.resize(128);
    let second = Second {
        kafka: &kafka,
        group: &group,
        topic: &topic,
        buffer: &buffer,
    };
    second.processes_the_rest(sinks_dir.path(), first_sink, &no_floor);
}

/// The run after space came back, on the same buffer.
struct Second<'a> {
    kafka: &'a Kafka,
    group: &'a str,
    topic: &'a str,
    buffer: &'a Path,
}

impl Second<'_> {
    /// Runs until idle; with the first run's sink, every offset is processed and the group
    /// ends committed at the log end.
    fn processes_the_rest(&self, sinks: &Path, first_sink: PathBuf, extra: &[&str]) {
        let second_sink = sinks.join("second.jsonl");
        let second = run(
            self.kafka,
            self.group,
            self.topic,
            self.buffer,
            &second_sink,
            &[extra, &["--exit-when-idle", "3"][..]].concat(),
        );
        let (status, _, rest) = second.wait(Duration::from_secs(180));
        assert!(status.success(), "second run: {status}; stderr:\n{rest}");
        let all = processed(&[first_sink, second_sink]);
        let missing: Vec<_> = every_offset().difference(&all).take(10).copied().collect();
        assert!(missing.is_empty(), "never processed: {missing:?}…");
        assert_eq!(
            self.kafka.committed(self.group, self.topic, PARTITIONS),
            vec![Some(PER_PARTITION as i64); PARTITIONS as usize]
        );
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}
