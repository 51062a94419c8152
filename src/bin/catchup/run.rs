//! `catchup run`: a reference consumer with a file sink, and the processing loop the demo
//! shares.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use catchup::{CatchupConfig, CatchupConsumer, Delivery, DiskFloor, Mode};
use rdkafka::ClientConfig;

use crate::Failure;
use crate::exec::{ExecOptions, ExecSink, Handed, OnFailure};
use crate::schema::RecordLine;
use crate::sink::Sink;

/// Arguments of `catchup run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Topic to consume (repeat for several).
    #[arg(long = "topic", required = true)]
    pub topics: Vec<String>,
    /// The buffer directory (one per consumer instance).
    #[arg(long)]
    pub buffer_dir: PathBuf,
    /// Delivery mode.
    #[arg(long, value_enum, default_value = "ordered")]
    pub mode: ModeArg,
    /// Split a partition only when its backlog is at least this many offsets.
    #[arg(long, default_value_t = 1000)]
    pub min_lag: u64,
    /// The compacted side topic holding live progress; `{group}` is replaced by the group id
    /// (e.g. `catchup-side.{group}`, one topic per group for ACLs to keep apart).
    #[arg(long, default_value = "__catchup_side")]
    pub side_topic: String,
    /// Free space (MiB) to leave on the buffer's filesystem: below it fetching pauses until
    /// space returns. The floor is the larger of this and --min-free-percent.
    #[arg(long, default_value_t = 256)]
    pub min_free_mib: u64,
    /// Free space to leave, as a percentage of the buffer's filesystem (0 to 100).
    #[arg(long, default_value_t = 5.0, value_parser = parse_percent)]
    pub min_free_percent: f64,
    /// Disk (MiB) the buffer may occupy beyond twice the payload it holds before it is
    /// compacted, giving back what sled keeps after a backlog drained.
    #[arg(long, default_value_t = 64)]
    pub disk_allowance_mib: u64,
    /// Milliseconds between two commits of what was processed.
    #[arg(long, default_value_t = 1000)]
    pub commit_interval_ms: u64,
    /// Bytes (MiB) of unprocessed records the buffer may hold, shared by the lanes being
    /// fetched: a lane pauses above its share. (256 by default, the library's: the process
    /// peaked at 218 MiB at most with it; 128 took 12–19 % longer over 1 KiB records;
    /// docs/performance.md.)
    #[arg(long, default_value_t = 256)]
    pub budget_mib: u64,
    /// Append one JSON line per processed record to this file (fsynced before the ack), or
    /// write them to stdout with `-` (flushed, not fsynced). One of --sink and --exec is
    /// required.
    #[arg(long, conflicts_with_all = ["exec", "discard"])]
    pub sink: Option<PathBuf>,
    /// Hand processed records to this command (run with `sh -c` and kept running) as JSON
    /// lines, a batch at a time; a batch is acknowledged only once the command answers
    /// `ok N` for it on its stdout (`fail N [reason]`: sent again after a backoff).
    #[arg(long, value_name = "CMD", conflicts_with = "discard")]
    pub exec: Option<String>,
    /// With --exec: what to do with a batch that still fails after the retries (`stop`:
    /// exit 1, nothing from it on committed; `skip`: send its records one at a time and skip
    /// those the command still answers `fail` for, each reported on stderr — unless it fails
    /// them all, or fails itself: then it stops).
    #[arg(long, value_enum, default_value = "stop", requires = "exec")]
    pub on_failure: OnFailure,
    /// With --exec: attempts of a failed batch after the first (0.5 s, doubling to 30 s,
    /// between them).
    #[arg(long, default_value_t = 5, requires = "exec")]
    pub retries: u32,
    /// With --exec: seconds the command may take to answer for a batch (then it is started
    /// again and the batch counts as failed).
    #[arg(long, default_value_t = 60, requires = "exec")]
    pub exec_timeout: u64,
    /// Exit after processing this many records (what was processed is committed first).
    #[arg(long)]
    pub max_records: Option<u64>,
    /// Acknowledge records without writing them anywhere (benchmarks and tests).
    #[arg(long, hide = true)]
    pub discard: bool,
    /// Simulated work per record, in microseconds (benchmarks and tests).
    #[arg(long, default_value_t = 0, hide = true)]
    pub process_us: u64,
    /// The first wait before a failed --exec batch is sent again, in milliseconds.
    #[arg(long, default_value_t = 500, hide = true)]
    pub retry_backoff_ms: u64,
    /// Exit once the group has assigned partitions (possibly none), nothing arrived for this
    /// many seconds, everything is committed and merged, and nothing is left between the
    /// committed offsets and the log ends.
    #[arg(long)]
    pub exit_when_idle: Option<u64>,
    /// Serve the consumer's metrics in Prometheus' text format at `http://HOST:PORT/metrics`,
    /// and `/healthz` (200 while the brokers answer and nothing stopped the consumer, else
    /// 503 with the reason).
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Exit 1 when the brokers cannot be reached for this many seconds — at the start, or
    /// later (default: keep retrying, with one WARN line when they become unreachable and one
    /// INFO line when they are back).
    #[arg(long)]
    pub connect_timeout: Option<u64>,
}

