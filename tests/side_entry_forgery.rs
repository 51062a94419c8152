//! Side entries nobody else can forge. A consumer splits a 5,000-record backlog (epoch 1,
//! boundary 5,000 — both guessable) and crashes with nothing processed; 5,000 fresh records
//! follow. Then someone with write access to the side topic writes an entry under the
//! group's key claiming the backlog or the fresh records done. The restarted consumer must
//! process every record, and say which key it rejected and why.
//!
//! Before entries were bound to the group's commit by a MAC, the first forgery below made
//! the consumer process offsets 4,990–4,999 only, commit 5,000 and exit: 4,990 records
//! skipped without a word.

mod support;

use std::path::Path;
use std::time::Duration;

use catchup::{CatchupConfig, DeliveryLane, Event, Mode};
use support::{Kafka, catchup_consumer, side_value, unique, wait_for_event};

const BACKLOG: usize = 5000;
const FRESH: usize = 5000;
const END: i64 = (BACKLOG + FRESH) as i64;
const MIN_LAG: u64 = 1000;
const WAIT: Duration = Duration::from_secs(60);
const SHARED_SIDE_TOPIC: &str = "__catchup_side";

/// One group's first life: split at `BACKLOG`, crashed with nothing processed.
struct Victim {
    topic: String,
    group: String,
    side_topic: String,
    dir: tempfile::TempDir,
    epoch: u64,
}

impl Victim {
    fn key(&self) -> String {
        format!("{}/{}/0", self.group, self.topic)
    }

    fn config(&self, dir: &Path) -> CatchupConfig {
        support::test_config(dir, Mode::Ordered, MIN_LAG).side_topic(self.side_topic.clone())
    }
}

/// Creates the topic with its backlog and runs the victim's first life (split, then a
/// crash). `side_topic` may be a `{group}` template.
async fn victim(kafka: &Kafka, name: &str, side_topic: &str) -> Victim {
    let topic = unique(name);
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, BACKLOG).await;
    let group = unique(&format!("{name}-group"));
    kafka.commit_as_operator(&group, &topic, &[0]);
    let mut victim = Victim {
        side_topic: side_topic.replace("{group}", &group),
        topic,
        group,
        dir: tempfile::tempdir().expect("tempdir"),
        epoch: 0,
    };
    let config = victim
        .config(victim.dir.path())
        .side_topic(side_topic.to_owned());
    let consumer = catchup_consumer(kafka, &victim.group, config);
    let (_, split) = support::subscribe_until_split(&consumer, &victim.topic).await;
    let Event::SplitStarted {
        epoch,
        from,
        boundary,
        ..
    } = split
    else {
        unreachable!("subscribe_until_split returns a SplitStarted")
    };
    assert_eq!((from, boundary), (0, BACKLOG as i64));
    victim.epoch = epoch;
    drop(consumer); // a crash: nothing acknowledged, nothing committed past 0
    assert_eq!(
        kafka.committed(&victim.group, &victim.topic, 1),
        vec![Some(0)]
    );
    let genuine = side_value(kafka, &victim.side_topic, &victim.key()).expect("side entry");
    assert!(
        genuine.starts_with(&format!(
            "catchup-side/2 e={epoch} b={BACKLOG} l={BACKLOG} r=0-{BACKLOG} m="
        )),
        "{genuine}"
    );
    victim
}

async fn produce_fresh(kafka: &Kafka, victim: &Victim) {
    kafka.produce_from(&victim.topic, 1, BACKLOG, FRESH).await;
}

