//! End-to-end consumption against the real broker, side by side in one run: a bare rdkafka
//! loop (the ceiling), kcat (printing offsets to a pipe, and writing every record as JSON to
//! a file on tmpfs: the same bytes `catchup run`'s sink writes), the library in `off`,
//! `ordered` and `concurrent`, and `catchup run` with its fsynced file sink in each mode.
//!
//! ```text
//! scripts/kafka start
//! CATCHUP_BROKERS=$(scripts/kafka bootstrap) cargo bench --bench consume
//! ```
//!
//! Every reader runs in a process of its own (this binary again, or kcat, or `catchup run`),
//! so its peak RSS is its own (`wait4`). Sections (`CATCHUP_BENCH_SECTIONS`, comma-separated,
//! all by default):
//!
//! * `throughput` — records/s and MB/s from subscribing to the last record (kcat and
//!   `catchup run`: from process start), for a topic of
//!   8 partitions whose group committed offset 0 (`CATCHUP_BENCH_RECORDS`, 2,000,000), with
//!   100 B and 1 KiB values, each reader auto-acking and doing nothing else, and the time
//!   from subscribing to the first record (the readers that subscribe);
//! * `fresh` — a consumer restarts behind a backlog of 10k, 100k and 1M records, each
//!   costing `CATCHUP_BENCH_COST_US` (50 µs, as in `catchup demo`) to process; a record is produced once it joined:
//!   the time until that record is processed (time to fresh), and until the backlog is
//!   processed and committed (drain time), per mode; also drawn as an SVG chart;
//! * `recovery` — process start to the first delivery with 1M records already in the buffer;
//! * `side` — how long reading a group's side entries takes (`catchup::group_lag`, the same
//!   read an assignment makes) with a shared side topic empty and holding
//!   `CATCHUP_BENCH_SIDE_ENTRIES` (100,000) entries of other groups, in the layout catchup
//!   creates (partitioned by group) and in a one-partition topic;
//! * `latest` — an upsert topic: `CATCHUP_BENCH_LATEST_RECORDS` (1,000,000) updates of
//!   100,000 keys drawn Zipf(1.1), 100 B values, each key in one partition; a group committed
//!   at 0 restarts and processes the backlog (`CATCHUP_BENCH_COST_US` of work per record) in
//!   `concurrent` and in `latest`: records handed out and the time until every partition's
//!   last record is processed and committed (drain time).
//!
//! `CATCHUP_BENCH_CLI_ALT=PATH` adds `catchup run` of another build of the binary beside this
//! one's in `throughput` (for instance the system allocator's: `cargo build --release
//! --no-default-features --features cli --target-dir target/system-alloc`), in the mode
//! `CATCHUP_BENCH_CLI_ALT_MODE` names (`ordered` unless it says `off` or `concurrent`).
//!
//! `CATCHUP_BENCH_SINK_DIR=DIR` puts the sinks of `catchup run` and `kcat -J` in `DIR` instead
//! of a tmpfs (a disk: its fsyncs then count).
//!
//! `CATCHUP_BENCH_UNEVEN=1` makes the throughput topic's partitions unequal: partition `p`
//! holds `p + 1` of every 36 records, so readers run on after the small ones are done (a
//! caught-up partition beside others with records is what a consumer meets every day).
//!
//! `CATCHUP_BENCH_PARTITIONS` (8) is the partition count of every topic the bench makes (a
//! consumer of many partitions, each with little at its end, is what the reader meets at
//! scale).
//!
//! `CATCHUP_BENCH_REPEAT` (1) reads each throughput topic that many rounds, every reader once
//! a round, and prints the median of each reader's records/s, CPU per record and share (each
//! share taken within a round), the shares' range, and the highest peak RSS.
//!
//! `CATCHUP_BENCH_SIZES`, `CATCHUP_BENCH_READERS` (names or parts of names),
//! `CATCHUP_BENCH_BACKLOGS`, `CATCHUP_BENCH_RECOVERY_RECORDS`, `CATCHUP_BENCH_COMMIT_MS` (the
//! library's commit interval, 1000), `CATCHUP_BENCH_BUDGET_BYTES` (the library readers' byte
//! budget, the library's default unless a section sets its own) and
//! `CATCHUP_BENCH_RDKAFKA=key=value,...` (settings given to every reader) narrow or vary a run.
//!
//! Prints a table per section (with the core count) and writes everything to
//! `target/bench-consume.json` (and the charts `target/bench-throughput.svg` and
//! `target/bench-time-to-fresh.svg`).
//! `cargo test --bench consume` runs a smoke version: 20,000 records, every reader, and checks
//! that each saw every record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use catchup::{CatchupConfig, CatchupConsumer, Mode};

#[path = "../tests/support/zipf.rs"]
mod zipf;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Headers;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// The partitions of every topic the bench makes: `CATCHUP_BENCH_PARTITIONS`, 8 by default.
fn partitions() -> i32 {
    static PARTITIONS: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *PARTITIONS.get_or_init(|| {
        i32::try_from(env_number("CATCHUP_BENCH_PARTITIONS", 8))
            .unwrap_or(8)
            .max(1)
    })
}
const CHILD_ENV: &str = "CATCHUP_BENCH_CHILD";
/// Another build of the `catchup` binary to run beside this one's (its path).
const CLI_ALT_ENV: &str = "CATCHUP_BENCH_CLI_ALT";
/// The directory the sinks of `catchup run` and `kcat -J` write to (a tmpfs by default).
const SINK_DIR_ENV: &str = "CATCHUP_BENCH_SINK_DIR";
const WAIT: Duration = Duration::from_secs(600);
/// The most records the `recv_many` reader takes in one run (the CLI's batch), unless
/// `CATCHUP_BENCH_RUN` says otherwise.
const RUN: u64 = 500;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child::run(&spec);
    }
    let smoke = !std::env::args().any(|a| a == "--bench");
    let Ok(brokers) = std::env::var("CATCHUP_BROKERS") else {
        eprintln!(
            "consume bench: set CATCHUP_BROKERS (scripts/kafka start; scripts/kafka bootstrap)"
        );
        if smoke {
            return Ok(());
        }
        std::process::exit(2);
    };
    let bench = Bench::new(brokers, smoke)?;
    let sections = std::env::var("CATCHUP_BENCH_SECTIONS")
        .unwrap_or_else(|_| "throughput,fresh,recovery,side,latest".into());
    let mut report = serde_json::Map::new();
    report.insert("cores".into(), bench.cores.into());
    for section in sections.split(',') {
        let value = match section.trim() {
            "throughput" => bench.throughput()?,
            "fresh" if !smoke => bench.fresh()?,
            "recovery" if !smoke => bench.recovery()?,
            "side" if !smoke => bench.side()?,
            "latest" if !smoke => bench.latest()?,
            "fresh" | "recovery" | "side" | "latest" => continue,
            other => return Err(format!("unknown section {other:?}").into()),
        };
        report.insert(section.trim().into(), value);
    }
    if !smoke {
        let path = target_dir().join("bench-consume.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
        println!("\nwritten: {}", path.display());
    }
    Ok(())
}

/// The readers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    /// A plain rdkafka `BaseConsumer` in a group: the ceiling.
    Bare,
    /// The same loop doing what any consumer that keeps a record past `poll` must do with
    /// librdkafka's API, and no more: read the headers (librdkafka parses them on the first
    /// call, even none) and copy key and value out (into one buffer, reused).
    BareKeeping,
    /// kcat reading the partitions from the beginning, no group, printing offsets to a pipe.
    Kcat,
    /// kcat as above writing every record as a JSON line (`-J`, key and payload included)
    /// to a file beside `catchup run`'s sink (a tmpfs unless `CATCHUP_BENCH_SINK_DIR` says
    /// otherwise): the same bytes written, for comparing like with like (a file on tmpfs
    /// costs its pages). kcat never fsyncs: on a disk, `catchup run` pays fsyncs it does not.
    KcatFile,
    /// The library in a mode, auto-acking, one `recv` per record.
    Library(Mode),
    /// The library in a mode, auto-acking, taking runs of up to `RUN` records with
    /// `recv_many`.
    LibraryRuns(Mode),
    /// `catchup run` in a mode with its fsynced file sink (on a tmpfs by default).
    CliSink(Mode),
    /// `catchup run --mode ordered` of another build of the binary
    /// (`CATCHUP_BENCH_CLI_ALT`, a path), e.g. one with another allocator, side by side in
    /// the same run.
    CliSinkAlt,
}

