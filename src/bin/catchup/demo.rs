//! `catchup demo`: the point of the project in one command. A backlog builds up behind a
//! "crashed" consumer while fresh records keep arriving; the consumer restarts three ways
//! (`off`, `ordered`, `concurrent`) on the same backlog, and the figures are compared.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use catchup::{CatchupConfig, CatchupConsumer, Mode};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::json;

use crate::Failure;
use crate::run::{Output, Processing, client_config, process};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `catchup demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Use this broker instead of starting the repository's own (`scripts/kafka start`).
    #[arg(long, env = "CATCHUP_BROKERS")]
    pub brokers: Option<String>,
    /// Records in the backlog the crashed consumer left behind.
    #[arg(long, default_value_t = 200_000)]
    pub backlog: usize,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Simulated work per record, in microseconds.
    #[arg(long, default_value_t = 50)]
    pub process_us: u64,
    /// Fresh records produced per second while the consumer catches up.
    #[arg(long, default_value_t = 200)]
    pub fresh_per_second: u64,
    /// Where to write `demo.json` and `demo.svg`.
    #[arg(long, default_value = "demo-results")]
    pub out: PathBuf,
}

/// The figures of one restart.
#[derive(Debug, Clone)]
struct Outcome {
    mode: &'static str,
    first_fresh: Option<Duration>,
    drained: Duration,
    processed: u64,
    duplicates: u64,
    /// Per quarter second after the restart: the age of the newest record processed in it.
    ages: Vec<(f64, f64)>,
}

/// The width of one point of the age chart.
const AGE_BUCKET_S: f64 = 0.25;

impl Outcome {
    fn records_per_second(&self) -> f64 {
        self.processed as f64 / self.drained.as_secs_f64().max(1e-9)
    }
}

fn runtime_error(what: &str) -> impl Fn(rdkafka::error::KafkaError) -> Failure + '_ {
    move |err| Failure::Runtime(format!("{what}: {err}"))
}

/// The repository's broker, started by the demo: stopped when the demo ends, however it
/// ends (a broker that was already running is left alone).
struct StartedBroker {
    script: PathBuf,
}

impl Drop for StartedBroker {
    fn drop(&mut self) {
        eprintln!(
            "stopping the local broker the demo started ({} stop)",
            self.script.display()
        );
        let stopped = std::process::Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .stdout(std::process::Stdio::null())
            .status();
        if !stopped.is_ok_and(|status| status.success()) {
            eprintln!(
                "the local broker may still run: {} stop",
                self.script.display()
            );
        }
    }
}

/// The bootstrap address: the one given, or the repository's broker, started on demand (and
/// then stopped with the returned guard).
fn brokers(given: Option<String>) -> Result<(String, Option<StartedBroker>), Failure> {
    if let Some(brokers) = given {
        return Ok((brokers, None));
    }
    let script = [
        PathBuf::from("scripts/kafka"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka"),
    ]
    .into_iter()
    .find(|path| path.is_file())
    .ok_or_else(|| {
        Failure::Usage(
            "no --brokers given and scripts/kafka not found: run from the repository".into(),
        )
    })?;
    let running = std::process::Command::new("bash")
        .arg(&script)
        .arg("status")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !running {
        eprintln!("starting the local broker ({} start)", script.display());
    }
    let output = std::process::Command::new("bash")
        .arg(&script)
        .arg("start")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Failure::Runtime(format!("running {}: {e}", script.display())))?;
    let bootstrap = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || bootstrap.is_empty() {
        return Err(Failure::Runtime(
            "the local broker did not start (see above)".into(),
        ));
    }
    Ok((bootstrap, (!running).then_some(StartedBroker { script })))
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), Failure> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(runtime_error("admin client"))?;
    let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&new_topic],
            &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
        )
        .await
        .map_err(runtime_error("creating the demo topic"))?;
    for result in results {
        result
            .map_err(|(name, code)| Failure::Runtime(format!("creating topic {name}: {code}")))?;
    }
    Ok(())
}

fn producer(brokers: &str) -> Result<FutureProducer, Failure> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create()
        .map_err(runtime_error("producer"))
}

async fn produce_backlog(
    producer: &FutureProducer,
    topic: &str,
    count: usize,
    partitions: i32,
) -> Result<(), Failure> {
    let bar = indicatif::ProgressBar::new(count as u64).with_message("building the backlog");
    for chunk_start in (0..count).step_by(10_000) {
        let records: Vec<(i32, String, String)> = (chunk_start..count.min(chunk_start + 10_000))
            .map(|index| {
                let payload = format!(
                    "{{\"seq\":{index},\"kind\":\"backlog\",\"produced_ms\":{}}}",
                    now_ms()
                );
                (index as i32 % partitions, format!("k{index}"), payload)
            })
            .collect();
        let pending = records.iter().map(|(partition, key, payload)| {
            producer.send(
                FutureRecord::to(topic)
                    .key(key)
                    .payload(payload)
                    .partition(*partition),
                TIMEOUT,
            )
        });
        for delivery in futures::future::join_all(pending).await {
            delivery
                .map_err(|(err, _)| Failure::Runtime(format!("producing the backlog: {err}")))?;
        }
        bar.set_position((chunk_start + 10_000).min(count) as u64);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Produces fresh records at `per_second` until `stop` is raised.
fn fresh_producer(
    producer: FutureProducer,
    topic: String,
    partitions: i32,
    per_second: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut produced = 0u64;
        let period = Duration::from_micros(1_000_000 / per_second.max(1));
        let mut ticker = tokio::time::interval(period);
        while !stop.load(Ordering::Relaxed) {
            ticker.tick().await;
            let payload = format!("{{\"kind\":\"fresh\",\"produced_ms\":{}}}", now_ms());
            let partition = (produced % partitions as u64) as i32;
            let record = FutureRecord::<(), _>::to(&topic)
                .payload(&payload)
                .partition(partition);
            if producer.send_result(record).is_ok() {
                produced += 1;
            }
        }
        let _ = producer.flush(TIMEOUT);
        produced
    })
}

/// The "crashed" consumer's last commit: the start of the backlog, for a group per mode.
fn commit_backlog_start(
    brokers: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<(), Failure> {
    let consumer: BaseConsumer = client_config(Some(brokers), group, &[])
        .create()
        .map_err(runtime_error("consumer"))?;
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        list.add_partition_offset(topic, partition, Offset::Offset(0))
            .map_err(runtime_error("offsets"))?;
    }
    consumer
        .commit(&list, CommitMode::Sync)
        .map_err(runtime_error("committing the crashed consumer's offsets"))
}

fn log_ends(brokers: &str, topic: &str, partitions: i32) -> Result<Vec<i64>, Failure> {
    let consumer: BaseConsumer = client_config(Some(brokers), "catchup-demo-watermarks", &[])
        .create()
        .map_err(runtime_error("consumer"))?;
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, TIMEOUT)
                .map(|(_, high)| high)
                .map_err(runtime_error("watermarks"))
        })
        .collect()
}

async fn restart(
    args: &DemoArgs,
    brokers: &str,
    topic: &str,
    mode: Mode,
    name: &'static str,
    run_id: u128,
) -> Result<Outcome, Failure> {
    let group = format!("catchup-demo-{run_id}-{name}");
    commit_backlog_start(brokers, &group, topic, args.partitions)?;
    let backlog_ends = log_ends(brokers, topic, args.partitions)?;
    let backlog_total: i64 = backlog_ends.iter().sum();
    let buffer_dir =
        tempfile::tempdir().map_err(|e| Failure::Runtime(format!("temporary buffer: {e}")))?;
    let config = CatchupConfig::new(buffer_dir.path())
        .mode(mode)
        .min_lag(1000);

    let stop_fresh = Arc::new(AtomicBool::new(false));
    let fresh = fresh_producer(
        producer(brokers)?,
        topic.to_owned(),
        args.partitions,
        args.fresh_per_second,
        stop_fresh.clone(),
    );
    let started = Instant::now();
    let consumer = CatchupConsumer::connect(&client_config(Some(brokers), &group, &[]), config)
        .await
        .map_err(crate::failure)?;
    consumer.subscribe(&[topic]).map_err(crate::failure)?;

    let bar = indicatif::ProgressBar::new(backlog_total as u64).with_message(format!("{name:>10}"));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} backlog records")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let progress = std::cell::RefCell::new(Progress::default());
    let mut processing = Processing {
        process_us: args.process_us,
        output: Output::Discard,
        exit_when_idle: None,
        max_records: None,
    };
    let deadline = started + Duration::from_secs(600);
    let summary = process(
        &consumer,
        &mut processing,
        |delivery| {
            let mut progress = progress.borrow_mut();
            if !progress.seen.insert((delivery.partition, delivery.offset)) {
                progress.duplicates += 1;
                return;
            }
            if let catchup::Timestamp::CreateTime(ms) | catchup::Timestamp::LogAppendTime(ms) =
                delivery.timestamp
            {
                let age = (now_ms() as f64 - ms as f64).max(0.0) / 1000.0;
                progress.note_age(started.elapsed().as_secs_f64(), age);
            }
            if delivery.offset >= backlog_ends[delivery.partition as usize] {
                progress
                    .first_fresh
                    .get_or_insert_with(|| started.elapsed());
            } else {
                progress.backlog_done += 1;
                bar.inc(1);
                if progress.backlog_done == backlog_total {
                    progress.drained = Some(started.elapsed());
                }
            }
        },
        || {
            let progress = progress.borrow();
            (progress.drained.is_some() && progress.first_fresh.is_some())
                || Instant::now() > deadline
        },
    )
    .await?;
    let Progress {
        first_fresh,
        drained,
        duplicates,
        ages,
        ..
    } = progress.into_inner();
    bar.finish_and_clear();
    stop_fresh.store(true, Ordering::Relaxed);
    let _ = fresh.await;
    consumer.close().await.map_err(crate::failure)?;
    let drained = drained.ok_or_else(|| {
        Failure::Runtime(format!("{name}: the backlog was not drained within 600 s"))
    })?;
    Ok(Outcome {
        mode: name,
        first_fresh,
        drained,
        processed: summary.processed,
        duplicates,
        ages,
    })
}

/// What a restart has seen so far.
#[derive(Default)]
struct Progress {
    seen: HashSet<(i32, i64)>,
    backlog_done: i64,
    duplicates: u64,
    first_fresh: Option<Duration>,
    drained: Option<Duration>,
    ages: Vec<(f64, f64)>,
}

impl Progress {
    /// Keeps, per bucket of time after the restart, the youngest age seen: how stale the
    /// freshest data the application has is.
    fn note_age(&mut self, after_s: f64, age_s: f64) {
        let bucket = (after_s / AGE_BUCKET_S).floor() * AGE_BUCKET_S;
        match self.ages.last_mut() {
            Some((start, youngest)) if *start == bucket => *youngest = youngest.min(age_s),
            _ => self.ages.push((bucket, age_s)),
        }
    }
}

fn seconds(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "-".into(), |d| format!("{:.2} s", d.as_secs_f64()))
}

fn print_table(args: &DemoArgs, outcomes: &[Outcome]) {
    println!(
        "\nbacklog of {} records over {} partitions, {} µs of work per record, {} fresh records/s",
        args.backlog, args.partitions, args.process_us, args.fresh_per_second
    );
    println!(
        "{:<11} {:>17} {:>17} {:>12} {:>11}",
        "mode", "first fresh", "backlog drained", "records/s", "duplicates"
    );
    for outcome in outcomes {
        println!(
            "{:<11} {:>17} {:>17} {:>12.0} {:>11}",
            outcome.mode,
            seconds(outcome.first_fresh),
            seconds(Some(outcome.drained)),
            outcome.records_per_second(),
            outcome.duplicates
        );
    }
    let fresh = |mode: &str| {
        outcomes
            .iter()
            .find(|o| o.mode == mode)
            .and_then(|o| o.first_fresh)
    };
    if let (Some(off), Some(concurrent)) = (fresh("off"), fresh("concurrent")) {
        println!(
            "\nconcurrent reached fresh records {:.0}x sooner than off",
            off.as_secs_f64() / concurrent.as_secs_f64().max(1e-6)
        );
    }
}

fn write_json(path: &Path, args: &DemoArgs, outcomes: &[Outcome]) -> Result<(), Failure> {
    let runs: Vec<_> = outcomes
        .iter()
        .map(|o| {
            json!({
                "mode": o.mode,
                "first_fresh_s": o.first_fresh.map(|d| d.as_secs_f64()),
                "backlog_drained_s": o.drained.as_secs_f64(),
                "records_per_second": o.records_per_second(),
                "processed": o.processed,
                "duplicates": o.duplicates,
                "youngest_age_s_per_quarter_second": o.ages,
            })
        })
        .collect();
    let document = json!({
        "backlog": args.backlog,
        "partitions": args.partitions,
        "process_us": args.process_us,
        "fresh_per_second": args.fresh_per_second,
        "runs": runs,
    });
    let text =
        serde_json::to_string_pretty(&document).map_err(|e| Failure::Runtime(e.to_string()))?;
    std::fs::write(path, text)
        .map_err(|e| Failure::Runtime(format!("writing {}: {e}", path.display())))
}

const FRESH_COLOUR: plotters::style::RGBColor = plotters::style::RGBColor(46, 139, 87);
const DRAINED_COLOUR: plotters::style::RGBColor = plotters::style::RGBColor(70, 110, 180);
const MODE_COLOURS: [plotters::style::RGBColor; 3] = [
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(44, 160, 44),
];

fn chart_error(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> Failure + '_ {
    move |e| Failure::Runtime(format!("drawing {}: {e}", path.display()))
}

/// Two bars per mode, each mode named under its pair; the y range leaves the top fifth free
/// for the legend, so it never covers a bar.
fn write_chart(path: &Path, outcomes: &[Outcome]) -> Result<(), Failure> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let error = chart_error(path);
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let longest = outcomes
        .iter()
        .map(|o| o.drained.as_secs_f64())
        .fold(1.0, f64::max)
        * 1.3;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "time to the first fresh record vs. time to drain the backlog",
            ("sans-serif", 18),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..outcomes.len() as f64, 0f64..longest)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("seconds after the restart")
        .draw()
        .map_err(|e| error(&e))?;
    // Mode i owns [i, i + 1): its two bars side by side, its name centred under them.
    let bars = |from: f64, value: fn(&Outcome) -> f64, colour: RGBColor| {
        outcomes.iter().enumerate().map(move |(index, outcome)| {
            let x = index as f64 + from;
            Rectangle::new([(x, 0.0), (x + 0.36, value(outcome))], colour.filled())
        })
    };
    chart
        .draw_series(bars(
            0.12,
            |o| o.first_fresh.map_or(0.0, |d| d.as_secs_f64()),
            FRESH_COLOUR,
        ))
        .map_err(|e| error(&e))?;
    chart
        .draw_series(bars(0.52, |o| o.drained.as_secs_f64(), DRAINED_COLOUR))
        .map_err(|e| error(&e))?;
    // Each bar's value above it: 0.5 s beside 12 s is otherwise invisible.
    let value_style = ("sans-serif", 13)
        .into_text_style(&root)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    for (index, outcome) in outcomes.iter().enumerate() {
        let fresh = outcome.first_fresh.map(|d| d.as_secs_f64());
        let drained = Some(outcome.drained.as_secs_f64());
        for (from, value) in [(0.12, fresh), (0.52, drained)] {
            let (x, y) = chart.backend_coord(&(index as f64 + from + 0.18, value.unwrap_or(0.0)));
            let text = value.map_or_else(|| "none".to_owned(), |v| format!("{v:.2} s"));
            root.draw(&Text::new(text, (x, y - 4), value_style.clone()))
                .map_err(|e| error(&e))?;
        }
    }
    let label_style = ("sans-serif", 15)
        .into_text_style(&root)
        .pos(Pos::new(HPos::Center, VPos::Top));
    for (index, outcome) in outcomes.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(index as f64 + 0.5, 0.0));
        root.draw(&Text::new(outcome.mode, (x, y + 10), label_style.clone()))
            .map_err(|e| error(&e))?;
    }
    // The legend, top right, above the tallest bar (the range leaves that room).
    let (right, top) = chart.backend_coord(&(outcomes.len() as f64, longest));
    for (row, (label, colour)) in [
        ("first fresh record", FRESH_COLOUR),
        ("backlog drained", DRAINED_COLOUR),
    ]
    .into_iter()
    .enumerate()
    {
        let (x, y) = (right - 200, top + 10 + 22 * row as i32);
        root.draw(&Rectangle::new([(x, y), (x + 14, y + 14)], colour.filled()))
            .map_err(|e| error(&e))?;
        root.draw(&Text::new(label, (x + 22, y), ("sans-serif", 15)))
            .map_err(|e| error(&e))?;
    }
    root.present().map_err(|e| error(&e))
}

/// Per mode, the age of the newest record processed in each quarter second after the
/// restart: how stale the freshest data the application has is.
fn write_age_chart(path: &Path, outcomes: &[Outcome]) -> Result<(), Failure> {
    use plotters::prelude::*;
    let error = chart_error(path);
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let points = || outcomes.iter().flat_map(|o| o.ages.iter());
    let last_s = points().map(|p| p.0).fold(1.0, f64::max) + AGE_BUCKET_S;
    let oldest_s = points().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "age of the newest record processed, after the restart",
            ("sans-serif", 18),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .right_y_label_area_size(0)
        .build_cartesian_2d(0f64..last_s, 0f64..oldest_s)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds after the restart")
        .y_desc("age of the record (s)")
        .draw()
        .map_err(|e| error(&e))?;
    for (outcome, colour) in outcomes.iter().zip(MODE_COLOURS) {
        chart
            .draw_series(LineSeries::new(
                outcome.ages.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| error(&e))?
            .label(outcome.mode)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()
        .map_err(|e| error(&e))?;
    root.present().map_err(|e| error(&e))
}

/// `catchup demo`.
pub async fn demo(args: DemoArgs) -> Result<(), Failure> {
    if args.partitions < 1 || args.backlog == 0 {
        return Err(Failure::Usage(
            "--partitions and --backlog must be positive".into(),
        ));
    }
    let (brokers, _started) = brokers(args.brokers.clone())?;
    let run_id = now_ms();
    let topic = format!("catchup-demo-{run_id}");
    create_topic(&brokers, &topic, args.partitions).await?;
    eprintln!(
        "broker {brokers}, topic {topic}: producing a backlog of {} records",
        args.backlog
    );
    produce_backlog(&producer(&brokers)?, &topic, args.backlog, args.partitions).await?;
    let mut outcomes = Vec::new();
    for (mode, name) in [
        (Mode::Off, "off"),
        (Mode::Ordered, "ordered"),
        (Mode::Concurrent, "concurrent"),
    ] {
        eprintln!("restarting the crashed consumer in mode {name}");
        outcomes.push(restart(&args, &brokers, &topic, mode, name, run_id).await?);
    }
    print_table(&args, &outcomes);
    std::fs::create_dir_all(&args.out)
        .map_err(|e| Failure::Runtime(format!("creating {}: {e}", args.out.display())))?;
    write_json(&args.out.join("demo.json"), &args, &outcomes)?;
    write_chart(&args.out.join("demo.svg"), &outcomes)?;
    write_age_chart(&args.out.join("demo-age.svg"), &outcomes)?;
    println!(
        "figures in {0}/demo.json, charts in {0}/demo.svg and {0}/demo-age.svg",
        args.out.display()
    );
    Ok(())
}
