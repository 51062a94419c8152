//! A rebalance storm: three members of one group join, leave (close) and crash (drop) every
//! one to two seconds for twenty seconds, while a producer keeps producing on top of a large
//! backlog. Every member acknowledges everything it receives. Afterwards one member runs
//! until every produced offset was delivered; then the group must be committed at the log
//! end of every partition. Once per group protocol: classic eager (`range`), classic
//! cooperative-sticky (the default) and KIP-848 `consumer`.
//!
//! `CATCHUP_STORM_SEED=N` replays the chaos schedule of a seed (the broker's timing is not
//! replayed).

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use catchup::{CatchupConsumer, Event, Mode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::ClientConfig;
use support::{Backlog, Kafka};

const PARTITIONS: i32 = 4;
const BACKLOG: usize = 20_000;
const MIN_LAG: u64 = 500;
const MEMBERS: usize = 3;
const STORM: Duration = Duration::from_secs(20);
/// Records produced per producer round during the storm, and the pause between rounds.
const PRODUCE_BATCH: usize = 40;
const PRODUCE_EVERY: Duration = Duration::from_millis(100);
/// How long the final member may take to deliver everything, merge and commit.
const FINAL_WAIT: Duration = Duration::from_secs(30);
/// Storm members work for `PROCESS_PAUSE` after every `PROCESS_EVERY` records (about 1,000
/// records/s each), so catch-up is still running when members come and go.
const PROCESS_EVERY: usize = 5;
const PROCESS_PAUSE: Duration = Duration::from_millis(5);
/// Bound on `close` and on a crash (drop joins the threads).
const LEAVE_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
enum Protocol {
    Eager,
    CooperativeSticky,
    Consumer,
}

/// Every delivery of every member: `(partition, offset)` → how often.
type Deliveries = Arc<Mutex<HashMap<(i32, i64), u32>>>;

fn client_config(kafka: &Kafka, group: &str, protocol: Protocol) -> ClientConfig {
    match protocol {
        Protocol::Eager => {
            let mut config = kafka.consumer_config(group);
            config.set("partition.assignment.strategy", "range");
            config
        }
        Protocol::CooperativeSticky => kafka.consumer_config(group),
        Protocol::Consumer => {
            // KIP-848: the session timeout is the broker's (no session.timeout.ms here).
            let mut config = ClientConfig::new();
            config
                .set("bootstrap.servers", &kafka.bootstrap)
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                .set("group.protocol", "consumer");
            config
        }
    }
}

fn seed() -> u64 {
    match std::env::var("CATCHUP_STORM_SEED") {
        Ok(seed) => seed.trim().parse().expect("CATCHUP_STORM_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}

/// What a member saw in one life, beyond deliveries.
#[derive(Debug, Default)]
struct LifeReport {
    deliveries: usize,
    errors: Vec<String>,
    truncated: Vec<Event>,
    discarded: usize,
    discard_reasons: Vec<String>,
    splits: usize,
    resumed: usize,
    merged: usize,
}

impl LifeReport {
    /// Counts one event.
    fn note(&mut self, event: Event) {
        match event {
            Event::Error { message } => self.errors.push(message),
            event @ Event::Truncated { .. } => self.truncated.push(event),
            Event::LocalDiscarded {
                partition, reason, ..
            } => {
                self.discarded += 1;
                self.discard_reasons.push(format!("{partition}: {reason}"));
            }
            Event::SplitStarted { .. } => self.splits += 1,
            Event::SplitResumed { .. } => self.resumed += 1,
            Event::Merged { .. } => self.merged += 1,
            _ => {}
        }
    }
}

/// Collects the events a life emitted so far.
fn drain_events(events: &mut tokio::sync::broadcast::Receiver<Event>, report: &mut LifeReport) {
    loop {
        match events.try_recv() {
            Ok(event) => report.note(event),
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => report
                .errors
                .push(format!("(event receiver lagged by {n})")),
            Err(_) => return,
        }
    }
}

/// Records and acknowledges one delivery.
fn take(consumer: &CatchupConsumer, deliveries: &Deliveries, delivery: &catchup::Delivery) {
    *deliveries
        .lock()
        .expect("deliveries lock")
        .entry((delivery.partition, delivery.offset))
        .or_default() += 1;
    consumer.ack(delivery);
}

/// One member slot: lives of one to two seconds, each ended by a close or a crash, with a
/// pause outside the group in between, until `storm_end`. The buffer directory is the slot's
/// own and is kept across its lives, as a restarted process would.
async fn member(
    slot: usize,
    seed: u64,
    client: ClientConfig,
    topic: String,
    dir: PathBuf,
    deliveries: Deliveries,
    storm_end: Instant,
) -> Vec<LifeReport> {
    let mut rng =
        StdRng::seed_from_u64(seed ^ (slot as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut reports = Vec::new();
    // Staggered first joins.
    tokio::time::sleep(Duration::from_millis(rng.gen_range(0..1500))).await;
    let mut life = 0;
    while Instant::now() < storm_end {
        life += 1;
        let config = support::test_config(&dir, Mode::Ordered, MIN_LAG);
        let consumer = CatchupConsumer::new(&client, config)
            .unwrap_or_else(|err| panic!("member {slot} life {life}: creating failed: {err}"));
        let mut events = consumer.events();
        consumer
            .subscribe(&[&topic])
            .unwrap_or_else(|err| panic!("member {slot} life {life}: subscribe failed: {err}"));
        let life_end = (Instant::now() + Duration::from_millis(rng.gen_range(1000..2000)))
            .min(storm_end + Duration::from_millis(500));
        let mut report = LifeReport::default();
        // `timeout_at` returns a ready delivery even past the deadline: check it each round.
        while Instant::now() < life_end {
            let until = tokio::time::Instant::from_std(life_end);
            match tokio::time::timeout_at(until, consumer.recv()).await {
                Ok(Ok(delivery)) => {
                    take(&consumer, &deliveries, &delivery);
                    report.deliveries += 1;
                    if report.deliveries % PROCESS_EVERY == 0 {
                        tokio::time::sleep(PROCESS_PAUSE).await;
                    }
                }
                Ok(Err(err)) => panic!("member {slot} life {life}: recv failed: {err}"),
                Err(_) => break,
            }
        }
        drain_events(&mut events, &mut report);
        let crash = rng.gen_bool(0.5);
        let started = Instant::now();
        if crash {
            let dropped = tokio::task::spawn_blocking(move || drop(consumer));
            tokio::time::timeout(LEAVE_WAIT, dropped)
                .await
                .unwrap_or_else(|_| panic!("member {slot} life {life}: drop stalled"))
                .expect("drop task");
        } else {
            tokio::time::timeout(LEAVE_WAIT, consumer.close())
                .await
                .unwrap_or_else(|_| panic!("member {slot} life {life}: close stalled"))
                .unwrap_or_else(|err| panic!("member {slot} life {life}: close failed: {err}"));
        }
        drain_events(&mut events, &mut report);
        eprintln!(
            "member {slot} life {life}: {} deliveries, {} splits, {} resumed, {} merged, {} ({:?}), \
             {} local discards, {} errors",
            report.deliveries,
            report.splits,
            report.resumed,
            report.merged,
            if crash { "crashed" } else { "closed" },
            started.elapsed(),
            report.discarded,
            report.errors.len(),
        );
        reports.push(report);
        let away = Duration::from_millis(rng.gen_range(0..1000));
        tokio::time::sleep(away.min(storm_end.saturating_duration_since(Instant::now()))).await;
    }
    reports
}

/// Keeps producing round-robin until `end`; returns how many records it produced.
async fn producer(kafka: Arc<Kafka>, topic: String, end: Instant) -> usize {
    let mut produced = 0;
    while Instant::now() < end {
        kafka
            .produce_from(&topic, PARTITIONS, BACKLOG + produced, PRODUCE_BATCH)
            .await;
        produced += PRODUCE_BATCH;
        tokio::time::sleep(PRODUCE_EVERY).await;
    }
    produced
}

/// Offsets of `[0, high)` per partition not in `delivered`, as `(partition, count, first)`.
fn missing(delivered: &HashMap<(i32, i64), u32>, highs: &[i64]) -> Vec<(i32, usize, Option<i64>)> {
    (0..PARTITIONS)
        .filter_map(|p| {
            let absent: Vec<i64> = (0..highs[p as usize])
                .filter(|o| !delivered.contains_key(&(p, *o)))
                .collect();
            (!absent.is_empty()).then(|| (p, absent.len(), absent.first().copied()))
        })
        .collect()
}

/// The final member: runs until every offset below `highs` was delivered (by anyone), every
/// partition is assigned to it and it is settled (merged, acknowledged, committed).
async fn final_member(
    client: &ClientConfig,
    topic: &str,
    dir: PathBuf,
    deliveries: &Deliveries,
    highs: &[i64],
) -> (CatchupConsumer, LifeReport) {
    let consumer = CatchupConsumer::new(client, support::test_config(&dir, Mode::Ordered, MIN_LAG))
        .expect("final member");
    let mut events = consumer.events();
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut report = LifeReport::default();
    let mut assigned: BTreeSet<i32> = BTreeSet::new();
    let mut merged: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = Instant::now() + FINAL_WAIT;
    loop {
        // Deliveries are what moves the state; the short timeout only re-checks the
        // conditions below, which have no event of their own (settled).
        match tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await {
            Ok(Ok(delivery)) => {
                take(&consumer, deliveries, &delivery);
                report.deliveries += 1;
            }
            Ok(Err(err)) => panic!("final member: recv failed: {err}"),
            Err(_) => {}
        }
        loop {
            match events.try_recv() {
                Ok(Event::Assigned { partitions }) => {
                    assigned.extend(partitions.iter().map(|(_, p)| *p))
                }
                Ok(Event::Revoked { partitions, .. }) => {
                    for (_, p) in &partitions {
                        assigned.remove(p);
                    }
                }
                Ok(Event::Merged {
                    partition, offset, ..
                }) => {
                    merged.insert(partition, offset);
                    report.merged += 1;
                }
                Ok(event) => report.note(event),
                Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => report
                    .errors
                    .push(format!("(event receiver lagged by {n})")),
                Err(_) => break,
            }
        }
        // Cheap checks first: the distinct count, then the full scan.
        let total: i64 = highs.iter().sum();
        let all_delivered = || {
            let delivered = deliveries.lock().expect("deliveries lock");
            delivered.len() as i64 >= total && missing(&delivered, highs).is_empty()
        };
        if assigned.len() == PARTITIONS as usize && consumer.settled() && all_delivered() {
            break;
        }
        if Instant::now() >= deadline {
            let absent = missing(&deliveries.lock().expect("deliveries lock"), highs);
            let buffers = consumer.buffers();
            panic!(
                "final member: not done within {FINAL_WAIT:?}: missing (partition, count, \
                 first) {absent:?}; assigned {assigned:?}; settled {}; unacked {}; merged \
                 {merged:?}; errors {:?}; buffers {buffers:#?}",
                consumer.settled(),
                consumer.unacked(),
                report.errors,
            );
        }
    }
    eprintln!(
        "final member: {} deliveries, {} splits, {} resumed, merged {merged:?}, {} local \
         discards, {} errors",
        report.deliveries,
        report.splits,
        report.resumed,
        report.discarded,
        report.errors.len()
    );
    (consumer, report)
}

async fn storm(protocol: Protocol) {
    let started = Instant::now();
    let seed = seed();
    eprintln!(
        "rebalance storm {protocol:?}: seed {seed} (CATCHUP_STORM_SEED={seed} replays the schedule)"
    );
    let kafka = Arc::new(Kafka::connect());
    let Backlog { topic, group, .. } = kafka.backlog("storm", PARTITIONS, BACKLOG).await;
    let client = client_config(&kafka, &group, protocol);

    let deliveries: Deliveries = Arc::default();
    let dirs: Vec<tempfile::TempDir> = (0..=MEMBERS)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let storm_end = Instant::now() + STORM;
    let producing = tokio::spawn(producer(kafka.clone(), topic.clone(), storm_end));
    let members: Vec<_> = (0..MEMBERS)
        .map(|slot| {
            tokio::spawn(member(
                slot,
                seed,
                client.clone(),
                topic.clone(),
                dirs[slot].path().to_path_buf(),
                deliveries.clone(),
                storm_end,
            ))
        })
        .collect();
    let produced_during = producing.await.expect("producer task");
    let mut reports = Vec::new();
    for (slot, member) in members.into_iter().enumerate() {
        let lives = member
            .await
            .unwrap_or_else(|err| panic!("member {slot} task failed: {err}"));
        reports.extend(lives);
    }
    let storm_deliveries: usize = reports.iter().map(|r| r.deliveries).sum();
    eprintln!(
        "storm over after {:?}: {} lives, {storm_deliveries} deliveries, {produced_during} \
         records produced during the storm",
        started.elapsed(),
        reports.len()
    );

    let highs: Vec<i64> = kafka
        .watermarks(&topic, PARTITIONS)
        .into_iter()
        .map(|(_, high)| high)
        .collect();
    assert_eq!(
        highs.iter().sum::<i64>(),
        (BACKLOG + produced_during) as i64,
        "the log ends {highs:?} hold what was produced"
    );

    let (consumer, final_report) = final_member(
        &client,
        &topic,
        dirs[MEMBERS].path().to_path_buf(),
        &deliveries,
        &highs,
    )
    .await;
    consumer.commit().await.expect("final commit");
    let committed = kafka.committed(&group, &topic, PARTITIONS);
    tokio::time::timeout(LEAVE_WAIT, consumer.close())
        .await
        .expect("final close stalled")
        .expect("final close");
    reports.push(final_report);

    let delivered = deliveries.lock().expect("deliveries lock").clone();
    let beyond: Vec<&(i32, i64)> = delivered
        .keys()
        .filter(|(p, o)| *o < 0 || *o >= highs[*p as usize])
        .collect();
    assert!(
        beyond.is_empty(),
        "offsets never produced were delivered: {beyond:?}"
    );
    let absent = missing(&delivered, &highs);
    assert!(
        absent.is_empty(),
        "offsets never delivered (partition, count, first): {absent:?}"
    );
    assert_eq!(
        committed,
        highs.iter().map(|h| Some(*h)).collect::<Vec<_>>(),
        "the group is committed at the log end of every partition"
    );

    let mut duplicates: BTreeMap<i32, (usize, u32)> = BTreeMap::new();
    for ((partition, _), count) in &delivered {
        if *count > 1 {
            let entry = duplicates.entry(*partition).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(*count);
        }
    }
    let total: i64 = highs.iter().sum();
    let redelivered: usize = duplicates.values().map(|(n, _)| n).sum();
    eprintln!(
        "{protocol:?}: {total} offsets, {} deliveries, {redelivered} offsets delivered more than \
         once (per partition: offsets, max deliveries) {duplicates:?}",
        delivered.values().map(|c| *c as usize).sum::<usize>()
    );
    let errors: Vec<&String> = reports.iter().flat_map(|r| &r.errors).collect();
    if !errors.is_empty() {
        eprintln!("{protocol:?}: {} error events:", errors.len());
        for error in errors.iter().take(20) {
            eprintln!("  {error}");
        }
    }
    let discarded: usize = reports.iter().map(|r| r.discarded).sum();
    eprintln!("{protocol:?}: {discarded} local buffers discarded over all lives");
    for reason in reports.iter().flat_map(|r| &r.discard_reasons).take(5) {
        eprintln!("  {reason}");
    }
    let truncated: Vec<&Event> = reports.iter().flat_map(|r| &r.truncated).collect();
    assert!(
        truncated.is_empty(),
        "nothing was deleted by retention, yet: {truncated:?}"
    );
    eprintln!("{protocol:?}: done in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_classic_eager() {
    storm(Protocol::Eager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_classic_cooperative_sticky() {
    storm(Protocol::CooperativeSticky).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_kip_848_consumer_protocol() {
    storm(Protocol::Consumer).await;
}