/// How to reach the cluster, as `run` and `lag` take it: flags, environment, a properties
/// file.
#[derive(clap::Args)]
pub struct ConnectionArgs {
    /// Bootstrap servers, `host:port[,host:port...]` (or `bootstrap.servers` in the
    /// `--config-file`, which wins).
    #[arg(long, env = "CATCHUP_BROKERS")]
    pub brokers: Option<String>,
    /// Consumer group.
    #[arg(long, env = "CATCHUP_GROUP")]
    pub group: String,
    /// A file of rdkafka properties, one `KEY=VALUE` per line (`#` starts a comment), like
    /// kcat's `-F`: keeps secrets off the command line. `--config` wins over it.
    #[arg(long, env = "CATCHUP_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,
    /// An rdkafka property, `KEY=VALUE` (repeatable), e.g. `group.protocol=consumer`; in the
    /// environment, one per line (blank lines are skipped: an empty `CATCHUP_CONFIG`, or one
    /// ending in a newline, sets nothing).
    #[arg(
        long = "config",
        env = "CATCHUP_CONFIG",
        value_delimiter = '\n',
        value_parser = parse_property_line
    )]
    pub config: Vec<Option<(String, String)>>,
}

impl ConnectionArgs {
    /// The rdkafka settings: brokers and group, the file's properties, then `--config`.
    pub fn client(&self) -> Result<ClientConfig, Failure> {
        let mut properties = match &self.config_file {
            Some(path) => read_config_file(path)?,
            None => Vec::new(),
        };
        properties.extend(self.config.iter().flatten().cloned());
        let config = client_config(self.brokers.as_deref(), &self.group, &properties);
        if config.get("bootstrap.servers").is_none() {
            return Err(Failure::Usage(
                "no brokers: give --brokers (or CATCHUP_BROKERS), or bootstrap.servers in the --config-file".into(),
            ));
        }
        Ok(config)
    }
}

/// The properties of a `--config-file`: `KEY=VALUE` lines, blank lines and `#` comments.
pub fn read_config_file(path: &std::path::Path) -> Result<Vec<(String, String)>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::Usage(format!(
            "cannot read the config file {}: {e}",
            path.display()
        ))
    })?;
    let mut properties = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = parse_key_value(line).map_err(|reason| {
            Failure::Usage(format!("{} line {}: {reason}", path.display(), number + 1))
        })?;
        properties.push((key.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(properties)
}

/// `--mode` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ModeArg {
    /// Backlog first, then live: strictly increasing offsets.
    Ordered,
    /// Fresh records first, each lane in order.
    Concurrent,
    /// No split: the baseline.
    Off,
    /// Fresh records first; during a split, a record whose key has a newer one buffered or
    /// delivered is skipped (for topics that keep the latest value per key).
    Latest,
}

impl From<ModeArg> for Mode {
    fn from(mode: ModeArg) -> Self {
        match mode {
            ModeArg::Ordered => Mode::Ordered,
            ModeArg::Concurrent => Mode::Concurrent,
            ModeArg::Off => Mode::Off,
            ModeArg::Latest => Mode::Latest,
        }
    }
}

