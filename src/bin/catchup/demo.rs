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
use crate::run::{Processing, client_config, process};

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
}

impl Outcome {
    fn records_per_second(&self) -> f64 {
        self.processed as f64 / self.drained.as_secs_f64().max(1e-9)
    }
}

fn runtime_error(what: &str) -> impl Fn(rdkafka::error::KafkaError) -> Failure + '_ {
    move |err| Failure::Runtime(format!("{what}: {err}"))
}

/// The bootstrap address: the one given, or the repository's broker, started on demand.
fn brokers(given: Option<String>) -> Result<String, Failure> {
    if let Some(brokers) = given {
        return Ok(brokers);
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
    eprintln!("starting the local broker ({} start)", script.display());
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
    Ok(bootstrap)
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
    let consumer: BaseConsumer = client_config(brokers, group, &[])
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
    let consumer: BaseConsumer = client_config(brokers, "catchup-demo-watermarks", &[])
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
    let config = CatchupConfig {
        mode,
        min_lag: 1000,
        ..CatchupConfig::new(buffer_dir.path())
    };

    let stop_fresh = Arc::new(AtomicBool::new(false));
    let fresh = fresh_producer(
        producer(brokers)?,
        topic.to_owned(),
        args.partitions,
        args.fresh_per_second,
        stop_fresh.clone(),
    );
    let started = Instant::now();
    let consumer = CatchupConsumer::new(&client_config(brokers, &group, &[]), config)
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
        sink: None,
        exit_when_idle: None,
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

fn write_chart(path: &Path, outcomes: &[Outcome]) -> Result<(), Failure> {
    use plotters::prelude::*;
    let chart_error =
        |e: &dyn std::fmt::Display| Failure::Runtime(format!("drawing {}: {e}", path.display()));
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| chart_error(&e))?;
    let longest = outcomes
        .iter()
        .map(|o| o.drained.as_secs_f64())
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "time to first fresh record vs. time to drain the backlog",
            ("sans-serif", 18),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..outcomes.len() as f64, 0f64..longest)
        .map_err(|e| chart_error(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(outcomes.len())
        .x_label_formatter(&|x| {
            outcomes
                .get(x.floor() as usize)
                .map_or(String::new(), |o| o.mode.to_owned())
        })
        .y_desc("seconds after the restart")
        .draw()
        .map_err(|e| chart_error(&e))?;
    let bars = |offset: f64, value: fn(&Outcome) -> f64, color: RGBColor| {
        outcomes.iter().enumerate().map(move |(i, o)| {
            let x = i as f64 + offset;
            Rectangle::new([(x, 0.0), (x + 0.35, value(o))], color.filled())
        })
    };
    chart
        .draw_series(bars(
            0.12,
            |o| o.first_fresh.map_or(0.0, |d| d.as_secs_f64()),
            RGBColor(46, 139, 87),
        ))
        .map_err(|e| chart_error(&e))?
        .label("first fresh record")
        .legend(|(x, y)| {
            Rectangle::new(
                [(x, y - 5), (x + 10, y + 5)],
                RGBColor(46, 139, 87).filled(),
            )
        });
    chart
        .draw_series(bars(
            0.52,
            |o| o.drained.as_secs_f64(),
            RGBColor(70, 110, 180),
        ))
        .map_err(|e| chart_error(&e))?
        .label("backlog drained")
        .legend(|(x, y)| {
            Rectangle::new(
                [(x, y - 5), (x + 10, y + 5)],
                RGBColor(70, 110, 180).filled(),
            )
        });
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()
        .map_err(|e| chart_error(&e))?;
    root.present().map_err(|e| chart_error(&e))
}

/// `catchup demo`.
pub async fn demo(args: DemoArgs) -> Result<(), Failure> {
    if args.partitions < 1 || args.backlog == 0 {
        return Err(Failure::Usage(
            "--partitions and --backlog must be positive".into(),
        ));
    }
    let brokers = brokers(args.brokers.clone())?;
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
    println!(
        "figures in {0}/demo.json, chart in {0}/demo.svg",
        args.out.display()
    );
    Ok(())
}