impl Reader {
    fn name(self) -> &'static str {
        match self {
            Reader::Bare => "rdkafka BaseConsumer",
            Reader::BareKeeping => "rdkafka BaseConsumer, headers + copy",
            Reader::Kcat => "kcat",
            Reader::KcatFile => "kcat -J to a file",
            Reader::Library(Mode::Off) => "catchup off",
            Reader::Library(Mode::Ordered) => "catchup ordered",
            Reader::Library(Mode::Concurrent) => "catchup concurrent",
            Reader::Library(Mode::Latest) => "catchup latest",
            Reader::Library(_) => "catchup (another mode)",
            Reader::LibraryRuns(Mode::Off) => "catchup off, recv_many",
            Reader::LibraryRuns(_) => "catchup (another mode), recv_many",
            Reader::CliSink(Mode::Off) => "catchup run off + sink",
            Reader::CliSink(Mode::Ordered) => "catchup run ordered + sink",
            Reader::CliSink(Mode::Concurrent) => "catchup run concurrent + sink",
            Reader::CliSink(_) => "catchup run (another mode) + sink",
            Reader::CliSinkAlt => "catchup run + sink (other build)",
        }
    }
}

/// One reader's run: records and seconds to the last of them, and the process's peak RSS.
#[derive(Clone)]
struct Measured {
    records: u64,
    seconds: f64,
    peak_rss_bytes: u64,
    /// The reader process's CPU time, all its threads, from its start to its exit.
    cpu_seconds: f64,
    /// From subscribing to the first record (the readers that subscribe).
    first_seconds: Option<f64>,
}

impl Measured {
    /// `records` read in `seconds` by a process that used `usage`.
    fn of(records: u64, seconds: f64, usage: Usage) -> Self {
        Self {
            records,
            seconds,
            peak_rss_bytes: usage.peak_rss_bytes,
            cpu_seconds: usage.cpu_seconds,
            first_seconds: None,
        }
    }
}

/// The median of some runs' values, and their range.
struct Spread {
    median: f64,
    low: f64,
    high: f64,
    runs: usize,
}

impl Spread {
    fn of(values: impl Iterator<Item = f64>) -> Self {
        let mut values: Vec<f64> = values.collect();
        values.sort_by(f64::total_cmp);
        let runs = values.len();
        let median = match runs {
            0 => f64::NAN,
            _ if runs % 2 == 1 => values[runs / 2],
            _ => (values[runs / 2 - 1] + values[runs / 2]) / 2.0,
        };
        Self {
            median,
            low: values.first().copied().unwrap_or(f64::NAN),
            high: values.last().copied().unwrap_or(f64::NAN),
            runs,
        }
    }

    /// As a share in per cent, with its range when there was more than one run; a dash when
    /// the reader it is a share of did not run (`CATCHUP_BENCH_READERS` left it out).
    fn percent(&self) -> String {
        if self.median.is_nan() {
            "–".to_owned()
        } else if self.runs > 1 {
            format!(
                "{:.0} % ({:.0}–{:.0})",
                100.0 * self.median,
                100.0 * self.low,
                100.0 * self.high
            )
        } else {
            format!("{:.0} %", 100.0 * self.median)
        }
    }
}

struct Bench {
    brokers: String,
    smoke: bool,
    cores: usize,
    admin: AdminClient<DefaultClientContext>,
    runtime: tokio::runtime::Runtime,
    scratch: tempfile::TempDir,
}

impl Bench {
    fn new(brokers: String, smoke: bool) -> Result<Self> {
        let admin = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()?;
        Ok(Self {
            brokers,
            smoke,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            admin,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            scratch: tempfile::Builder::new()
                .prefix("catchup-bench")
                .tempdir_in(target_dir())?,
        })
    }

    fn throughput(&self) -> Result<serde_json::Value> {
        let records: u64 = if self.smoke {
            20_000
        } else {
            env_number("CATCHUP_BENCH_RECORDS", 2_000_000)
        };
        let sizes: Vec<usize> = if self.smoke {
            vec![100]
        } else {
            env_list("CATCHUP_BENCH_SIZES").unwrap_or_else(|| vec![100, 1024])
        };
        let readers: Vec<Reader> = [
            Reader::Bare,
            Reader::BareKeeping,
            Reader::Kcat,
            Reader::KcatFile,
            Reader::Library(Mode::Off),
            Reader::LibraryRuns(Mode::Off),
            Reader::Library(Mode::Ordered),
            Reader::Library(Mode::Concurrent),
            Reader::CliSink(Mode::Off),
            Reader::CliSink(Mode::Ordered),
            Reader::CliSink(Mode::Concurrent),
            Reader::CliSinkAlt,
        ]
        .into_iter()
        .filter(|&r| r != Reader::CliSinkAlt || std::env::var_os(CLI_ALT_ENV).is_some())
        .filter(|r| {
            std::env::var("CATCHUP_BENCH_READERS").map_or(true, |only| {
                only.split(',').any(|name| r.name().contains(name.trim()))
            })
        })
        .collect();
        let rounds = if self.smoke {
            1
        } else {
            env_number("CATCHUP_BENCH_REPEAT", 1).max(1) as usize
        };
        let mut rows = Vec::new();
        let uneven = std::env::var_os("CATCHUP_BENCH_UNEVEN").is_some_and(|v| v == "1");
        println!(
            "\n## throughput: {} records over {} {}partitions, group committed at 0, {} cores",
            with_separators(records),
            partitions(),
            if uneven { "uneven " } else { "" },
            self.cores
        );
        if rounds > 1 {
            println!(
                "\n{rounds} rounds, each reader once a round: the median, the shares' range over the rounds in brackets, the highest peak RSS"
            );
        }
        println!(
            "\n| value | reader | records/s | MB/s | share of bare loop | share of kcat | share of kcat -J to a file | CPU per record | first record | peak RSS |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for &size in &sizes {
            let topic = unique(&format!("bench-{size}"));
            self.create_topic(&topic)?;
            self.produce_spread(&topic, records, size, 0, uneven)?;
            // Round after round, every reader once: a share compares readers of one round.
            let mut runs: Vec<Vec<Measured>> = vec![Vec::new(); readers.len()];
            for _ in 0..rounds {
                for (index, &reader) in readers.iter().enumerate() {
                    runs[index].push(self.read_all(reader, &topic, records)?);
                }
            }
            let rate = |measured: &Measured| measured.records as f64 / measured.seconds;
            let rates_of = |wanted: Reader| -> Vec<f64> {
                readers.iter().position(|&r| r == wanted).map_or_else(
                    || vec![f64::NAN; rounds],
                    |i| runs[i].iter().map(rate).collect(),
                )
            };
            let (bare, kcat, kcat_file) = (
                rates_of(Reader::Bare),
                rates_of(Reader::Kcat),
                rates_of(Reader::KcatFile),
            );
            for (reader, measured) in readers.iter().zip(&runs) {
                let rates: Vec<f64> = measured.iter().map(rate).collect();
                let share = |of: &[f64]| Spread::of(rates.iter().zip(of).map(|(r, o)| r / o));
                let (of_bare, of_kcat, of_kcat_file) =
                    (share(&bare), share(&kcat), share(&kcat_file));
                let per_second = Spread::of(rates.iter().copied()).median;
                let megabytes = per_second * size as f64 / 1e6;
                let cpu_per_record = Spread::of(
                    measured
                        .iter()
                        .map(|m| 1e6 * m.cpu_seconds / m.records as f64),
                )
                .median;
                let peak_rss = measured.iter().map(|m| m.peak_rss_bytes).max().unwrap_or(0);
                let first = Spread::of(measured.iter().filter_map(|m| m.first_seconds)).median;
                let first_shown = if first.is_nan() {
                    "–".to_owned()
                } else {
                    format!("{:.0} ms", first * 1e3)
                };
                println!(
                    "| {} | {} | {:.0} | {:.1} | {} | {} | {} | {:.2} µs | {} | {} MiB |",
                    human_size(size),
                    reader.name(),
                    per_second,
                    megabytes,
                    of_bare.percent(),
                    of_kcat.percent(),
                    of_kcat_file.percent(),
                    cpu_per_record,
                    first_shown,
                    peak_rss >> 20
                );
                let each: Vec<serde_json::Value> = measured
                    .iter()
                    .map(|m| {
                        serde_json::json!({
                            "records": m.records,
                            "seconds": m.seconds,
                            "peak_rss_bytes": m.peak_rss_bytes,
                            "cpu_seconds": m.cpu_seconds,
                            "first_record_seconds": m.first_seconds,
                        })
                    })
                    .collect();
                rows.push(serde_json::json!({
                    "value_bytes": size,
                    "reader": reader.name(),
                    "records_per_second": per_second,
                    "megabytes_per_second": megabytes,
                    "share_of_bare": of_bare.median,
                    "share_of_kcat": of_kcat.median,
                    "share_of_kcat_to_file": of_kcat_file.median,
                    "cpu_us_per_record": cpu_per_record,
                    "first_record_seconds": (!first.is_nan()).then_some(first),
                    "peak_rss_bytes": peak_rss,
                    "runs": each,
                }));
            }
            self.delete_topic(&topic);
        }
        let chart = target_dir().join("bench-throughput.svg");
        std::fs::write(&chart, chart::throughput(&rows, records, self.cores))?;
        println!("\nchart: {}", chart.display());
        Ok(serde_json::Value::Array(rows))
    }

