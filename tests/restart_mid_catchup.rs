//! A restart in the middle of catch-up — the consumer dropped without close, and a child
//! process killed with SIGKILL: the records buffered on disk are reused, not refetched (what
//! only the memory tier held is fetched again), nothing local is discarded; after the merge
//! the group's committed offset equals the log end and the side entry is gone.
//!
//! What waits on disk is the live lane's: fresh records produced once the split started wait
//! behind the backlog (`Ordered`), beyond what the memory tier holds. The catch-up lane reads
//! ahead of its reader at most half its share (16 KiB here, what the tier holds), in memory,
//! and is fetched again.

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use catchup::store::{Buffer, BufferOptions};
use catchup::{CatchupConfig, CatchupConsumer, DeliveryLane, Event, Mode};
use support::{Kafka, catchup_consumer, side_value, unique, wait_for_event};

const BACKLOG: usize = 3000;
const FIRST_RUN: usize = 400;
/// Fresh records produced once the first life's split started: far more than the memory tier
/// holds.
const FRESH: usize = 1000;
/// Fresh records produced after the restart.
const LATER: usize = 10;
const WAIT: Duration = Duration::from_secs(60);

/// A byte budget of 64 KiB: the buffer's memory tier holds 16 KiB, so most of the fresh
/// records the first life fetched behind its backlog wait on disk — what a restart reuses
/// (what only memory held is fetched again). A lag of 2,000 splits the backlog, not the
/// fresh records behind it: a live lane that far behind at the restart would be split again,
/// under a new epoch, and the local records discarded (DESIGN §5).
fn config(dir: &Path) -> CatchupConfig {
    CatchupConfig::new(dir)
        .mode(Mode::Ordered)
        .min_lag(2000)
        .commit_interval(Duration::from_millis(100))
        .buffer_budget_bytes(64 << 10)
}

/// Processes `count` records (acking each) and commits; returns the offsets. With `say`,
/// each offset is printed before it is acknowledged (the SIGKILL test's child: what it
/// printed bounds what the group may have committed).
async fn process(consumer: &CatchupConsumer, count: usize, say: bool) -> Vec<i64> {
    let mut offsets = Vec::new();
    while offsets.len() < count {
        let delivery = support::next_delivery(consumer, WAIT).await;
        offsets.push(delivery.offset);
        if say {
            println!("processed {}", delivery.offset);
        }
        consumer.ack(&delivery);
    }
    consumer.commit().await.expect("commit");
    offsets
}

/// The live lane's records on disk in `dir`, the first life gone (read offline: nothing of
/// the memory tier is counted), and the highest of them.
fn live_records_on_disk(dir: &Path) -> (u64, Option<i64>) {
    let buffer = Buffer::open(dir, BufferOptions::default()).expect("open the buffer offline");
    let stats = buffer.stats().expect("stats");
    let live = stats
        .partitions
        .first()
        .map(|partition| &partition.lanes[1]);
    let on_disk = live.map_or((0, None), |live| {
        assert_eq!(live.memory_records, 0, "opened anew: nothing in memory");
        (live.records, live.last_offset)
    });
    buffer.close().expect("close the buffer");
    on_disk
}

/// The second life: resumes the split with the local records, finishes, merges.
async fn resume_and_finish(kafka: &Kafka, topic: &str, group: &str, dir: &Path, first_run: &[i64]) {
    let (on_disk, last) = live_records_on_disk(dir);
    eprintln!("the first life left {on_disk} live records on disk, up to {last:?}");
    assert!(
        on_disk > 0 && last >= Some(BACKLOG as i64),
        "the first life left fresh records on disk: {on_disk}, up to {last:?}"
    );
    let committed = kafka.committed(group, topic, 1)[0].expect("the first run committed");
    assert!(committed > 0 && committed <= first_run.iter().max().map_or(0, |m| m + 1));

    let consumer = catchup_consumer(kafka, group, config(dir));
    let mut events = consumer.events();
    consumer.subscribe(&[topic]).expect("subscribe");
    let resumed = wait_for_event(&mut events, WAIT, |e| {
        matches!(
            e,
            Event::SplitResumed { .. } | Event::SplitStarted { .. } | Event::LocalDiscarded { .. }
        )
    })
    .await;
    assert!(
        matches!(resumed, Event::SplitResumed { epoch: 1, .. }),
        "{resumed:?}"
    );
    let buffered = consumer.buffers().expect("buffers");
    let (catchup, live) = (&buffered[0].catchup, &buffered[0].live);
    assert_eq!(
        catchup.processed_next, committed,
        "the buffer starts where Kafka's commit is"
    );
    assert!(
        live.records >= on_disk && live.fetched_next > last.unwrap_or(0),
        "the records on disk reused: {live:?}"
    );

    kafka.produce_from(topic, 1, BACKLOG + FRESH, LATER).await;
    let end = (BACKLOG + FRESH + LATER) as i64;
    let mut second = BTreeSet::new();
    let mut previous = committed - 1;
    while !second.contains(&(end - 1)) {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        assert!(delivery.offset > previous, "Ordered: strictly increasing");
        previous = delivery.offset;
        // Fresh records come from the live lane, or, once the split merged (commits come
        // as soon as the reader brings them forward), from the partition no longer split.
        if delivery.offset < BACKLOG as i64 {
            assert_eq!(delivery.lane, DeliveryLane::Catchup);
        } else {
            assert!(
                matches!(delivery.lane, DeliveryLane::Live | DeliveryLane::Plain),
                "offset {}: {:?}",
                delivery.offset,
                delivery.lane
            );
        }
        second.insert(delivery.offset);
        consumer.ack(&delivery);
    }
    assert_eq!(
        second,
        (committed..end).collect(),
        "every offset from the commit on, once"
    );
    // The merge may have come already (as soon as the reader's commits covered the catch-up
    // lane): the events so far are looked at once, and only a merge not among them awaited.
    let so_far: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert!(
        !so_far
            .iter()
            .any(|e| matches!(e, Event::LocalDiscarded { .. })),
        "the local buffer was discarded"
    );
    if !so_far.iter().any(|e| matches!(e, Event::Merged { .. })) {
        wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    }
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(group, topic, 1),
        vec![Some(end)],
        "merged: G is the log end"
    );
    assert_eq!(
        side_value(kafka, "__catchup_side", &format!("{group}/{topic}/0")),
        None,
        "side entry gone"
    );
    consumer.close().await.expect("close");
}

