//! A restart in the middle of catch-up — the consumer dropped without close, and a child
//! process killed with SIGKILL: the records buffered on disk are reused, not refetched (what
//! only the memory tier held is fetched again), nothing local is discarded; after the merge
//! the group's committed offset equals the log end and the side entry is gone.
//!
//! What waits on disk is the live lane's: fresh records produced once the split started wait
//! behind the backlog (`Ordered`), beyond what the memory tier holds. The catch-up lane reads
//! only a little ahead of its reader, in memory, and is fetched again.

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

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
        let delivery = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .expect("delivery in time")
            .expect("recv");
        offsets.push(delivery.offset);
        if say {
            println!("processed {}", delivery.offset);
        }
        consumer.ack(&delivery);
    }
    consumer.commit().await.expect("commit");
    offsets
}

/// The second life: resumes the split with the local records, finishes, merges.
async fn resume_and_finish(kafka: &Kafka, topic: &str, group: &str, dir: &Path, first_run: &[i64]) {
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
        live.records > 0 && live.fetched_next > BACKLOG as i64,
        "local records reused: {live:?}"
    );

    kafka.produce_from(topic, 1, BACKLOG + FRESH, LATER).await;
    let end = (BACKLOG + FRESH + LATER) as i64;
    let mut second = BTreeSet::new();
    let mut previous = committed - 1;
    while !second.contains(&(end - 1)) {
        let delivery = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .expect("delivery in time")
            .expect("recv");
        assert!(delivery.offset > previous, "Ordered: strictly increasing");
        previous = delivery.offset;
        assert_eq!(
            delivery.lane,
            if delivery.offset < BACKLOG as i64 {
                DeliveryLane::Catchup
            } else {
                DeliveryLane::Live
            }
        );
        second.insert(delivery.offset);
        consumer.ack(&delivery);
    }
    assert_eq!(
        second,
        (committed..end).collect(),
        "every offset from the commit on, once"
    );
    assert!(
        !std::iter::from_fn(|| events.try_recv().ok())
            .any(|e| matches!(e, Event::LocalDiscarded { .. })),
        "the local buffer was discarded"
    );
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
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

/// The child of the SIGKILL test: consumes, acks, commits, and reports each commit.
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
        loop {
            let offsets = process(&consumer, 50, true).await;
            println!("committed {}", offsets.iter().max().map_or(0, |m| m + 1));
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
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
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
    let lines = tokio::time::timeout(WAIT, split)
        .await
        .expect("the child's split")
        .expect("join");
    kafka.produce_from(&topic, 1, BACKLOG, FRESH).await;
    let progress = tokio::task::spawn_blocking(move || {
        let mut lines = lines;
        for line in lines.by_ref() {
            let line = line.expect("child output");
            if let Some(committed) = line
                .strip_prefix("committed ")
                .and_then(|n| n.parse::<i64>().ok())
            {
                if committed >= FIRST_RUN as i64 {
                    return lines;
                }
            }
        }
        panic!("the child stopped before committing {FIRST_RUN} records");
    });
    let rest = tokio::time::timeout(Duration::from_secs(120), progress)
        .await
        .expect("child progress")
        .expect("join");
    // Killed while it goes on processing (and its background commits with it): what it
    // printed up to its death bounds what the group may hold.
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let processed = rest
        .map_while(Result::ok)
        .filter_map(|line| line.strip_prefix("processed ")?.parse::<i64>().ok())
        .max()
        .unwrap_or(FIRST_RUN as i64 - 1);
    let first_run: Vec<i64> = (0..=processed.max(FIRST_RUN as i64 - 1)).collect();
    resume_and_finish(&kafka, &topic, &group, dir.path(), &first_run).await;
}