    /// Runs `reader` over the whole of `topic` (a fresh group committed at 0).
    fn read_all(&self, reader: Reader, topic: &str, records: u64) -> Result<Measured> {
        let group = unique("bench-group");
        self.commit_zero(&group, topic)?;
        let dir = self.scratch.path().join(unique("buffer"));
        match reader {
            Reader::Kcat => {
                let started = Instant::now();
                let child = Command::new("kcat")
                    .args(["-C", "-b", &self.brokers, "-t", topic, "-o", "beginning"])
                    .args(["-e", "-q", "-f", "%o\n"])
                    .stdout(Stdio::piped())
                    .spawn()?;
                let (counted, usage) = count_lines_of(child)?;
                let seconds = started.elapsed().as_secs_f64();
                check_count(reader, counted, records)?;
                Ok(Measured::of(counted, seconds, usage))
            }
            Reader::KcatFile => {
                let sink_dir = tempfile::Builder::new()
                    .prefix("catchup-bench-kcat")
                    .tempdir_in(sink_dir())?;
                let path = sink_dir.path().join("kcat.jsonl");
                let started = Instant::now();
                let child = Command::new("kcat")
                    .args(["-C", "-b", &self.brokers, "-t", topic, "-o", "beginning"])
                    .args(["-e", "-q", "-J"])
                    .stdout(std::fs::File::create(&path)?)
                    .spawn()?;
                let (_, usage) = output_of(child)?;
                let seconds = started.elapsed().as_secs_f64();
                let counted = count_lines(std::fs::File::open(&path)?)?;
                check_count(reader, counted, records)?;
                Ok(Measured::of(counted, seconds, usage))
            }
            Reader::CliSink(mode) => {
                let binary = PathBuf::from(env!("CARGO_BIN_EXE_catchup"));
                self.cli_sink(&binary, mode, topic, &group, &dir, records)
            }
            Reader::CliSinkAlt => {
                let binary = std::env::var_os(CLI_ALT_ENV)
                    .map(PathBuf::from)
                    .ok_or(format!("{CLI_ALT_ENV} is not set"))?;
                let mode = match std::env::var("CATCHUP_BENCH_CLI_ALT_MODE").as_deref() {
                    Ok("off") => Mode::Off,
                    Ok("concurrent") => Mode::Concurrent,
                    Ok("ordered") | Err(_) => Mode::Ordered,
                    Ok(other) => {
                        return Err(format!(
                            "CATCHUP_BENCH_CLI_ALT_MODE={other}: off, ordered or concurrent"
                        )
                        .into());
                    }
                };
                self.cli_sink(&binary, mode, topic, &group, &dir, records)
            }
            Reader::Bare | Reader::BareKeeping | Reader::Library(_) | Reader::LibraryRuns(_) => {
                let spec = serde_json::json!({
                    "task": "throughput",
                    "reader": match reader {
                        Reader::Library(mode) | Reader::LibraryRuns(mode) => mode_name(mode),
                        Reader::BareKeeping => "bare-keeping",
                        _ => "bare",
                    },
                    "runs": matches!(reader, Reader::LibraryRuns(_)),
                    "brokers": self.brokers,
                    "topic": topic,
                    "group": group,
                    "records": records,
                    "dir": dir,
                });
                let child = spawn_child(&spec.to_string())?;
                let (output, usage) = output_of(child)?;
                let answer: serde_json::Value = serde_json::from_str(output.trim())
                    .map_err(|e| format!("{}: no result ({e}): {output}", reader.name()))?;
                let counted = answer["records"].as_u64().unwrap_or(0);
                check_count(reader, counted, records)?;
                let seconds = answer["seconds"].as_f64().unwrap_or(f64::NAN);
                let mut measured = Measured::of(counted, seconds, usage);
                measured.first_seconds = answer["first_seconds"].as_f64();
                Ok(measured)
            }
        }
    }

