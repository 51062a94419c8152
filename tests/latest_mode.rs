//! `catchup run --mode latest` on a compacted topic with Zipf-distributed keys: a backlog
//! behind the group's commit, updates of the same keys arriving while it catches up, a
//! SIGKILL in the middle of the catch-up once the live lane's progress is checkpointed in the
//! side topic, then a second run to the end. From the sinks (in the order they processed):
//!
//! * per key, the last value processed is the log's latest (what a table fed by upserts
//!   ends with) — the restart must not let the backlog's older values overwrite the live
//!   values the first run processed and checkpointed;
//! * within a run and an assignment, the offsets processed per key only increase;
//! * superseded records were skipped: fewer records processed than the log holds.
//!
//! With the key index's rebuild taken out (a restarted split trusting an empty index), the
//! second run processes backlog values older than the live values the first run checkpointed,
//! and the first check fails.

mod support;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use support::cli::{sink_lines, wait_with_deadline};
use support::zipf::Zipf;
use support::{Kafka, side_value, unique};
use tokio::time::Instant;

const PARTITIONS: i32 = 2;
/// Records per partition behind the group's commit, over `KEYS` keys (Zipf 1.1).
const BACKLOG: usize = 6_000;
const KEYS: usize = 1_000;
/// Updates per partition produced once the split started (fresh: the live lane).
const UPDATES: usize = 300;
const WAIT: Duration = Duration::from_secs(90);
const SIDE_TOPIC: &str = "__catchup_side";

fn spawn(brokers: &str, topic: &str, group: &str, dir: &Path, life: usize, idle: bool) -> Child {
    let log = std::fs::File::create(dir.join(format!("life-{life}.log"))).expect("log file");
    let idle = &["--exit-when-idle", "4"][..if idle { 2 } else { 0 }];
    Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args(["run", "--mode", "latest", "--min-lag", "500"])
        .args(["--brokers", brokers, "--topic", topic, "--group", group])
        // Slow processing: the catch-up lasts seconds, the kill lands inside it.
        .args(["--process-us", "3000", "--commit-interval-ms", "200"])
        .arg("--buffer-dir")
        .arg(dir.join("buffer"))
        .arg("--sink")
        .arg(dir.join(format!("sink-{life}.jsonl")))
        .args(idle)
        .env("RUST_LOG", "catchup=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn catchup run")
}

/// `b=` and `l=` of the side entry under `key`, if there is one.
fn side_boundary_and_live(kafka: &Kafka, key: &str) -> Option<(i64, i64)> {
    let value = side_value(kafka, SIDE_TOPIC, key)?;
    let field = |name: &str| -> Option<i64> {
        value
            .split(' ')
            .find_map(|field| field.strip_prefix(name))?
            .parse()
            .ok()
    };
    Some((field("b=")?, field("l=")?))
}

/// A sink line: partition, offset, key, value, lane, assignment.
struct Processed {
    partition: i32,
    offset: i64,
    key: String,
    value: String,
    lane: String,
    assignment: u64,
}

