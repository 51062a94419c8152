//! A SIGKILL loop of the real `catchup run` binary: nothing is lost across crashes.
//!
//! A 3-partition topic gets a backlog of 30,000 records behind a group committed at 0. Then
//! `catchup run` is started again and again on the same group, static member id and buffer
//! directory, each time with a sink of its own, and SIGKILLed after a seeded random 0.25–3 s
//! (log-uniform: short lifetimes die joining or starting to catch up, long ones merging or
//! live). Records are produced while each lifetime runs and between kills (new backlogs). A
//! last lifetime runs with `--exit-when-idle` and must exit 0 in bounded time. From the sinks
//! and the broker:
//!
//! * every produced record was processed at least once, with its key and value;
//! * within a lifetime, offsets strictly increase per partition and assignment (the sink's
//!   `"assignment"`, `Delivery::assignment()`), and per lane in `concurrent` mode; nothing
//!   repeats within one (lifetime, partition, assignment);
//! * no lifetime processes a record below the committed offset it started from; committed
//!   offsets never go back and end at the log end; `catchup verify` accepts the buffer.
//!
//! It prints the seed, the duplicates, and (advisory, from the sinks only) how long each
//! lifetime ran and which lanes it had processed records from when it was killed.
//!
//! ```sh
//! cargo test --test sigkill_loop -- --nocapture                  # 20 kills per mode
//! CATCHUP_SOAK=1 cargo test --test sigkill_loop -- --nocapture   # 200 kills per mode
//! CATCHUP_SIGKILL_SEED=1234 cargo test --test sigkill_loop       # the same random plan
//! ```
//!
//! A failed run keeps its sinks, logs and buffer (the test prints where). A seed fixes the
//! plan (lifetimes, production amounts and moments), not where the kills land.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::RangeInclusive;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use catchup::Mode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use support::{Kafka, Produced, unique};
use tokio::time::Instant;

const PARTITIONS: i32 = 3;
/// Records behind the group's commit before the first lifetime.
const BACKLOG: usize = 30_000;
const KILLS: usize = 20;
const SOAK_KILLS: usize = 200;
/// How long a lifetime runs before its SIGKILL, log-uniform (load timing, not synchronisation).
const LIFETIME_SECS: (f64, f64) = (0.25, 3.0);
/// Records produced at a random moment while a lifetime runs.
const PRODUCE_WHILE_RUNNING: RangeInclusive<usize> = 0..=600;
/// Records produced while no process runs: above 1,500 (500 per partition, `--min-lag`) the
/// next lifetime has a new backlog to split, below it mostly not.
const PRODUCE_WHILE_DOWN: RangeInclusive<usize> = 100..=2_400;
/// The last lifetime (`--exit-when-idle 5`) must have exited by then.
const FINAL_RUN_LIMIT: Duration = Duration::from_secs(120);

/// What every lifetime of one scenario shares.
struct Setup {
    name: &'static str,
    topic: String,
    group: String,
    /// Static membership: a restarted process takes the killed member's place at once instead
    /// of waiting for its session to expire, so the kills spread over catch-up and merges.
    instance: String,
    dir: PathBuf,
    brokers: String,
}

impl Setup {
    fn spawn(&self, life: usize, exit_when_idle: bool) -> Child {
        let log = std::fs::File::create(self.dir.join(format!("life-{life:03}.log")));
        let sink = self.dir.join(format!("sink-{life:03}.jsonl"));
        let idle = &["--exit-when-idle", "5"][..if exit_when_idle { 2 } else { 0 }];
        Command::new(env!("CARGO_BIN_EXE_catchup"))
            .args(["run", "--mode", self.name, "--min-lag", "500"])
            .args(["--brokers", &self.brokers, "--topic", &self.topic])
            .args(["--group", &self.group, "--process-us", "20"])
            .args(["--config", "session.timeout.ms=6000", "--config"])
            .arg(format!("group.instance.id={}", self.instance))
            .arg("--buffer-dir")
            .arg(self.dir.join("buffer"))
            .arg("--sink")
            .arg(sink)
            .args(idle)
            // For the failure messages and the files a failed run keeps; never parsed.
            .env("RUST_LOG", "catchup=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log.expect("create the lifetime's log file")))
            .spawn()
            .expect("spawn catchup run")
    }

    /// The group's committed offsets; every partition has one (committed at 0 to begin with).
    fn committed(&self, kafka: &Kafka) -> Vec<i64> {
        let committed = kafka.committed(&self.group, &self.topic, PARTITIONS);
        let all: Option<Vec<i64>> = committed.into_iter().collect();
        all.unwrap_or_else(|| panic!("group {} lacks a commit", self.group))
    }

    /// The last 40 lines of a lifetime's log, for failure messages.
    fn tail(&self, life: usize) -> String {
        let log = self.dir.join(format!("life-{life:03}.log"));
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(40)..].join("\n")
    }
}