    /// `catchup run` in `mode` with a sink in [`sink_dir`]: timed from its start to the
    /// sink's last line.
    fn cli_sink(
        &self,
        binary: &Path,
        mode: Mode,
        topic: &str,
        group: &str,
        dir: &Path,
        records: u64,
    ) -> Result<Measured> {
        let sink_dir = tempfile::Builder::new()
            .prefix("catchup-bench-sink")
            .tempdir_in(sink_dir())?;
        let sink = sink_dir.path().join("sink.jsonl");
        let child = Command::new(binary)
            .args([
                "run",
                "--brokers",
                &self.brokers,
                "--group",
                group,
                "--topic",
                topic,
            ])
            .arg("--buffer-dir")
            .arg(dir)
            .arg("--sink")
            .arg(&sink)
            .args(["--mode", mode_name(mode), "--exit-when-idle", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let started = Instant::now();
        // The time the sink last grew is when its last record was written (the reader then
        // waits a second idle and exits). Only its size is watched while the reader runs:
        // reading the lines as they come took CPU from the reader on two cores (2.2 GB at
        // 1 KiB); they are counted once it exited.
        let exited = std::sync::atomic::AtomicBool::new(false);
        let (usage, last_growth) = std::thread::scope(|scope| {
            let watcher = scope.spawn(|| {
                let (mut size, mut grew) = (0, started);
                while !exited.load(std::sync::atomic::Ordering::Relaxed) {
                    let now = std::fs::metadata(&sink).map_or(0, |meta| meta.len());
                    if now > size {
                        (size, grew) = (now, Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                grew
            });
            let usage = output_of(child).map(|(_, usage)| usage);
            exited.store(true, std::sync::atomic::Ordering::Relaxed);
            (usage, watcher.join())
        });
        let usage = usage?;
        let last_growth = last_growth.map_err(|_| "the sink's watcher panicked")?;
        let seconds = last_growth.duration_since(started).as_secs_f64();
        let lines = match std::fs::File::open(&sink) {
            Ok(file) => count_lines(file)?,
            Err(_) => 0,
        };
        check_count(Reader::CliSink(mode), lines, records)?;
        Ok(Measured::of(lines, seconds, usage))
    }

    /// Time to fresh and drain time per backlog and mode (100 B records).
    fn fresh(&self) -> Result<serde_json::Value> {
        let cost_us = env_number("CATCHUP_BENCH_COST_US", 50);
        let backlogs =
            env_list("CATCHUP_BENCH_BACKLOGS").unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);
        let modes: Vec<Mode> = [Mode::Off, Mode::Ordered, Mode::Concurrent]
            .into_iter()
            .filter(|&mode| wanted(Reader::Library(mode)))
            .collect();
        println!(
            "\n## time to fresh: a consumer restarts behind a backlog (100 B records, {cost_us} µs of work each, {} partitions), {} cores",
            partitions(),
            self.cores
        );
        println!(
            "\n| backlog | mode | time to fresh | drain time | fresh vs off | drain vs off | peak RSS |"
        );
        println!("|---|---|---|---|---|---|---|");
        let mut rows = Vec::new();
        for &backlog in &backlogs {
            let topic = unique("bench-fresh");
            self.create_topic(&topic)?;
            self.produce(&topic, backlog as u64, 100, 0)?;
            let mut results = Vec::new();
            for &mode in &modes {
                let group = unique("bench-group");
                self.commit_zero(&group, &topic)?;
                let spec = serde_json::json!({
                    "task": "fresh",
                    "reader": mode_name(mode),
                    "brokers": self.brokers,
                    "topic": topic,
                    "group": group,
                    "records": backlog,
                    "cost_us": cost_us,
                    "dir": self.scratch.path().join(unique("buffer")),
                });
                let mut child = spawn_child(&spec.to_string())?;
                let watch = UsageWatch::watch(child.id());
                let stdout = child.stdout.take().ok_or("no stdout")?;
                let mut answer = None;
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout).lines() {
                    let line = line?;
                    if line == "assigned" {
                        // The restart is done: these are the first records after it.
                        self.produce_fresh(&topic)?;
                    } else if line.starts_with('{') {
                        answer = Some(serde_json::from_str::<serde_json::Value>(&line)?);
                    }
                }
                let (status, usage) = wait_with_usage(&mut child, watch)?;
                let peak_rss_bytes = usage.peak_rss_bytes;
                let answer = answer.ok_or(format!("{}: no result ({status})", mode_name(mode)))?;
                let fresh = answer["fresh_seconds"].as_f64().unwrap_or(f64::NAN);
                let drain = answer["drain_seconds"].as_f64().unwrap_or(f64::NAN);
                results.push((mode, fresh, drain, peak_rss_bytes));
            }
            let (off_fresh, off_drain) = results
                .iter()
                .find(|r| r.0 == Mode::Off)
                .map_or((f64::NAN, f64::NAN), |r| (r.1, r.2));
            for (mode, fresh, drain, peak_rss_bytes) in results {
                println!(
                    "| {backlog} | {} | {:.3} s | {:.2} s | {:.1}× sooner | {:+.1} % | {} MiB |",
                    mode_name(mode),
                    fresh,
                    drain,
                    off_fresh / fresh,
                    100.0 * (drain / off_drain - 1.0),
                    peak_rss_bytes >> 20
                );
                rows.push(serde_json::json!({
                    "backlog": backlog,
                    "mode": mode_name(mode),
                    "cost_us": cost_us,
                    "time_to_fresh_seconds": fresh,
                    "drain_seconds": drain,
                    "peak_rss_bytes": peak_rss_bytes,
                }));
            }
            self.delete_topic(&topic);
        }
        let chart = target_dir().join("bench-time-to-fresh.svg");
        std::fs::write(&chart, chart::time_to_fresh(&rows, cost_us, self.cores))?;
        println!("\nchart: {}", chart.display());
        Ok(serde_json::Value::Array(rows))
    }

    /// One record per partition, keyed `fresh-<partition>`.
    /// Reading one group's side entries beside other groups' (see the module docs).
    fn side(&self) -> Result<serde_json::Value> {
        let entries: u64 = if self.smoke {
            2_000
        } else {
            env_number("CATCHUP_BENCH_SIDE_ENTRIES", 100_000)
        };
        println!(
            "\n## side topic: reading one group's entries beside {entries} entries of other groups, {} cores",
            self.cores
        );
        println!("\n| side topic | other groups' entries | read (group_lag) |");
        println!("|---|---|---|");
        let data_topic = unique("bench-side-data");
        self.create_topic(&data_topic)?;
        let client = {
            let mut client = ClientConfig::new();
            client.set("bootstrap.servers", &self.brokers);
            client
        };
        let group = unique("bench-side-group");
        let mut rows = Vec::new();
        for partitions in [catchup::plan::SIDE_PARTITIONS, 1] {
            let side_topic = unique("bench-side");
            let new_topic = NewTopic::new(&side_topic, partitions, TopicReplication::Fixed(1))
                .set("cleanup.policy", "compact");
            for result in self
                .runtime
                .block_on(self.admin.create_topics([&new_topic], &AdminOptions::new()))?
            {
                result.map_err(|(topic, code)| format!("creating {topic}: {code}"))?;
            }
            self.wait_for_leaders(&side_topic, partitions)?;
            let layout = if partitions == 1 {
                "one partition".to_owned()
            } else {
                format!("{partitions} partitions by group")
            };
            for others in [0, entries] {
                if others > 0 {
                    self.produce_side_entries(&side_topic, partitions, others)?;
                }
                let started = Instant::now();
                catchup::group_lag(&client, &group, &[&data_topic], &side_topic)?;
                let seconds = started.elapsed().as_secs_f64();
                println!("| {layout} | {others} | {:.3} s |", seconds);
                rows.push(serde_json::json!({
                    "side_partitions": partitions,
                    "other_entries": others,
                    "read_seconds": seconds,
                }));
            }
            self.delete_topic(&side_topic);
        }
        self.delete_topic(&data_topic);
        Ok(serde_json::Value::Array(rows))
    }

    /// Waits until every partition of a topic just created has a leader (a read before that
    /// is refused with NotLeaderForPartition).
    fn wait_for_leaders(&self, topic: &str, partitions: i32) -> Result<()> {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let metadata = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
            let ready = metadata.topics().iter().any(|t| {
                t.name() == topic
                    && t.partitions().len() == partitions as usize
                    && t.partitions()
                        .iter()
                        .all(|p| p.leader() >= 0 && p.error().is_none())
            });
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{topic}: partitions without a leader after 60 s").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes `count` side entries of other groups (one partition each, 100 B values) where
    /// catchup would write them.
    fn produce_side_entries(&self, side_topic: &str, partitions: i32, count: u64) -> Result<()> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("linger.ms", "20")
            .set("queue.buffering.max.messages", "1000000")
            .create()?;
        let value = vec![b'x'; 100];
        for index in 0..count {
            let group = format!("other-group-{index}");
            let key = catchup::plan::side_key(&group, "orders", 0);
            let record = BaseRecord::to(side_topic)
                .key(&key)
                .payload(&value)
                .partition(catchup::plan::side_partition(&group, partitions));
            send_retrying(&producer, record);
        }
        producer.flush(Duration::from_secs(60))?;
        Ok(())
    }

    fn produce_fresh(&self, topic: &str) -> Result<()> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("linger.ms", "0")
            .create()?;
        for partition in 0..partitions() {
            let key = format!("fresh-{partition}");
            producer
                .send(
                    BaseRecord::to(topic)
                        .key(&key)
                        .payload("fresh")
                        .partition(partition),
                )
                .map_err(|(err, _)| err)?;
        }
        producer.flush(Duration::from_secs(30))?;
        Ok(())
    }

    /// Process start to first delivery with 1M records (100 B) already in the buffer.
    fn recovery(&self) -> Result<serde_json::Value> {
        let records = env_number("CATCHUP_BENCH_RECOVERY_RECORDS", 1_000_000);
        let topic = unique("bench-recovery");
        self.create_topic(&topic)?;
        self.produce(&topic, records, 100, 0)?;
        let group = unique("bench-group");
        self.commit_zero(&group, &topic)?;
        let dir = self.scratch.path().join(unique("buffer"));
        let spec = |task: &str| {
            serde_json::json!({
                "task": task,
                "reader": "ordered",
                "brokers": self.brokers,
                "topic": topic,
                "group": group,
                "records": records,
                "dir": dir,
            })
            .to_string()
        };
        // Fill the buffer, process nothing, close.
        let fill = spawn_child(&spec("fill"))?;
        let (filled, _) = output_of(fill)?;
        let filled: serde_json::Value = serde_json::from_str(filled.trim())?;
        let buffer_bytes = directory_bytes(&dir);
        let started = Instant::now();
        let recover = spawn_child(&spec("recover"))?;
        let (answer, usage) = output_of(recover)?;
        let peak_rss_bytes = usage.peak_rss_bytes;
        let wall = started.elapsed().as_secs_f64();
        let answer: serde_json::Value = serde_json::from_str(answer.trim())?;
        self.delete_topic(&topic);
        let seconds = |key: &str| answer[key].as_f64().unwrap_or(f64::NAN);
        println!(
            "\n## recovery: {} records buffered ({} MiB on disk), {} cores",
            filled["buffered"],
            buffer_bytes >> 20,
            self.cores
        );
        println!(
            "\n| open the buffer | start to assigned | start to first delivery | of which after the assignment | peak RSS |"
        );
        println!("|---|---|---|---|---|");
        println!(
            "| {:.3} s | {:.3} s | {:.3} s | {:.3} s | {} MiB |",
            seconds("open_seconds"),
            seconds("assigned_seconds"),
            seconds("first_seconds"),
            seconds("first_seconds") - seconds("assigned_seconds"),
            peak_rss_bytes >> 20
        );
        Ok(serde_json::json!({
            "buffered_records": filled["buffered"],
            "buffer_disk_bytes": buffer_bytes,
            "open_seconds": seconds("open_seconds"),
            "assigned_seconds": seconds("assigned_seconds"),
            "first_delivery_seconds": seconds("first_seconds"),
            "process_wall_seconds": wall,
            "peak_rss_bytes": peak_rss_bytes,
        }))
    }

    /// An upsert topic's backlog drained in `concurrent` and `latest` (see the module docs).
    fn latest(&self) -> Result<serde_json::Value> {
        let records = env_number("CATCHUP_BENCH_LATEST_RECORDS", 1_000_000);
        let keys = env_number("CATCHUP_BENCH_LATEST_KEYS", 100_000) as usize;
        let cost_us = env_number("CATCHUP_BENCH_COST_US", 50);
        let topic = unique("bench-latest");
        self.create_topic(&topic)?;
        let distinct = self.produce_zipf(&topic, records, keys)?;
        println!(
            "\n## latest: {records} updates of {keys} keys (Zipf 1.1, {distinct} keys updated), 100 B values, {cost_us} µs of work per record, {} partitions, {} cores",
            partitions(),
            self.cores
        );
        println!(
            "\n| mode | records handed out | drain time | handed out vs concurrent | drain vs concurrent | peak RSS |"
        );
        println!("|---|---|---|---|---|---|");
        let mut rows: Vec<(Mode, u64, f64, u64)> = Vec::new();
        for mode in [Mode::Concurrent, Mode::Latest] {
            let group = unique("bench-group");
            self.commit_zero(&group, &topic)?;
            let spec = serde_json::json!({
                "task": "drain",
                "reader": mode_name(mode),
                "brokers": self.brokers,
                "topic": topic,
                "group": group,
                "records": records,
                "cost_us": cost_us,
                "dir": self.scratch.path().join(unique("buffer")),
            });
            let child = spawn_child(&spec.to_string())?;
            let (answer, usage) = output_of(child)?;
            let peak_rss_bytes = usage.peak_rss_bytes;
            let answer: serde_json::Value = serde_json::from_str(answer.trim())?;
            let handed = answer["handed_out"].as_u64().unwrap_or(0);
            let drain = answer["drain_seconds"].as_f64().unwrap_or(f64::NAN);
            rows.push((mode, handed, drain, peak_rss_bytes));
        }
        self.delete_topic(&topic);
        let (base_handed, base_drain) = (rows[0].1 as f64, rows[0].2);
        let mut json = Vec::new();
        for &(mode, handed, drain, peak_rss_bytes) in &rows {
            println!(
                "| {} | {handed} | {drain:.2} s | {:+.1} % | {:+.1} % | {} MiB |",
                mode_name(mode),
                100.0 * (handed as f64 / base_handed - 1.0),
                100.0 * (drain / base_drain - 1.0),
                peak_rss_bytes >> 20
            );
            json.push(serde_json::json!({
                "mode": mode_name(mode),
                "records": records,
                "keys": keys,
                "keys_updated": distinct,
                "cost_us": cost_us,
                "handed_out": handed,
                "drain_seconds": drain,
                "peak_rss_bytes": peak_rss_bytes,
            }));
        }
        Ok(serde_json::Value::Array(json))
    }

    /// Produces `count` updates of keys drawn Zipf(1.1) from `keys`, 100 B values, each key
    /// always in the same partition; returns how many keys were updated.
    fn produce_zipf(&self, topic: &str, count: u64, keys: usize) -> Result<usize> {
        use rand::SeedableRng;
        let producer = self.bulk_producer()?;
        let zipf = zipf::Zipf::new(keys, 1.1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x2a7e57);
        let mut updated = std::collections::HashSet::new();
        let value = vec![b'x'; 100];
        for _ in 0..count {
            let rank = zipf.sample(&mut rng);
            updated.insert(rank);
            let key = format!("key-{rank:08}");
            let record = BaseRecord::to(topic)
                .key(&key)
                .payload(&value)
                .partition((rank % partitions() as usize) as i32);
            send_retrying(&producer, record);
        }
        producer.flush(Duration::from_secs(120))?;
        Ok(updated.len())
    }

    fn create_topic(&self, topic: &str) -> Result<()> {
        let new_topic = NewTopic::new(topic, partitions(), TopicReplication::Fixed(1));
        let results = self
            .runtime
            .block_on(self.admin.create_topics([&new_topic], &AdminOptions::new()))?;
        for result in results {
            result.map_err(|(topic, code)| format!("creating {topic}: {code}"))?;
        }
        Ok(())
    }

    fn delete_topic(&self, topic: &str) {
        let _ = self
            .runtime
            .block_on(self.admin.delete_topics(&[topic], &AdminOptions::new()));
    }

    /// A producer that batches as much as it can (the benchmark's topics are filled fast).
    fn bulk_producer(&self) -> Result<BaseProducer> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("linger.ms", "20")
            .set("batch.size", "1000000")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "65536")
            .create()?)
    }

    /// Produces `count` records of `size` value bytes, round-robin over the partitions, with
    /// keys numbered from `first`.
    fn produce(&self, topic: &str, count: u64, size: usize, first: u64) -> Result<()> {
        self.produce_spread(topic, count, size, first, false)
    }

    /// [`produce`](Self::produce), or with `uneven` partition `p` taking `p + 1` of every
    /// 36 records.
    fn produce_spread(
        &self,
        topic: &str,
        count: u64,
        size: usize,
        first: u64,
        uneven: bool,
    ) -> Result<()> {
        let producer = self.bulk_producer()?;
        let value = vec![b'x'; size];
        for index in first..first + count {
            let key = format!("k{index:012}");
            let record = BaseRecord::to(topic)
                .key(&key)
                .payload(&value)
                .partition(partition_of(index, uneven));
            send_retrying(&producer, record);
        }
        producer.flush(Duration::from_secs(120))?;
        Ok(())
    }

    /// Commits offset 0 on every partition for `group`, as a group that processed nothing.
    fn commit_zero(&self, group: &str, topic: &str) -> Result<()> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .create()?;
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions() {
            list.add_partition_offset(topic, partition, Offset::Offset(0))?;
        }
        consumer.commit(&list, CommitMode::Sync)?;
        Ok(())
    }
}