/// Writes `value` under the victim's key, restarts it on its own buffer directory, and
/// checks that every offset is processed in order, that the rejection names the key and
/// contains `reason`, and that the group ends committed at the log end.
async fn restart_after_forgery(kafka: &Kafka, victim: &Victim, value: &str, reason: &str) {
    let partition = support::side_partition(kafka, &victim.side_topic, &victim.group);
    kafka
        .produce_keyed(
            &victim.side_topic,
            partition,
            &[(victim.key(), value.to_owned())],
        )
        .await;
    assert_eq!(
        side_value(kafka, &victim.side_topic, &victim.key()).as_deref(),
        Some(value),
        "the forgery is the latest entry"
    );
    let consumer = catchup_consumer(kafka, &victim.group, victim.config(victim.dir.path()));
    let mut events = consumer.events();
    consumer.subscribe(&[&victim.topic]).expect("subscribe");
    let rejected = wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::StaleState { what, .. } if what.contains("side entry"))
            || matches!(e, Event::SplitResumed { .. } | Event::Merged { .. })
    })
    .await;
    let Event::StaleState { what, .. } = &rejected else {
        panic!("the forged entry was trusted: {rejected:?}");
    };
    assert!(
        what.contains(&victim.key()) && what.contains(reason),
        "the rejection names the key {} and says {reason:?}: {what}",
        victim.key()
    );

    let mut next = 0i64;
    while next < END {
        let delivery = support::next_delivery_or(&consumer, WAIT, || {
            format!("stalled at offset {next} of {END}")
        })
        .await;
        assert_eq!(
            delivery.offset, next,
            "Ordered: every offset, in order, none skipped"
        );
        if next < BACKLOG as i64 {
            assert_eq!(delivery.lane, DeliveryLane::Catchup, "offset {next}");
        }
        consumer.ack(&delivery);
        next += 1;
    }
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&victim.group, &victim.topic, 1),
        vec![Some(END)]
    );
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_forgery_of_the_old_format_skips_nothing() {
    let kafka = Kafka::connect();
    let victim = victim(&kafka, "forge-v1", SHARED_SIDE_TOPIC).await;
    produce_fresh(&kafka, &victim).await;
    // Exactly what skipped 4,990 records before: only the format version is new.
    let forged = format!(
        "catchup-side/1 e={} b={BACKLOG} l={BACKLOG} r=4990-{BACKLOG}",
        victim.epoch
    );
    restart_after_forgery(&kafka, &victim, &forged, "does not decode").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guessed_mac_skips_nothing_on_a_per_group_side_topic() {
    let kafka = Kafka::connect();
    // One side topic per group: the template names it after the group.
    let victim = victim(&kafka, "forge-mac", "catchup-side-test.{group}").await;
    assert!(victim.side_topic.ends_with(&victim.group));
    produce_fresh(&kafka, &victim).await;
    // The right epoch and boundary and plausible ranges, claiming every fresh record done:
    // only the MAC can tell.
    let forged = format!(
        "catchup-side/2 e={} b={BACKLOG} l={END} r=0-{BACKLOG} m=0123456789abcdef0123456789abcdef",
        victim.epoch
    );
    restart_after_forgery(&kafka, &victim, &forged, "MAC does not verify").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_groups_entry_copied_under_this_key_skips_nothing() {
    let kafka = Kafka::connect();
    let victim = victim(&kafka, "forge-copy", SHARED_SIDE_TOPIC).await;
    // Another group on the same topic, same epoch and boundary, really processes the fresh
    // records and most of its backlog, commits and crashes: its entry is genuine — for it.
    let other_group = unique("forge-copy-other");
    kafka.commit_as_operator(&other_group, &victim.topic, &[0]);
    let other_dir = tempfile::tempdir().expect("tempdir");
    let other = catchup_consumer(
        &kafka,
        &other_group,
        support::test_config(other_dir.path(), Mode::Concurrent, MIN_LAG),
    );
    let (_, split) = support::subscribe_until_split(&other, &victim.topic).await;
    assert!(
        matches!(split, Event::SplitStarted { epoch, boundary, .. } if epoch == victim.epoch && boundary == BACKLOG as i64),
        "the same epoch and boundary as the victim's split: {split:?}"
    );
    produce_fresh(&kafka, &victim).await;
    let (mut catchup_next, mut live_next) = (0i64, BACKLOG as i64);
    while catchup_next < BACKLOG as i64 - 10 || live_next < END {
        let delivery =
            support::next_delivery_or(&other, WAIT, || "the other group stalled".into()).await;
        match delivery.lane {
            DeliveryLane::Catchup if delivery.offset < BACKLOG as i64 - 10 => {
                other.ack(&delivery);
                catchup_next = delivery.offset + 1;
            }
            DeliveryLane::Live => {
                other.ack(&delivery);
                live_next = delivery.offset + 1;
            }
            _ => {}
        }
    }
    other.commit().await.expect("commit");
    let other_key = format!("{other_group}/{}/0", victim.topic);
    let copied = side_value(&kafka, SHARED_SIDE_TOPIC, &other_key).expect("the other entry");
    assert!(
        copied.starts_with(&format!(
            "catchup-side/2 e={} b={BACKLOG} l={END} r={}-{BACKLOG} m=",
            victim.epoch,
            BACKLOG - 10
        )),
        "the other group's genuine entry: {copied}"
    );
    drop(other);
    restart_after_forgery(&kafka, &victim, &copied, "MAC does not verify").await;
}
