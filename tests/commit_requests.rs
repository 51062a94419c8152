//! A commit cycle asks the group coordinator once, whatever the number of partitions: one
//! OffsetCommit carrying every partition's offset and metadata, not one request per
//! partition one after the other (each a round trip). So does an assignment that starts a
//! split on every partition, inside the rebalance callback, whose time counts against
//! `max.poll.interval.ms`. Counted from librdkafka's own statistics of the group member.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use catchup::{ClientHooks, Event, Mode};
use support::{Kafka, test_config, unique, wait_for_event};

const PARTITIONS: i32 = 8;
const PER_PARTITION: usize = 50;
const WAIT: Duration = Duration::from_secs(60);

/// The group member's statistics: how many were seen, and the OffsetCommit requests the
/// last one counted (over every broker).
#[derive(Default)]
struct Requests(Mutex<(u64, i64)>);

impl Requests {
    fn get(&self) -> (u64, i64) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The OffsetCommit count of the first statistics report counting at least `least`
    /// (a report is a snapshot: one queued before a commit may be served after it), then of
    /// the second report after that one.
    async fn count_from(&self, least: i64) -> i64 {
        let deadline = Instant::now() + WAIT;
        while self.get().1 < least {
            assert!(
                Instant::now() < deadline,
                "no statistics counting {least} OffsetCommit requests"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.next_count().await
    }

    /// The OffsetCommit count of a statistics report emitted after this call.
    async fn next_count(&self) -> i64 {
        let (seen, _) = self.get();
        let deadline = Instant::now() + WAIT;
        // Two reports on: the first may have been on its way already.
        while self.get().0 < seen + 2 {
            assert!(
                Instant::now() < deadline,
                "no statistics from the group member"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.get().1
    }
}

impl ClientHooks for Requests {
    fn statistics(&self, role: &str, json: &[u8]) {
        if role != "live" {
            return;
        }
        let Ok(statistics) = serde_json::from_slice::<catchup::rdkafka::Statistics>(json) else {
            return;
        };
        let commits = statistics
            .brokers
            .values()
            .filter_map(|broker| broker.req.get("OffsetCommit"))
            .sum();
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = (slot.0 + 1, commits);
    }
}

/// A topic of `PARTITIONS` partitions with `PER_PARTITION` records in each.
async fn eight_partitions(kafka: &Kafka, name: &str) -> String {
    let topic = unique(name);
    kafka.create_topic(&topic, PARTITIONS).await;
    for partition in 0..PARTITIONS {
        kafka.produce_to(&topic, partition, 0, PER_PARTITION).await;
    }
    topic
}

/// An `Ordered` consumer of `group` splitting at `min_lag`, whose group member's statistics
/// come every 100 ms to the returned counter. Only the commits a test asks for: no periodic
/// one in between.
fn counted_consumer(
    kafka: &Kafka,
    group: &str,
    dir: &std::path::Path,
    min_lag: u64,
) -> (catchup::CatchupConsumer, Arc<Requests>) {
    let requests = Arc::new(Requests::default());
    let config = test_config(dir, Mode::Ordered, min_lag)
        .hooks(requests.clone())
        .commit_interval(Duration::from_secs(3600));
    let mut client = kafka.consumer_config(group);
    client.set("statistics.interval.ms", "100");
    let consumer = catchup::CatchupConsumer::new(&client, config).expect("catchup consumer");
    (consumer, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_offset_commit_per_cycle_for_eight_partitions() {
    let kafka = Kafka::connect();
    let topic = eight_partitions(&kafka, "commit-requests").await;
    let group = unique("commit-requests-group");
    let dir = tempfile::tempdir().expect("tempdir");
    let (consumer, requests) = counted_consumer(&kafka, &group, dir.path(), u64::MAX);
    consumer.subscribe(&[&topic]).expect("subscribe");
    for _ in 0..PARTITIONS as usize * PER_PARTITION {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        consumer.ack(&delivery);
    }

    let before = requests.next_count().await;
    consumer.commit().await.expect("commit");
    let after = requests.next_count().await;
    eprintln!(
        "one commit cycle of {PARTITIONS} partitions: {} OffsetCommit requests",
        after - before
    );
    assert_eq!(after - before, 1, "OffsetCommit requests in one cycle");
    assert_eq!(
        kafka.committed(&group, &topic, PARTITIONS),
        vec![Some(PER_PARTITION as i64); PARTITIONS as usize]
    );
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_offset_commit_for_an_assignment_that_splits_eight_partitions() {
    let kafka = Kafka::connect();
    let topic = eight_partitions(&kafka, "assign-requests").await;
    let group = unique("assign-requests-group");
    // Every partition has a backlog of 50 behind the group's offset: each is split, and its
    // assignment commits the split's token.
    kafka.commit_as_operator(&group, &topic, &[0; PARTITIONS as usize]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (consumer, requests) = counted_consumer(&kafka, &group, dir.path(), 10);
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut split = std::collections::BTreeSet::new();
    while split.len() < PARTITIONS as usize {
        if let Event::SplitStarted { partition, .. } = wait_for_event(&mut events, WAIT, |e| {
            matches!(e, Event::SplitStarted { .. })
        })
        .await
        {
            split.insert(partition);
        }
    }

    // Nothing was read, so nothing else commits: every request counted is the assignment's.
    let commits = requests.count_from(1).await;
    eprintln!("an assignment splitting {PARTITIONS} partitions: {commits} OffsetCommit requests");
    assert_eq!(commits, 1, "OffsetCommit requests of the assignment");
    // The splits work: every record, in order per partition.
    let mut next = [0i64; PARTITIONS as usize];
    for _ in 0..PARTITIONS as usize * PER_PARTITION {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        let slot = &mut next[delivery.partition as usize];
        assert_eq!(
            delivery.offset, *slot,
            "partition {} in order",
            delivery.partition
        );
        *slot += 1;
        consumer.ack(&delivery);
    }
    consumer.close().await.expect("close");
}