async fn backlog(kafka: &Kafka) -> (String, String) {
    let topic = unique("restart");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, BACKLOG).await;
    (topic, unique("restart-group"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_without_close_resumes_from_the_buffer() {
    let kafka = Kafka::connect();
    let (topic, group) = backlog(&kafka).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let first_run = {
        let consumer = catchup_consumer(&kafka, &group, config(dir.path()));
        let (_events, split) = support::subscribe_until_split(&consumer, &topic).await;
        assert!(
            matches!(
                split,
                Event::SplitStarted {
                    from: 0,
                    boundary: 3000,
                    ..
                }
            ),
            "{split:?}"
        );
        kafka.produce_from(&topic, 1, BACKLOG, FRESH).await;
        process(&consumer, FIRST_RUN, false).await
        // dropped here without close
    };
    resume_and_finish(&kafka, &topic, &group, dir.path(), &first_run).await;
}

const CHILD: &str = "CATCHUP_RESTART_CHILD";

/// The child of the SIGKILL test: once its split started, processes, acks and commits 50
/// records each time the parent says `more`, and reports each commit with how far its live
/// lane fetched.
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let (topic, group, dir) = (parts[0], parts[1], parts[2]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let kafka = Kafka::connect();
        let consumer = catchup_consumer(&kafka, group, config(Path::new(dir)));
        let (_events, _split) = support::subscribe_until_split(&consumer, topic).await;
        println!("split started");
        for line in std::io::stdin().lines() {
            if line.expect("parent's word") != "more" {
                continue;
            }
            let offsets = process(&consumer, 50, true).await;
            let buffers = consumer.buffers().expect("buffers");
            let live_fetched = buffers.first().map_or(0, |buffer| buffer.live.fetched_next);
            println!(
                "committed {} live {live_fetched}",
                offsets.iter().max().map_or(0, |m| m + 1)
            );
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_catchup_resumes_from_the_buffer() {
    let kafka = Kafka::connect();
    let (topic, group) = backlog(&kafka).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = format!("{topic}|{group}|{}", dir.path().display());
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut to_child = child.stdin.take().expect("child stdin");
    let stdout = child.stdout.take().expect("child stdout");
    let split = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            // The test harness prints the test's name on the line its output starts on.
            if line.expect("child output").ends_with("split started") {
                return lines;
            }
        }
        panic!("the child stopped before its split started");
    });
    let mut lines = tokio::time::timeout(WAIT, split)
        .await
        .expect("the child's split")
        .expect("join");
    kafka.produce_from(&topic, 1, BACKLOG, FRESH).await;
    // Batch by batch, until it committed FIRST_RUN records and its live lane fetched most of
    // the fresh records (beyond what memory holds: spilled); then it waits for a word.
    let progress = tokio::task::spawn_blocking(move || {
        let mut processed = -1;
        loop {
            writeln!(to_child, "more").expect("tell the child");
            let (committed, live) = loop {
                let line = lines
                    .next()
                    .expect("the child stopped")
                    .expect("child output");
                if let Some(offset) = line.strip_prefix("processed ") {
                    processed = processed.max(offset.parse().expect("an offset"));
                } else if let Some(report) = line.strip_prefix("committed ") {
                    let (committed, live) = report.split_once(" live ").expect("a report");
                    break (
                        committed.parse::<i64>().expect("committed"),
                        live.parse::<i64>().expect("live"),
                    );
                }
            };
            if committed >= FIRST_RUN as i64 && live >= (BACKLOG + FRESH / 2) as i64 {
                return (processed, to_child);
            }
        }
    });
    let (processed, _to_child) = tokio::time::timeout(Duration::from_secs(120), progress)
        .await
        .expect("child progress")
        .expect("join");
    // sled writes what the memory tier spilled to its log in the background, every 500 ms;
    // nothing outside the child can await that (the child holds the directory, and the
    // consumer offers no sync), so it is given two of those before the kill. The disk is read
    // after it, and the test holds only if the fresh records are there.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Killed mid-catchup, its fetchers and background commits running: what it printed up to
    // its death bounds what the group may hold.
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let first_run: Vec<i64> = (0..=processed).collect();
    resume_and_finish(&kafka, &topic, &group, dir.path(), &first_run).await;
}