/// The reader processes: each prints one JSON line with what it counted and measured.
mod child {
    use super::*;

    /// What a child was asked to do, from the JSON in `CATCHUP_BENCH_CHILD`.
    struct Spec {
        task: String,
        reader: String,
        topic: String,
        records: u64,
        cost_us: u64,
        dir: String,
        /// Take runs with `recv_many` instead of one `recv` per record.
        runs: bool,
        client: ClientConfig,
    }

    pub fn run(spec: &str) -> Result<()> {
        let started = Instant::now();
        if std::env::var_os("RUST_LOG").is_some() {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .init();
        }
        let json: serde_json::Value = serde_json::from_str(spec)?;
        let text = |key: &str| json[key].as_str().unwrap_or_default().to_owned();
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", text("brokers"))
            .set("group.id", text("group"))
            .set("auto.offset.reset", "earliest");
        // Extra librdkafka settings for experiments: `CATCHUP_BENCH_RDKAFKA=key=value,...`.
        if let Ok(extra) = std::env::var("CATCHUP_BENCH_RDKAFKA") {
            for pair in extra.split(',').filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once('=').ok_or("key=value expected")?;
                client.set(key, value);
            }
        }
        let spec = Spec {
            task: text("task"),
            reader: text("reader"),
            topic: text("topic"),
            records: json["records"].as_u64().unwrap_or(0),
            cost_us: json["cost_us"].as_u64().unwrap_or(0),
            dir: text("dir"),
            runs: json["runs"].as_bool().unwrap_or(false),
            client,
        };
        let answer = if spec.reader.starts_with("bare") {
            bare(&spec, spec.reader == "bare-keeping")?
        } else {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                match spec.task.as_str() {
                    "fresh" => fresh(&spec, started).await,
                    "drain" => drain(&spec, started).await,
                    "fill" => fill(&spec).await,
                    "recover" => recover(&spec, started).await,
                    _ => throughput(&spec).await,
                }
            })?
        };
        println!("{answer}");
        Ok(())
    }

    fn mode(reader: &str) -> Mode {
        match reader {
            "off" => Mode::Off,
            "ordered" => Mode::Ordered,
            "latest" => Mode::Latest,
            _ => Mode::Concurrent,
        }
    }

    fn consumer(spec: &Spec, auto_ack: bool, budget: Option<u64>) -> Result<CatchupConsumer> {
        let defaults = CatchupConfig::new(&spec.dir);
        let budget = budget.unwrap_or_else(|| {
            env_number("CATCHUP_BENCH_BUDGET_BYTES", defaults.buffer_budget_bytes)
        });
        let config = defaults
            .mode(mode(&spec.reader))
            .auto_ack(auto_ack)
            .commit_interval(Duration::from_millis(env_number(
                "CATCHUP_BENCH_COMMIT_MS",
                1000,
            )))
            .buffer_budget_bytes(budget);
        Ok(CatchupConsumer::new(&spec.client, config)?)
    }

    /// Ends the process once `counted` (distinct records seen) has not grown for [`WAIT`]: a
    /// reader that stops delivering new records fails its run rather than hang the bench. A
    /// thread of its own, which a runtime whose workers are all blocked cannot starve; it
    /// ends once `counted` is `u64::MAX` (the loop is done).
    fn watch(counted: Arc<AtomicU64>) {
        std::thread::spawn(move || {
            let (mut last, mut since) = (0, Instant::now());
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let now = counted.load(Ordering::Relaxed);
                if now == u64::MAX {
                    return;
                }
                if now != last {
                    (last, since) = (now, Instant::now());
                } else if since.elapsed() >= WAIT {
                    eprintln!(
                        "no new record for {} s after {now} distinct records",
                        WAIT.as_secs()
                    );
                    std::process::exit(1);
                }
            }
        });
    }

    async fn next(consumer: &CatchupConsumer) -> Result<catchup::Delivery> {
        Ok(tokio::time::timeout(WAIT, consumer.recv())
            .await
            .map_err(|_| format!("nothing delivered for {} s", WAIT.as_secs()))??)
    }

    /// A plain rdkafka consumer: subscribe, poll, count; `keeping`, also read each record's
    /// headers and copy its key and value out.
    fn bare(spec: &Spec, keeping: bool) -> Result<serde_json::Value> {
        let mut client = spec.client.clone();
        // The prefetch the library gives its group member (a default budget), so that the
        // ceiling is not held back by librdkafka's one-second queue backoff.
        client
            .set("fetch.queue.backoff.ms", "10")
            .set("queued.max.messages.kbytes", "16384")
            .set("queued.min.messages", "16384");
        let consumer: BaseConsumer = client.create()?;
        let mut seen = Seen::default();
        // Where kept keys and values are copied: reused, so that the copy costs no allocation.
        let mut kept: Vec<u8> = Vec::with_capacity(1 << 20);
        let mut headers_seen = 0usize;
        let subscribed = Instant::now();
        consumer.subscribe(&[&spec.topic])?;
        let deadline = subscribed + WAIT;
        while seen.count < spec.records && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(message)) => {
                    if keeping {
                        headers_seen += message.headers().map_or(0, |h| h.count());
                        if kept.len() > (1 << 20) - 64 * 1024 {
                            kept.clear();
                        }
                        kept.extend_from_slice(message.key().unwrap_or_default());
                        kept.extend_from_slice(message.payload().unwrap_or_default());
                    }
                    seen.record(message.partition(), message.offset())
                }
                Some(Err(err)) => eprintln!("bare loop: {err}"),
                None => {}
            }
        }
        std::hint::black_box((&kept, headers_seen));
        Ok(serde_json::json!({
            "records": seen.count,
            "seconds": subscribed.elapsed().as_secs_f64(),
            "first_seconds": seen.first.map(|at| (at - subscribed).as_secs_f64()),
        }))
    }

    /// Every record, auto-acked, as fast as it comes.
    async fn throughput(spec: &Spec) -> Result<serde_json::Value> {
        let consumer = consumer(spec, true, None)?;
        let mut events = consumer.events();
        let pauses = tokio::spawn(async move {
            let mut pauses = 0u64;
            while let Ok(event) = events.recv().await {
                if let catchup::Event::Backpressure { paused: true, .. } = event {
                    pauses += 1;
                }
            }
            pauses
        });
        let mut seen = Seen::default();
        let subscribed = Instant::now();
        consumer.subscribe(&[&spec.topic])?;
        let limit = env_number("CATCHUP_BENCH_RUN", RUN) as usize;
        let mut run = Vec::with_capacity(limit);
        // The loop measured is the one an application writes (no timer per record): a
        // watchdog beside it ends a run that stops delivering.
        let counted = Arc::new(AtomicU64::new(0));
        watch(counted.clone());
        while seen.count < spec.records {
            if spec.runs {
                consumer.recv_many(&mut run, limit).await?;
                for delivery in run.drain(..) {
                    seen.record(delivery.partition, delivery.offset);
                }
            } else {
                let delivery = consumer.recv().await?;
                seen.record(delivery.partition, delivery.offset);
            }
            counted.store(seen.count, Ordering::Relaxed);
        }
        counted.store(u64::MAX, Ordering::Relaxed);
        let seconds = subscribed.elapsed().as_secs_f64();
        consumer.close().await?;
        drop(consumer);
        Ok(serde_json::json!({
            "records": seen.count,
            "seconds": seconds,
            "first_seconds": seen.first.map(|at| (at - subscribed).as_secs_f64()),
            "pauses": pauses.await.unwrap_or(0),
        }))
    }

    /// The backlog and the fresh records produced once the group assigned us, each costing
    /// `cost_us` of work.
    async fn fresh(spec: &Spec, started: Instant) -> Result<serde_json::Value> {
        let consumer = consumer(spec, true, None)?;
        let mut events = consumer.events();
        tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                if let catchup::Event::Assigned { .. } = event {
                    println!("assigned");
                    break;
                }
            }
        });
        consumer.subscribe(&[&spec.topic])?;
        let mut seen = Seen::default();
        let (mut fresh_seen, mut fresh_at, mut drained_at) = (0, None, None);
        let mut owed = Duration::ZERO;
        while seen.count < spec.records || fresh_seen < partitions() {
            let delivery = next(&consumer).await?;
            // The work, slept in millisecond slices: as long on average, without a spin.
            owed += Duration::from_micros(spec.cost_us);
            if owed >= Duration::from_millis(1) {
                tokio::time::sleep(owed).await;
                owed = Duration::ZERO;
            }
            if delivery
                .key
                .as_deref()
                .is_some_and(|k| k.starts_with(b"fresh"))
            {
                fresh_seen += 1;
                fresh_at.get_or_insert_with(|| started.elapsed().as_secs_f64());
            } else {
                seen.record(delivery.partition, delivery.offset);
                if seen.count == spec.records && drained_at.is_none() {
                    consumer.commit().await?;
                    drained_at = Some(started.elapsed().as_secs_f64());
                }
            }
        }
        consumer.close().await?;
        Ok(serde_json::json!({
            "records": seen.count,
            "fresh_seconds": fresh_at,
            "drain_seconds": drained_at,
        }))
    }

    /// Processes the backlog (each record costing `cost_us`) until every partition's last
    /// record is processed, then commits: the records handed out and the drain time.
    async fn drain(spec: &Spec, started: Instant) -> Result<serde_json::Value> {
        let ends: BTreeMap<i32, i64> = {
            let probe: BaseConsumer = spec.client.create()?;
            (0..partitions())
                .map(|partition| {
                    let (_, high) =
                        probe.fetch_watermarks(&spec.topic, partition, Duration::from_secs(30))?;
                    Ok((partition, high))
                })
                .collect::<Result<_>>()?
        };
        let consumer = consumer(spec, true, None)?;
        consumer.subscribe(&[&spec.topic])?;
        let mut left: BTreeMap<i32, i64> = ends.clone();
        left.retain(|_, &mut high| high > 0);
        let (mut handed_out, mut owed) = (0u64, Duration::ZERO);
        while !left.is_empty() {
            let delivery = next(&consumer).await?;
            handed_out += 1;
            owed += Duration::from_micros(spec.cost_us);
            if owed >= Duration::from_millis(1) {
                tokio::time::sleep(owed).await;
                owed = Duration::ZERO;
            }
            if left.get(&delivery.partition) == Some(&(delivery.offset + 1)) {
                left.remove(&delivery.partition);
            }
        }
        consumer.commit().await?;
        let drain_seconds = started.elapsed().as_secs_f64();
        consumer.close().await?;
        Ok(serde_json::json!({
            "handed_out": handed_out,
            "drain_seconds": drain_seconds,
        }))
    }

    /// Buffers the whole topic without processing any of it, then closes.
    async fn fill(spec: &Spec) -> Result<serde_json::Value> {
        let consumer = consumer(spec, false, Some(4 << 30))?;
        consumer.subscribe(&[&spec.topic])?;
        let deadline = Instant::now() + WAIT;
        let mut buffered = 0;
        while buffered < spec.records && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            buffered = consumer
                .buffers()?
                .iter()
                .map(|b| b.catchup.records + b.live.records)
                .sum();
        }
        consumer.close().await?;
        Ok(serde_json::json!({ "buffered": buffered }))
    }

    /// Opens the filled buffer again: how long until the first delivery.
    async fn recover(spec: &Spec, started: Instant) -> Result<serde_json::Value> {
        let consumer = consumer(spec, false, Some(4 << 30))?;
        let open_seconds = started.elapsed().as_secs_f64();
        let mut events = consumer.events();
        let assigned = tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                if let catchup::Event::Assigned { .. } = event {
                    return Some(started.elapsed().as_secs_f64());
                }
            }
            None
        });
        consumer.subscribe(&[&spec.topic])?;
        next(&consumer).await?;
        let first_seconds = started.elapsed().as_secs_f64();
        consumer.close().await?;
        drop(consumer);
        Ok(serde_json::json!({
            "open_seconds": open_seconds,
            "assigned_seconds": assigned.await.ok().flatten(),
            "first_seconds": first_seconds,
        }))
    }

    /// Which offsets of which partition were seen.
    #[derive(Default)]
    struct Seen {
        count: u64,
        offsets: BTreeMap<i32, Vec<bool>>,
        /// When the first record came.
        first: Option<Instant>,
    }

    impl Seen {
        fn record(&mut self, partition: i32, offset: i64) {
            self.first.get_or_insert_with(Instant::now);
            let offsets = self.offsets.entry(partition).or_default();
            let index = offset.max(0) as usize;
            if offsets.len() <= index {
                offsets.resize(index + 1, false);
            }
            if !offsets[index] {
                offsets[index] = true;
                self.count += 1;
            }
        }
    }
}