fn processed(sink: &Path) -> Vec<Processed> {
    sink_lines(sink)
        .iter()
        .map(|line| {
            let text = |name: &str| line[name].as_str().expect(name).to_owned();
            let number = |name: &str| line[name].as_u64().expect(name);
            Processed {
                partition: number("partition") as i32,
                offset: number("offset") as i64,
                key: text("key"),
                value: text("value"),
                lane: text("lane"),
                assignment: number("assignment"),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn latest_ends_with_every_keys_latest_value_across_a_sigkill() {
    let kafka = Kafka::connect();
    let brokers = support::bootstrap();
    let topic = unique("latest");
    let group = unique("latest-group");
    kafka
        .create_topic_with(&topic, PARTITIONS, &[("cleanup.policy", "compact")])
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let zipf = Zipf::new(KEYS, 1.1);
    let mut rng = StdRng::seed_from_u64(0x1a7e57);
    // The log, per partition: (key, value) at each offset (one producer, in order).
    let mut log: Vec<Vec<(String, String)>> = vec![Vec::new(); PARTITIONS as usize];
    let mut produce = |count: usize, what: &str, rng: &mut StdRng| {
        let mut batches = Vec::new();
        for (partition, records) in log.iter_mut().enumerate() {
            let batch: Vec<(String, String)> = (0..count)
                .map(|n| {
                    let key = format!("key-{}", zipf.sample(rng));
                    let value = format!("{what}-{partition}-{}", records.len() + n);
                    (key, value)
                })
                .collect();
            records.extend(batch.iter().cloned());
            batches.push((partition as i32, batch));
        }
        batches
    };
    for (partition, batch) in produce(BACKLOG, "backlog", &mut rng) {
        kafka.produce_keyed(&topic, partition, &batch).await;
    }
    kafka.commit_as_operator(&group, &topic, &vec![0; PARTITIONS as usize]);

    // First run: once both partitions are split, fresh updates of the same keys arrive.
    let first = spawn(&brokers, &topic, &group, dir.path(), 1, false);
    let side_keys: Vec<String> = (0..PARTITIONS)
        .map(|p| catchup::plan::side_key(&group, &topic, p))
        .collect();
    let deadline = Instant::now() + WAIT;
    while !side_keys
        .iter()
        .all(|key| side_boundary_and_live(&kafka, key).is_some())
    {
        assert!(Instant::now() < deadline, "no split within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (partition, batch) in produce(UPDATES, "update", &mut rng) {
        kafka.produce_keyed(&topic, partition, &batch).await;
    }
    // The kill waits for the live lane's progress in the side topic (it is what a restart
    // resumes from, never processing those records again).
    let updates_end = (BACKLOG + UPDATES) as i64;
    while !side_keys
        .iter()
        .all(|key| side_boundary_and_live(&kafka, key).is_some_and(|(_, live)| live >= updates_end))
    {
        assert!(
            Instant::now() < deadline,
            "the live lane's progress did not reach the side topic within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut first = first;
    first.kill().expect("SIGKILL");
    let status = first.wait().expect("wait");
    assert_eq!(status.signal(), Some(9), "the first run was killed");
    let committed = kafka.committed(&group, &topic, PARTITIONS);
    let boundary = side_boundary_and_live(&kafka, &side_keys[0]).map(|(b, _)| b);
    assert!(
        committed
            .iter()
            .zip(&side_keys)
            .any(|(g, key)| side_boundary_and_live(&kafka, key)
                .is_some_and(|(b, _)| g.unwrap_or(0) < b)),
        "the kill must land inside the catch-up (committed {committed:?}, boundary {boundary:?})"
    );

    // Second run, to the end.
    let second = spawn(&brokers, &topic, &group, dir.path(), 2, true);
    let output = wait_with_deadline(second, Duration::from_secs(120));
    assert!(
        output.status.success(),
        "the second run failed: {}; its log ends:\n{}",
        output.status,
        std::fs::read_to_string(dir.path().join("life-2.log")).unwrap_or_default()
    );

    // The scenario is the one the rebuild exists for: the second run read the keys again.
    let second_log = std::fs::read_to_string(dir.path().join("life-2.log")).unwrap_or_default();
    assert!(
        second_log.contains("key index rebuilt"),
        "the second run never rebuilt a key index; its log:\n{second_log}"
    );
    for line in second_log.lines().filter(|line| {
        line.contains("reading again the keys") || line.contains("key index rebuilt")
    }) {
        eprintln!("latest_mode, second run: {line}");
    }

    // Per key, the value processed last (first run, then second) is the log's latest.
    let runs = [
        processed(&dir.path().join("sink-1.jsonl")),
        processed(&dir.path().join("sink-2.jsonl")),
    ];
    let mut state: HashMap<(i32, String), (i64, String)> = HashMap::new();
    let mut count = 0;
    for (run, lines) in runs.iter().enumerate() {
        let mut newest: HashMap<(i32, u64, &str), i64> = HashMap::new();
        for line in lines {
            count += 1;
            let (key, value) = &log[line.partition as usize][line.offset as usize];
            assert_eq!(
                (&line.key, &line.value),
                (key, value),
                "run {run}: not the record produced at {}/{}",
                line.partition,
                line.offset
            );
            let before = newest.insert((line.partition, line.assignment, &line.key), line.offset);
            assert!(
                before.is_none_or(|before| before < line.offset),
                "run {run}: {} of partition {} processed at {} after {before:?} in one assignment ({} lane)",
                line.key,
                line.partition,
                line.offset,
                line.lane
            );
            state.insert(
                (line.partition, line.key.clone()),
                (line.offset, line.value.clone()),
            );
        }
    }
    let mut keys = 0;
    for (partition, records) in log.iter().enumerate() {
        let mut latest: HashMap<&str, (i64, &str)> = HashMap::new();
        for (offset, (key, value)) in records.iter().enumerate() {
            latest.insert(key, (offset as i64, value));
        }
        for (key, (offset, value)) in latest {
            keys += 1;
            let ended = state.get(&(partition as i32, key.to_owned()));
            assert_eq!(
                ended.map(|(o, v)| (*o, v.as_str())),
                Some((offset, value)),
                "key {key} of partition {partition} ends with another value than the log's latest"
            );
        }
    }
    let records = log.iter().map(Vec::len).sum::<usize>();
    assert!(
        count < records,
        "superseded records are skipped: {count} processed of {records}"
    );
    eprintln!(
        "latest_mode: {records} records over {keys} keys; {} + {} processed by the two runs, every key ends at its latest value",
        runs[0].len(),
        runs[1].len()
    );
}
