//! The application's hooks into catchup's clients, where with plain rdkafka it would write a
//! `ClientContext`: librdkafka's statistics from the group member and the catch-up consumer
//! (each named by its role), the assignment once reconciled, and the revocation before its
//! commit.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use catchup::{ClientHooks, Mode};
use support::{Kafka, test_config, unique};

const WAIT: Duration = Duration::from_secs(60);
/// Over both partitions: 5,000 each, more than one poll round of the catch-up consumer takes
/// from a partition's queue (2,000), so the lane waits for the reader and its consumer lives
/// (and reports) until then. With 1,000 a partition one round now and then fetched a whole
/// lane, and the consumer left before its first report.
const BACKLOG: usize = 10_000;

#[derive(Default)]
struct Seen {
    /// Roles whose statistics parsed as rdkafka's `Statistics`.
    statistics: BTreeSet<String>,
    /// Statistics that did not parse.
    unparsed: usize,
    assigned: Vec<(String, i32)>,
    revoking: Vec<(Vec<(String, i32)>, bool)>,
}

#[derive(Default)]
struct Recorder(Mutex<Seen>);

impl Recorder {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ClientHooks for Recorder {
    fn statistics(&self, role: &str, json: &[u8]) {
        let mut seen = self.seen();
        match serde_json::from_slice::<catchup::rdkafka::Statistics>(json) {
            Ok(_) => {
                seen.statistics.insert(role.to_owned());
            }
            Err(_) => seen.unparsed += 1,
        }
    }

    fn assigned(&self, partitions: &[(String, i32)]) {
        self.seen().assigned.extend_from_slice(partitions);
    }

    fn revoking(&self, partitions: &[(String, i32)], lost: bool) {
        self.seen().revoking.push((partitions.to_vec(), lost));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_see_statistics_assignments_and_revocations() {
    let kafka = Kafka::connect();
    let topic = unique("hooks");
    kafka.create_topic(&topic, 2).await;
    kafka.produce(&topic, 2, BACKLOG).await;
    let group = unique("hooks-group");
    // A backlog behind the group: the member splits and the catch-up consumer runs too.
    kafka.commit_as_operator(&group, &topic, &[0, 0]);
    let recorder = Arc::new(Recorder::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = test_config(dir.path(), Mode::Concurrent, 100)
        .auto_ack(true)
        .hooks(recorder.clone())
        // Small enough that the catch-up lane pauses until records are processed: its
        // consumer lives (and reports) until then.
        .buffer_budget_bytes(64 << 10);
    let mut client = kafka.consumer_config(&group);
    client.set("statistics.interval.ms", "100");
    let consumer = catchup::CatchupConsumer::new(&client, config).expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");

    let both = ["catchup".to_owned(), "live".to_owned()];
    let deadline = Instant::now() + WAIT;
    while !both
        .iter()
        .all(|role| recorder.seen().statistics.contains(role))
    {
        assert!(
            Instant::now() < deadline,
            "statistics from {:?} only",
            recorder.seen().statistics
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut delivered = 0;
    while delivered < BACKLOG {
        support::next_delivery(&consumer, WAIT).await;
        delivered += 1;
    }
    consumer.close().await.expect("close");

    let seen = recorder.seen();
    assert_eq!(
        seen.unparsed, 0,
        "every report parses as rdkafka's Statistics"
    );
    let mut assigned = seen.assigned.clone();
    assigned.sort();
    assert_eq!(assigned, vec![(topic.clone(), 0), (topic.clone(), 1)]);
    // Closing revokes both partitions, before the final commit, and they were not lost.
    let revoked: BTreeSet<(String, i32)> = seen
        .revoking
        .iter()
        .flat_map(|(partitions, lost)| {
            assert!(!lost, "a clean close loses nothing");
            partitions.iter().cloned()
        })
        .collect();
    assert_eq!(revoked.len(), 2, "{:?}", seen.revoking);
}