/// This binary again, as the reader `spec` describes, its stdout piped.
fn spawn_child(spec: &str) -> Result<Child> {
    Ok(Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .spawn()?)
}

fn check_count(reader: Reader, counted: u64, expected: u64) -> Result<()> {
    if counted != expected {
        return Err(format!(
            "{}: saw {counted} distinct records of {expected}",
            reader.name()
        )
        .into());
    }
    Ok(())
}

/// Waits for `child`, returning what it printed and what it used.
fn output_of(mut child: Child) -> Result<(String, Usage)> {
    let watch = UsageWatch::watch(child.id());
    let mut output = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        stdout.read_to_string(&mut output)?;
    }
    let (status, usage) = wait_with_usage(&mut child, watch)?;
    if !status.success() && output.is_empty() {
        return Err(format!("reader exited with {status:?}").into());
    }
    Ok((output, usage))
}

/// Counts the lines `child` prints, and what it used.
fn count_lines_of(mut child: Child) -> Result<(u64, Usage)> {
    let watch = UsageWatch::watch(child.id());
    let lines = match child.stdout.take() {
        Some(stdout) => count_lines(stdout)?,
        None => 0,
    };
    let (_, usage) = wait_with_usage(&mut child, watch)?;
    Ok((lines, usage))
}

/// The lines `from` reads until its end.
fn count_lines(mut from: impl std::io::Read) -> Result<u64> {
    let (mut chunk, mut lines) = (vec![0u8; 1 << 16], 0u64);
    loop {
        let read = from.read(&mut chunk)?;
        if read == 0 {
            return Ok(lines);
        }
        lines += chunk[..read].iter().filter(|&&b| b == b'\n').count() as u64;
    }
}