/// A `--config` property, or nothing for a blank line.
fn parse_property_line(text: &str) -> Result<Option<(String, String)>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    parse_key_value(text).map(Some)
}

pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got '{text}'"))?;
    if key.is_empty() {
        return Err(format!("empty key in '{text}'"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// The rdkafka settings of a consumer in `group` on `brokers`, with `extra` on top.
pub fn client_config(
    brokers: Option<&str>,
    group: &str,
    extra: &[(String, String)],
) -> ClientConfig {
    let mut config = ClientConfig::new();
    if let Some(brokers) = brokers {
        config.set("bootstrap.servers", brokers);
    }
    config
        .set("group.id", group)
        .set("auto.offset.reset", "earliest");
    for (key, value) in extra {
        config.set(key, value);
    }
    config
}

/// Where processed records go.
pub enum Output {
    /// Nowhere: acknowledged as they are handed out (the demo, benchmarks and tests).
    Discard,
    /// A file or stdout.
    File(Sink),
    /// A long-running command.
    Exec(Box<ExecSink>),
}

/// How records are processed.
pub struct Processing {
    pub process_us: u64,
    pub output: Output,
    pub exit_when_idle: Option<Duration>,
    /// Stop after this many records.
    pub max_records: Option<u64>,
}

/// What a processing loop did.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub processed: u64,
    /// Records the `--exec` command failed and `--on-failure skip` skipped.
    pub skipped: u64,
    pub elapsed: Duration,
}

/// Most records handled (written, synced, acknowledged) as one batch.
const BATCH: usize = 500;

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Simulated work: a busy wait, like CPU-bound processing.
fn work(micros: u64) {
    if micros == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_micros(micros);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Whether an idle consumer is done: everything committed and merged, and nothing left between
/// the committed offsets and the log ends (a paused or slow fetch is not idleness). A commit or
/// a broker question that fails now says "not done": the next idle check asks again.
async fn idle_and_done(consumer: &CatchupConsumer) -> bool {
    if let Err(err) = consumer.commit().await {
        eprintln!("catchup: committing while idle failed ({err}); trying again");
        return false;
    }
    if !consumer.settled() {
        return false;
    }
    match consumer.backlog().await {
        Ok(backlog) => backlog == 0,
        Err(err) => {
            eprintln!("catchup: reading the log ends failed ({err}); trying again");
            false
        }
    }
}

/// How long the consumer waits for its first assignment before it says so.
const ANNOUNCE_WAITING_AFTER: Duration = Duration::from_secs(1);

/// Says once that the consumer waits for its group, and how long that took.
#[derive(Default)]
struct Waiting {
    announced: bool,
    done: bool,
}

impl Waiting {
    /// Whether the group has assigned partitions (possibly none) to the consumer.
    fn assigned(&mut self, consumer: &CatchupConsumer, since: Instant) -> bool {
        if self.done {
            return true;
        }
        if consumer.has_assignment() {
            self.done = true;
            if self.announced {
                eprintln!(
                    "catchup: group {} assigned partitions after {:.1} s",
                    consumer.group(),
                    since.elapsed().as_secs_f64()
                );
            }
            return true;
        }
        // A join takes a moment; a wait worth a word is one that lasts (a crashed member
        // holding the partitions until its session times out).
        if !self.announced && since.elapsed() >= ANNOUNCE_WAITING_AFTER {
            eprintln!(
                "catchup: waiting for group {} to assign partitions (a member that crashed keeps them until its session times out)",
                consumer.group()
            );
            self.announced = true;
        }
        false
    }
}

/// Receives, processes, syncs the sink and acknowledges, batch by batch, until `stop` says
/// so or the consumer has been idle and settled for `exit_when_idle`.
pub async fn process(
    consumer: &CatchupConsumer,
    processing: &mut Processing,
    mut observe: impl FnMut(&Delivery),
    mut stop: impl FnMut() -> bool,
) -> Result<Summary, Failure> {
    let started = Instant::now();
    let mut summary = Summary::default();
    let mut last_delivery = Instant::now();
    let mut waiting = Waiting::default();
    let mut batch = Vec::with_capacity(BATCH);
    let mut lines = Vec::with_capacity(BATCH);
    while !stop() {
        let room = match processing.max_records {
            Some(max) if summary.processed >= max => break,
            Some(max) => (max - summary.processed).min(BATCH as u64) as usize,
            None => BATCH,
        };
        // The records ready now, up to `room`, under one lock (cancelled only while it waits
        // for the first).
        let run = tokio::time::timeout(
            Duration::from_millis(100),
            consumer.recv_many(&mut batch, room),
        )
        .await;
        match run {
            Ok(taken) => {
                taken.map_err(|e| Failure::Runtime(e.to_string()))?;
            }
            Err(_) => {
                // Idle means idle: before the group has assigned anything (a crashed member
                // may hold the partitions until its session times out) the clock stands still.
                if !waiting.assigned(consumer, started) {
                    last_delivery = Instant::now();
                    continue;
                }
                if let Some(idle) = processing.exit_when_idle {
                    if last_delivery.elapsed() >= idle && idle_and_done(consumer).await {
                        break;
                    }
                    if last_delivery.elapsed() >= idle {
                        last_delivery = Instant::now();
                    }
                }
                continue;
            }
        }
        for delivery in &batch {
            work(processing.process_us);
            observe(delivery);
            match &mut processing.output {
                Output::Discard => {}
                Output::File(sink) => sink.write(delivery, now_ms())?,
                Output::Exec(_) => lines.push(RecordLine::processed(delivery, now_ms()).to_text()),
            }
        }
        match &mut processing.output {
            Output::Discard => {}
            Output::File(sink) => sink.sync()?,
            Output::Exec(exec) => {
                let skipped_before = exec.skipped;
                let handed = exec.deliver(&batch, &lines).await;
                lines.clear();
                if handed? == Handed::Stopped {
                    break; // a signal: nothing of the batch is acknowledged
                }
                summary.skipped += exec.skipped - skipped_before;
            }
        }
        summary.processed += batch.len() as u64;
        consumer.ack_many(&batch);
        batch.clear();
        last_delivery = Instant::now();
    }
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// `--connect-timeout` ran out: exit 1 at once. Nothing is waited for: what was processed
/// but not committed is processed again by the next run, as after a crash.
fn unreachable(brokers: &str, limit: Duration) -> ! {
    eprintln!(
        "catchup: cannot reach the brokers ({brokers}) for {} s",
        limit.as_secs()
    );
    std::process::exit(1)
}

/// Exits through [`unreachable`] once the brokers stay unreachable for `limit` (asked every
/// 250 ms: an outage that began while the consumer was being opened counts too).
fn watch_brokers(consumer: &Arc<CatchupConsumer>, limit: Duration, brokers: String) {
    let consumer = Arc::downgrade(consumer);
    tokio::spawn(async move {
        let mut since: Option<Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            if consumer.brokers_reachable() {
                since = None;
            } else if since.get_or_insert_with(Instant::now).elapsed() >= limit {
                unreachable(&brokers, limit);
            }
        }
    });
}

/// `catchup run`.
pub async fn run(args: RunArgs) -> Result<(), Failure> {
    let client = args.connection.client()?;
    let stop = stop_on_signals()
        .map_err(|e| Failure::Runtime(format!("installing signal handlers: {e}")))?;
    let output = output(&args, &stop)?;
    let brokers = client
        .get("bootstrap.servers")
        .unwrap_or_default()
        .to_owned();
    let config = CatchupConfig::new(&args.buffer_dir)
        .mode(args.mode.into())
        .min_lag(args.min_lag)
        .side_topic(args.side_topic.clone())
        .commit_interval(Duration::from_millis(args.commit_interval_ms.max(1)))
        .buffer_budget_bytes(args.budget_mib.saturating_mul(1 << 20))
        .disk_floor(DiskFloor::new(
            args.min_free_mib.saturating_mul(1 << 20),
            args.min_free_percent,
        ))
        .disk_allowance_bytes(args.disk_allowance_mib.saturating_mul(1 << 20));
    let probe = match args.metrics_addr {
        Some(addr) => Some(crate::serve::serve(addr).await?),
        None => None,
    };
    let connect_timeout = args.connect_timeout.map(Duration::from_secs);
    // Opening checks the side topic on the brokers (about a minute when they do not answer).
    let opening = CatchupConsumer::connect(&client, config);
    let consumer = match connect_timeout {
        Some(limit) => match tokio::time::timeout(limit, opening).await {
            Ok(opened) => opened,
            Err(_) => unreachable(&brokers, limit),
        },
        None => opening.await,
    }
    .map_err(crate::failure)?;
    let consumer = Arc::new(consumer);
    if let Some(probe) = &probe {
        let _ = probe.set(consumer.clone());
    }
    if let Some(limit) = connect_timeout {
        watch_brokers(&consumer, limit, brokers);
    }
    let topics: Vec<&str> = args.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).map_err(crate::failure)?;
    let mut processing = Processing {
        process_us: args.process_us,
        output,
        exit_when_idle: args.exit_when_idle.map(Duration::from_secs),
        max_records: args.max_records,
    };
    let result = process(
        &consumer,
        &mut processing,
        |_| {},
        || stop.load(Ordering::Relaxed),
    )
    .await;
    // Whatever happened, commit what was acknowledged and leave the group cleanly.
    let closed = consumer.close().await;
    if let Output::Exec(exec) = &mut processing.output {
        exec.finish().await;
    }
    let summary = result?;
    closed.map_err(|e| Failure::Runtime(e.to_string()))?;
    let skipped = match summary.skipped {
        0 => String::new(),
        skipped => format!(" ({skipped} skipped: the --exec command failed them)"),
    };
    eprintln!(
        "catchup: processed {} record(s){skipped} in {:.1} s",
        summary.processed,
        summary.elapsed.as_secs_f64()
    );
    Ok(())
}

/// Where `catchup run` writes: exactly one of `--sink`, `--exec` and `--discard`. A run
/// without any is refused: it would commit records it wrote nowhere.
fn output(args: &RunArgs, stop: &Arc<AtomicBool>) -> Result<Output, Failure> {
    if let Some(command) = &args.exec {
        return Ok(Output::Exec(Box::new(ExecSink::new(ExecOptions {
            command: command.clone(),
            timeout: Duration::from_secs(args.exec_timeout.max(1)),
            retries: args.retries,
            on_failure: args.on_failure,
            backoff: Duration::from_millis(args.retry_backoff_ms),
            stop: stop.clone(),
        }))));
    }
    if let Some(path) = &args.sink {
        return Ok(Output::File(Sink::open(path.clone())?));
    }
    if args.discard {
        return Ok(Output::Discard);
    }
    Err(Failure::Usage(
        "no output: give --sink FILE, --sink - (stdout) or --exec CMD (catchup run commits what it processed, so it must write it somewhere)".into(),
    ))
}

fn parse_percent(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(percent) if (0.0..=100.0).contains(&percent) => Ok(percent),
        _ => Err(format!("{text:?} is not a percentage from 0 to 100")),
    }
}

/// How long `catchup run` may take to stop after SIGINT or SIGTERM.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// A flag raised by SIGINT or SIGTERM: stop fetching, commit, close, exit 0. Whatever the
/// consumer is doing (a wedged disk included), the process ends within [`STOP_DEADLINE`]
/// of the first signal, and at once on a second one; everything not committed then is
/// processed again by the next run.
fn stop_on_signals() -> std::io::Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let stop = Arc::new(AtomicBool::new(false));
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let flag = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        flag.store(true, Ordering::Relaxed);
        // A thread of its own: it must fire even if the runtime's threads are stuck.
        std::thread::spawn(|| {
            std::thread::sleep(STOP_DEADLINE);
            eprintln!(
                "catchup: did not stop within {} s of the signal; exiting now (whatever was not committed is processed again by the next run)",
                STOP_DEADLINE.as_secs()
            );
            std::process::exit(1);
        });
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!(
            "catchup: second signal; exiting now (whatever was not committed is processed again by the next run)"
        );
        std::process::exit(1);
    });
    Ok(stop)
}