/// One line of a sink: partition, offset, lane, assignment.
type Line = (i32, i64, String, u64);

/// The lines of a lifetime's sink, each checked against what was produced at its offset, and
/// whether its last line was torn. A killed lifetime may leave its last line half written
/// (not yet synced, so not acknowledged): it is dropped. Any other bad line fails the test.
fn read_sink(setup: &Setup, life: usize, killed: bool, expected: &Expected) -> (Vec<Line>, bool) {
    let path = setup.dir.join(format!("sink-{life:03}.jsonl"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && killed => return (vec![], false),
        Err(err) => panic!("reading the sink {}: {err}", path.display()),
    };
    let mut lines: Vec<&str> = text.split('\n').collect();
    let torn = !lines.pop().unwrap_or_default().is_empty();
    assert!(!torn || killed, "{}: partial last line", path.display());
    let parse = |line: &&str| {
        let bad = |what: &str| -> ! { panic!("{}: {what}: {line}", path.display()) };
        let json: Value = serde_json::from_str(line).unwrap_or_else(|_| bad("not JSON"));
        let text = |name| json[name].as_str().unwrap_or_else(|| bad(name));
        let number = |name| json[name].as_u64().unwrap_or_else(|| bad(name));
        let (partition, offset) = (number("partition") as i32, number("offset") as i64);
        let Some(record) = expected.get(&(partition, offset)) else {
            bad("never produced")
        };
        if (text("key").as_bytes(), text("value").as_bytes()) != (&record.key, &record.payload) {
            bad("not the key and value produced")
        }
        let (lane, assignment) = (text("lane").to_owned(), number("assignment"));
        (partition, offset, lane, assignment)
    };
    (lines.iter().map(parse).collect(), torn)
}

type Expected<'a> = HashMap<(i32, i64), &'a Produced>;

/// Runs the lifetimes: `kills` killed ones, then one that exits when idle; returns, for each,
/// the committed offsets it started from and how long it ran. Adds what it produces to
/// `produced`.
async fn run_lifetimes(
    kafka: &Kafka,
    setup: &Setup,
    produced: &mut Vec<Produced>,
    seed: u64,
) -> Vec<(Vec<i64>, Duration)> {
    let soak = std::env::var("CATCHUP_SOAK").is_ok_and(|v| v.trim() == "1");
    let kills = if soak { SOAK_KILLS } else { KILLS };
    let (name, topic) = (setup.name, setup.topic.as_str());
    let dir = setup.dir.display();
    eprintln!("sigkill_loop[{name}]: {kills} kills, files in {dir}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut lifetimes: Vec<(Vec<i64>, Duration)> = Vec::new();
    for life in 0..=kills {
        let now = setup.committed(kafka);
        if let Some((before, _)) = lifetimes.last() {
            let forward = before.iter().zip(&now).all(|(b, n)| n >= b);
            assert!(forward, "[{name}] committed went back: {before:?}, {now:?}");
        }
        let begun = Instant::now();
        let mut child = setup.spawn(life, life == kills);
        let failed = |what: String| -> ! {
            let log = setup.tail(life);
            panic!("[{name}] lifetime {life} {what} (seed {seed}); its log ends:\n{log}")
        };
        if life == kills {
            let status = loop {
                if let Some(status) = child.try_wait().expect("try_wait on catchup run") {
                    break status;
                }
                if begun.elapsed() > FINAL_RUN_LIMIT {
                    let _ = child.kill();
                    let _ = child.wait();
                    failed(format!("did not exit when idle within {FINAL_RUN_LIMIT:?}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            if !status.success() {
                failed(format!("failed: {status}"));
            }
            lifetimes.push((now, begun.elapsed()));
            break;
        }
        let (shortest, longest) = LIFETIME_SECS;
        let secs = rng.gen_range(shortest.ln()..=longest.ln()).exp();
        let lifetime = Duration::from_secs_f64(secs);
        let produce_at = lifetime.mul_f64(rng.gen_range(0.0..1.0));
        let while_running = rng.gen_range(PRODUCE_WHILE_RUNNING);
        let while_down = rng.gen_range(PRODUCE_WHILE_DOWN);
        tokio::time::sleep_until(begun + produce_at).await;
        let fresh = kafka.produce_from(topic, PARTITIONS, produced.len(), while_running);
        produced.extend(fresh.await);
        tokio::time::sleep_until(begun + lifetime).await;
        if let Some(status) = child.try_wait().expect("try_wait on catchup run") {
            failed(format!("exited by itself ({status}) before its SIGKILL"));
        }
        child.kill().expect("SIGKILL catchup run");
        let status = child.wait().expect("reap catchup run");
        if status.signal() != Some(libc::SIGKILL) {
            failed(format!("ended with {status}, not by the SIGKILL"));
        }
        lifetimes.push((now, begun.elapsed()));
        let backlog = kafka.produce_from(topic, PARTITIONS, produced.len(), while_down);
        produced.extend(backlog.await);
    }
    lifetimes
}

async fn scenario(mode: Mode, name: &'static str) {
    let started = Instant::now();
    let seed = match std::env::var("CATCHUP_SIGKILL_SEED") {
        Ok(text) => text.trim().parse().expect("CATCHUP_SIGKILL_SEED: a u64"),
        Err(_) => {
            let nanos = SystemTime::now().duration_since(UNIX_EPOCH);
            nanos.unwrap_or_default().as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
        }
    };
    eprintln!("sigkill_loop[{name}]: seed {seed} (CATCHUP_SIGKILL_SEED={seed} replays the plan)");
    let kafka = Kafka::connect();
    let setup = Setup {
        name,
        topic: unique(&format!("sigkill-{name}")),
        group: unique(&format!("sigkill-{name}-group")),
        instance: unique(&format!("sigkill-{name}-member")),
        // Kept when the test fails; removed when it passes.
        dir: tempfile::tempdir().expect("tempdir").keep(),
        brokers: kafka.bootstrap.clone(),
    };
    kafka.create_topic(&setup.topic, PARTITIONS).await;
    let mut produced = kafka.produce(&setup.topic, PARTITIONS, BACKLOG).await;
    kafka.commit_as_operator(&setup.group, &setup.topic, &[0; PARTITIONS as usize]);
    let lifetimes = run_lifetimes(&kafka, &setup, &mut produced, seed).await;

    let expected: Expected = produced
        .iter()
        .map(|r| ((r.partition, r.offset), r))
        .collect();
    assert_eq!(expected.len(), produced.len(), "two records at one offset");
    // Per (partition, offset): how many times it was processed.
    let mut times: HashMap<(i32, i64), usize> = HashMap::new();
    // Advisory: the killed lifetimes, by the lanes they had processed records from.
    let mut kills_by_lanes: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    let (mut torn_lines, mut reassigned) = (0, 0);
    for (life, (committed_before, ran_for)) in lifetimes.iter().enumerate() {
        let killed = life + 1 < lifetimes.len();
        let (lines, torn) = read_sink(&setup, life, killed, &expected);
        torn_lines += usize::from(torn);
        let at = format!("[{name}] lifetime {life:2}");
        let mut last: HashMap<(i32, u64, &str), i64> = HashMap::new();
        let mut seen: HashSet<(i32, u64, i64)> = HashSet::new();
        let mut lanes: BTreeMap<&str, usize> = BTreeMap::new();
        for (p, offset, lane, assignment) in &lines {
            let order_lane = if mode == Mode::Concurrent { lane } else { "" };
            if let Some(previous) = last.insert((*p, *assignment, order_lane), *offset) {
                assert!(
                    *offset > previous,
                    "{at}, p{p}, assignment {assignment}, lane {lane}: offset {offset} after \
                     {previous}, not strictly increasing (seed {seed})"
                );
            }
            // Ordered mode: implied by the order. Concurrent: two lanes handing out one record.
            assert!(
                seen.insert((*p, *assignment, *offset)),
                "{at}: p{p} offset {offset} twice in assignment {assignment} (seed {seed})"
            );
            let floor = committed_before[*p as usize];
            assert!(
                *offset >= floor,
                "{at}: p{p} offset {offset} below the committed {floor} (seed {seed})"
            );
            *times.entry((*p, *offset)).or_default() += 1;
            *lanes.entry(lane).or_default() += 1;
        }
        let assignments: BTreeSet<(i32, u64)> = last.keys().map(|&(p, a, _)| (p, a)).collect();
        let partitions: BTreeSet<i32> = assignments.iter().map(|&(p, _)| p).collect();
        reassigned += assignments.len() - partitions.len();
        let (secs, count, assigned) = (ran_for.as_secs_f64(), lines.len(), assignments.len());
        let end = if killed { "killed" } else { "exited" };
        eprintln!(
            "  {at}: {end} after {secs:4.2} s, {count:5} processed {lanes:?} in {assigned} \
             partition assignment(s)"
        );
        if killed {
            *kills_by_lanes
                .entry(lanes.into_keys().map(str::to_owned).collect())
                .or_default() += 1;
        }
    }
    let duplicates: usize = times.values().map(|&n| n - 1).sum();
    let most = times.values().copied().max().unwrap_or(0);
    eprintln!(
        "sigkill_loop[{name}]: {} lifetimes in {:.1} s, {} records produced, {duplicates} \
         duplicates, a record processed at most {most} times; {torn_lines} torn last line(s); \
         {reassigned} partition(s) assigned again within a lifetime",
        lifetimes.len(),
        started.elapsed().as_secs_f64(),
        produced.len(),
    );
    eprintln!("  kills by the lanes processed before (advisory): {kills_by_lanes:?}");
    let mut missing: Vec<_> = expected
        .keys()
        .filter(|at| !times.contains_key(at))
        .collect();
    missing.sort_unstable();
    assert!(
        missing.is_empty(),
        "[{name}] {} of {} produced records were never processed (seed {seed}), first: {:?}",
        missing.len(),
        produced.len(),
        &missing[..missing.len().min(20)]
    );

    // The group ends at the log end, and the buffer is sound.
    let watermarks = kafka.watermarks(&setup.topic, PARTITIONS);
    let ends: Vec<i64> = watermarks.iter().map(|&(_, high)| high).collect();
    let count = |p: i32| produced.iter().filter(|r| r.partition == p).count() as i64;
    let counts: Vec<i64> = (0..PARTITIONS).map(count).collect();
    assert_eq!(ends, counts, "[{name}] log ends vs records produced");
    let committed = setup.committed(&kafka);
    assert_eq!(committed, ends, "[{name}] committed vs log ends");
    let verify = Command::new(env!("CARGO_BIN_EXE_catchup"))
        .arg("verify")
        .arg(setup.dir.join("buffer"))
        .output()
        .expect("run catchup verify");
    assert!(
        verify.status.success(),
        "[{name}] catchup verify failed (seed {seed}):\n{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    let took = started.elapsed().as_secs_f64();
    eprintln!("sigkill_loop[{name}]: passed in {took:.1} s");
    std::fs::remove_dir_all(&setup.dir).expect("remove the test's files");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loop_ordered_loses_nothing() {
    scenario(Mode::Ordered, "ordered").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loop_concurrent_loses_nothing() {
    scenario(Mode::Concurrent, "concurrent").await;
}