/// What a reader process used: its peak resident set and its CPU time.
#[derive(Clone, Copy, Default)]
struct Usage {
    peak_rss_bytes: u64,
    /// User and system time of all its threads.
    cpu_seconds: f64,
}

/// The exit status of `child` and what it used, as its last `VmHWM` and CPU times read
/// before it exited say. (`wait4`'s `ru_maxrss` would not do: it keeps the high-water mark
/// of the process image before `exec`, this bench's own.)
fn wait_with_usage(
    child: &mut Child,
    watch: UsageWatch,
) -> Result<(std::process::ExitStatus, Usage)> {
    let status = child.wait()?;
    Ok((status, watch.finish()))
}

/// Samples a process's `VmHWM` and CPU time every few milliseconds until it exits.
struct UsageWatch {
    thread: std::thread::JoinHandle<Usage>,
}

impl UsageWatch {
    fn watch(pid: u32) -> Self {
        let thread = std::thread::spawn(move || {
            let mut usage = Usage::default();
            let (status_path, stat_path) =
                (format!("/proc/{pid}/status"), format!("/proc/{pid}/stat"));
            // SAFETY: sysconf reads a constant of the system.
            let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
            loop {
                let Ok(status) = std::fs::read_to_string(&status_path) else {
                    return usage;
                };
                let Some(kib) = status
                    .lines()
                    .find_map(|line| line.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                else {
                    return usage; // a zombie: it exited
                };
                usage.peak_rss_bytes = usage.peak_rss_bytes.max(kib * 1024);
                // utime and stime are the 14th and 15th fields, counted past the command's
                // name (in parentheses, which may hold spaces).
                let ticks = std::fs::read_to_string(&stat_path).ok().and_then(|stat| {
                    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
                    Some(
                        fields.get(11)?.parse::<u64>().ok()?
                            + fields.get(12)?.parse::<u64>().ok()?,
                    )
                });
                if let Some(ticks) = ticks {
                    usage.cpu_seconds = ticks as f64 / ticks_per_second;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self { thread }
    }

    fn finish(self) -> Usage {
        self.thread.join().unwrap_or_default()
    }
}

/// Sends `record`, polling the producer while its queue is full.
fn send_retrying<K, P>(producer: &BaseProducer, mut record: BaseRecord<'_, K, P>)
where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, returned)) => {
                record = returned;
                producer.poll(Duration::from_millis(10));
            }
        }
    }
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// Whether `CATCHUP_BENCH_READERS` (names or parts of names, comma-separated) asks for
/// `reader`; all are by default.
fn wanted(reader: Reader) -> bool {
    std::env::var("CATCHUP_BENCH_READERS").map_or(true, |only| {
        only.split(',')
            .any(|name| reader.name().contains(name.trim()))
    })
}

fn mode_name(mode: Mode) -> &'static str {
    mode.as_str()
}

/// Bytes of the files under `dir`.
fn directory_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => directory_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

/// `count` with a comma every three digits (2,000,000), for titles a reader takes in at a
/// glance.
fn with_separators(count: u64) -> String {
    let digits = count.to_string();
    let mut grouped = String::new();
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn env_list(name: &str) -> Option<Vec<usize>> {
    let value = std::env::var(name).ok()?;
    value.split(',').map(|v| v.trim().parse().ok()).collect()
}

fn human_size(bytes: usize) -> String {
    if bytes >= 1024 {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The partition of the `index`th record: round-robin, or with `uneven` partition `p`
/// taking `p + 1` of every `partitions() * (partitions() + 1) / 2` records.
fn partition_of(index: u64, uneven: bool) -> i32 {
    let partitions = partitions() as u64;
    if !uneven {
        return (index % partitions) as i32;
    }
    let mut slot = index % (partitions * (partitions + 1) / 2);
    let mut partition = 0;
    while slot > partition {
        slot -= partition + 1;
        partition += 1;
    }
    partition as i32
}

/// Where the sinks write: `CATCHUP_BENCH_SINK_DIR` (a disk, to measure its fsyncs) unless
/// empty, else a tmpfs where there is one.
fn sink_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(SINK_DIR_ENV).filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        target_dir()
    }
}

/// The charts: time to fresh (backlog on a log x axis, seconds on a log y axis, a line per
/// mode) and throughput (a bar per reader, as a share of the bare loop).
mod chart {
    use super::human_size;
    use std::fmt::Write;

    const WIDTH: f64 = 780.0;
    const HEIGHT: f64 = 440.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 600.0;
    const TOP: f64 = 60.0;
    const BOTTOM: f64 = 370.0;
    const MODES: [(&str, &str, &str); 3] = [
        ("off", "#d62728", "off (plain)"),
        ("ordered", "#1f77b4", "ordered"),
        ("concurrent", "#2ca02c", "concurrent"),
    ];

    pub fn time_to_fresh(rows: &[serde_json::Value], cost_us: u64, cores: usize) -> String {
        let points: Vec<(&str, f64, f64)> = rows
            .iter()
            .filter_map(|row| {
                Some((
                    row["mode"].as_str()?,
                    row["backlog"].as_f64()?,
                    row["time_to_fresh_seconds"].as_f64()?,
                ))
            })
            .filter(|(_, backlog, seconds)| *backlog > 0.0 && *seconds > 0.0)
            .collect();
        let decade = |v: f64, up: bool| {
            let exponent = v.log10();
            10f64.powf(if up {
                exponent.ceil()
            } else {
                exponent.floor()
            })
        };
        let fold = |pick: fn(&(&str, f64, f64)) -> f64, min: bool| {
            points
                .iter()
                .map(pick)
                .fold(if min { f64::INFINITY } else { 0.0 }, |a, b| {
                    if min { a.min(b) } else { a.max(b) }
                })
        };
        let (x_min, x_max) = (
            decade(fold(|p| p.1, true), false),
            decade(fold(|p| p.1, false), true),
        );
        let (y_min, y_max) = (
            decade(fold(|p| p.2, true), false),
            decade(fold(|p| p.2, false), true),
        );
        let x =
            |v: f64| LEFT + (v.log10() - x_min.log10()) / (x_max / x_min).log10() * (RIGHT - LEFT);
        let y = |v: f64| {
            BOTTOM - (v.log10() - y_min.log10()) / (y_max / y_min).log10() * (BOTTOM - TOP)
        };
        let mut svg = String::new();
        let _ = write!(
            svg,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="13">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="28" text-anchor="middle" font-size="16">Time to the first fresh record after a restart</text>
<text x="{}" y="46" text-anchor="middle" fill="#555">100 B records, {cost_us} µs of work each, 8 partitions, {cores} cores; lower is better</text>
"##,
            (LEFT + RIGHT) / 2.0,
            (LEFT + RIGHT) / 2.0
        );
        // Grid and ticks at every decade.
        let mut tick = x_min;
        while tick <= x_max * 1.0001 {
            let _ = writeln!(
                svg,
                r##"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{BOTTOM}" stroke="#ddd"/><text x="{0:.1}" y="{1}" text-anchor="middle">{2}</text>"##,
                x(tick),
                BOTTOM + 18.0,
                count_label(tick)
            );
            tick *= 10.0;
        }
        let mut tick = y_min;
        while tick <= y_max * 1.0001 {
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{0:.1}" x2="{RIGHT}" y2="{0:.1}" stroke="#ddd"/><text x="{1}" y="{2:.1}" text-anchor="end">{3}</text>"##,
                y(tick),
                LEFT - 6.0,
                y(tick) + 4.0,
                seconds_label(tick)
            );
            tick *= 10.0;
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#333"/>
<text x="{}" y="{}" text-anchor="middle">backlog (records, log scale)</text>
<text transform="translate(22 {}) rotate(-90)" text-anchor="middle">seconds until the first fresh record is processed (log scale)</text>"##,
            RIGHT - LEFT,
            BOTTOM - TOP,
            (LEFT + RIGHT) / 2.0,
            BOTTOM + 42.0,
            (TOP + BOTTOM) / 2.0
        );
        for (index, (mode, colour, label)) in MODES.iter().enumerate() {
            let mut line: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.0 == *mode)
                .map(|p| (x(p.1), y(p.2)))
                .collect();
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let path: Vec<String> = line
                .iter()
                .map(|(px, py)| format!("{px:.1},{py:.1}"))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2.5"/>"#,
                path.join(" ")
            );
            for (px, py) in &line {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="{colour}"/>"#
                );
            }
            // The legend, right of the plot: never over the data.
            let legend_y = TOP + 12.0 + 24.0 * index as f64;
            let _ = writeln!(
                svg,
                r#"<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="{colour}" stroke-width="2.5"/><circle cx="{3}" cy="{1}" r="4" fill="{colour}"/><text x="{4}" y="{5}">{label}</text>"#,
                RIGHT + 16.0,
                legend_y,
                RIGHT + 44.0,
                RIGHT + 30.0,
                RIGHT + 52.0,
                legend_y + 4.0
            );
        }
        svg.push_str("</svg>\n");
        svg
    }

    /// Throughput: per value size, a horizontal bar per reader, its records/s as a share of
    /// the bare loop's in the same run (the bare loop's bar is 100 %).
    pub fn throughput(rows: &[serde_json::Value], records: u64, cores: usize) -> String {
        const BAR: f64 = 18.0;
        const GAP: f64 = 6.0;
        const GROUP_GAP: f64 = 26.0;
        const LABEL: f64 = 220.0;
        const PLOT: f64 = 480.0;
        let mut sizes: Vec<u64> = rows
            .iter()
            .filter_map(|row| row["value_bytes"].as_u64())
            .collect();
        sizes.dedup();
        let bars = rows.len() as f64;
        let height = TOP + bars * (BAR + GAP) + sizes.len() as f64 * GROUP_GAP + 50.0;
        let width = LABEL + PLOT + 150.0;
        let x = |share: f64| LABEL + share.clamp(0.0, 1.0) * PLOT;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">
<rect width="100%" height="100%" fill="white"/>
<text x="{0}" y="28" text-anchor="middle" font-size="16">Throughput as a share of a bare rdkafka loop, same run</text>
<text x="{0}" y="46" text-anchor="middle" fill="#555">{1} records over 8 partitions, {cores} cores, broker on the same cores; higher is better</text>"##,
            width / 2.0,
            super::with_separators(records)
        );
        for share in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let _ = writeln!(
                svg,
                r##"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{1:.1}" stroke="#ddd"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle" fill="#555">{3:.0} %</text>"##,
                x(share),
                height - 40.0,
                height - 24.0,
                share * 100.0
            );
        }
        let mut top = TOP;
        for size in &sizes {
            top += GROUP_GAP;
            let _ = writeln!(
                svg,
                r##"<text x="8" y="{:.1}" font-weight="bold">{}</text>"##,
                top - 8.0,
                human_size(*size as usize)
            );
            for row in rows
                .iter()
                .filter(|row| row["value_bytes"].as_u64() == Some(*size))
            {
                let reader = row["reader"].as_str().unwrap_or("?");
                let share = row["share_of_bare"].as_f64().unwrap_or(f64::NAN);
                let per_second = row["records_per_second"].as_f64().unwrap_or(f64::NAN);
                let colour = match reader {
                    r if r.starts_with("rdkafka") => "#7f7f7f",
                    r if r.starts_with("kcat") => "#bcbd22",
                    r if r.starts_with("catchup run") => "#9467bd",
                    r if r.contains("off") => "#d62728",
                    r if r.contains("ordered") => "#1f77b4",
                    r if r.contains("concurrent") => "#2ca02c",
                    _ => "#9467bd",
                };
                let _ = writeln!(
                    svg,
                    r##"<text x="{0:.1}" y="{1:.1}" text-anchor="end">{2}</text><rect x="{3}" y="{4:.1}" width="{5:.1}" height="{BAR}" fill="{colour}"/><text x="{6:.1}" y="{1:.1}">{7:.0} % · {8:.0}k/s</text>"##,
                    LABEL - 8.0,
                    top + BAR - 4.0,
                    reader,
                    LABEL,
                    top,
                    x(share) - LABEL,
                    x(share) + 6.0,
                    share * 100.0,
                    per_second / 1000.0
                );
                top += BAR + GAP;
            }
        }
        svg.push_str("</svg>\n");
        svg
    }

    fn count_label(value: f64) -> String {
        match value {
            v if v >= 1e6 => format!("{}M", v / 1e6),
            v if v >= 1e3 => format!("{}k", v / 1e3),
            v => format!("{v}"),
        }
    }

    fn seconds_label(value: f64) -> String {
        if value >= 1.0 {
            format!("{value} s")
        } else {
            format!("{} ms", value * 1000.0)
        }
    }
}
