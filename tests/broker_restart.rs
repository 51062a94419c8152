//! Broker faults in the middle of a catch-up while fresh records keep arriving, on a broker of
//! the test's own ([`PrivateBroker`], never the shared one): three restarts, or a stop longer
//! than the consumer's session timeout (10 s against 6 s). An `Ordered` consumer works
//! through a 20,000-record backlog behind a group committed at 0, with a small byte budget and
//! a little simulated work per record so the catch-up is still being fetched and processed
//! when the faults land (the pace is lifted for the final drain), while a producer adds fresh
//! records and sends every failed one again until the broker acknowledges it. It proves:
//!
//! * every produced record (backlog and fresh) was delivered at least once, with its payload;
//! * per partition and assignment ([`catchup::Delivery::assignment`]) offsets strictly
//!   increase. Not over the consumer's lifetime: a fault that outlasts the session loses the
//!   partitions (`Revoked { lost: true }`) and the next assignment starts again at the group's
//!   committed offset (DESIGN §4, invariant 2);
//! * after the final commit every partition is merged and the group is committed at the log end.
//!
//! It prints the duplicates and the number of lost revocations.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use catchup::{Delivery, Event, Mode};
use support::deliveries::Deliveries;
use support::private_broker::PrivateBroker;
use support::{Kafka, unique};
use tokio::sync::watch;
use tokio::time::{sleep, timeout};

const PARTITIONS: i32 = 2;
const BACKLOG: usize = 20_000;
const MIN_LAG: u64 = 500;
/// Longer than the session timeout of [`Kafka::consumer_config`] (6 s).
const LONG_STOP: Duration = Duration::from_secs(10);
/// Fresh records: `FRESH_BATCH` every `FRESH_EVERY` (load, not synchronisation).
const FRESH_BATCH: usize = 50;
const FRESH_EVERY: Duration = Duration::from_millis(50);
/// Fresh batches still being sent (retried while the broker is away), at most.
const BATCHES_IN_FLIGHT: usize = 8;
/// Simulated work while the faults happen: `PACE` per `PACE_EVERY` records (about 500/s).
const PACE: Duration = Duration::from_millis(20);
const PACE_EVERY: u64 = 10;
/// A small byte budget: the catch-up lane pauses and resumes all through the faults.
const BUDGET: u64 = 256 << 10;
/// Deliveries before the first fault, and after each fault before the next step.
const BEFORE_FAULT: u64 = 1_000;
const AFTER_FAULT: u64 = 500;
const RETRY: Duration = Duration::from_millis(200);
const WAIT: Duration = Duration::from_secs(60);

/// Timestamped output (both tests run at once).
#[derive(Clone, Copy)]
struct Log(&'static str, Instant);

impl Log {
    fn say(self, message: impl std::fmt::Display) {
        let elapsed = self.1.elapsed().as_secs_f64();
        eprintln!("[{} {elapsed:>5.1}s] {message}", self.0);
    }
}

/// What the consumer task saw; the test waits on it through a watch channel.
#[derive(Clone, Default)]
struct Seen {
    deliveries: Deliveries,
    recv_errors: Vec<String>,
    /// Splits started or resumed.
    splits: u64,
    /// Partitions whose split is merged (and not split again since).
    merged: BTreeSet<i32>,
    lost_revocations: u64,
    /// `BrokersUnreachable` and `BrokersReachable` events, in order (true: unreachable).
    health: Vec<bool>,
}

impl Seen {
    fn on_event(&mut self, event: &Event, log: Log) {
        match event {
            Event::Backpressure { .. } => return,
            Event::SplitStarted { partition, .. } | Event::SplitResumed { partition, .. } => {
                self.splits += 1;
                self.merged.remove(partition);
            }
            Event::Merged { partition, .. } => _ = self.merged.insert(*partition),
            Event::Revoked { lost: true, .. } => self.lost_revocations += 1,
            Event::BrokersUnreachable { .. } => self.health.push(true),
            Event::BrokersReachable => self.health.push(false),
            _ => {}
        }
        log.say(format_args!("event: {event:?}"));
    }

    fn record(&mut self, d: &Delivery, log: Log) {
        if self.deliveries.record(d) {
            let (p, a, o) = (d.partition, d.assignment(), d.offset);
            log.say(format_args!("p{p} assignment {a}: first offset {o}"));
        }
    }

    fn summary(&self) -> String {
        let (delivered, covered) = (self.deliveries.count, &self.deliveries.covered);
        let (merged, lost) = (&self.merged, self.lost_revocations);
        format!("{delivered} delivered, covered {covered:?}, merged {merged:?}, lost {lost} times")
    }
}

/// Waits (bounded) until `until` holds for what the consumer saw.
async fn wait(seen: &mut watch::Receiver<Seen>, what: &str, until: impl FnMut(&Seen) -> bool) {
    if let Ok(waited) = timeout(WAIT, seen.wait_for(until)).await {
        waited.unwrap_or_else(|_| panic!("the consumer task ended waiting for {what}"));
        return;
    }
    panic!("no {what} within {WAIT:?}: {}", seen.borrow().summary());
}

async fn broker_fault_mid_catchup(test: &'static str, rounds: usize, downtime: Option<Duration>) {
    let log = Log(test, Instant::now());
    let broker = PrivateBroker::new();
    let kafka = Arc::new(Kafka::connect_to(broker.bootstrap()));
    let (topic, group) = (unique("broker-fault"), unique("broker-fault-group"));
    kafka.create_topic(&topic, PARTITIONS).await;
    let mut produced = kafka.produce(&topic, PARTITIONS, BACKLOG).await;
    kafka.commit_as_operator(&group, &topic, &[0; PARTITIONS as usize]);
    log.say(format_args!("{topic}: {BACKLOG} records, committed at 0"));

    let dir = tempfile::tempdir().expect("buffer directory");
    let mut config = support::test_config(dir.path(), Mode::Ordered, MIN_LAG);
    config.buffer_budget_bytes = BUDGET;
    let consumer = Arc::new(support::catchup_consumer(&kafka, &group, config));
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");
    // Paced while the faults happen; once they are over no more fresh records come either.
    let faults_over = Arc::new(AtomicBool::new(false));
    let (seen_tx, mut seen) = watch::channel(Seen::default());
    let (c, over) = (consumer.clone(), faults_over.clone());
    // Aborted at the end: `recv` and the event receiver are cancel-safe.
    let consuming = tokio::spawn(async move {
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Ok(event) => seen_tx.send_modify(|s| s.on_event(&event, log)),
                    Err(err) => log.say(format_args!("events: {err}")), // lagged
                },
                delivery = c.recv() => match delivery {
                    Ok(delivery) => {
                        seen_tx.send_modify(|s| s.record(&delivery, log));
                        c.ack(&delivery);
                        let paced = !over.load(Relaxed);
                        if paced && seen_tx.borrow().deliveries.count % PACE_EVERY == 0 {
                            sleep(PACE).await; // simulated work, not synchronisation
                        }
                    }
                    Err(err) => {
                        seen_tx.send_modify(|s| s.recv_errors.push(err.to_string()));
                        sleep(RETRY).await;
                    }
                },
            }
        }
    });
    let (k, t, over) = (kafka.clone(), topic.clone(), faults_over.clone());
    let producing = tokio::spawn(async move {
        let (mut batches, mut next, mut done) = (tokio::task::JoinSet::new(), BACKLOG, Vec::new());
        while !over.load(Relaxed) {
            while let Some(batch) = batches.try_join_next() {
                done.push(batch.expect("producer batch"));
            }
            // While the broker is away, batches retry; no more pile up behind them (500 of
            // them, each resending as its records timed out, kept the idempotent producer
            // from ever draining its queue after a 10 s stop: it outlived its deadline).
            if batches.len() < BATCHES_IN_FLIGHT {
                let (k, t) = (k.clone(), t.clone());
                batches.spawn(async move {
                    k.produce_from_retrying(&t, PARTITIONS, next, FRESH_BATCH, RETRY)
                        .await
                });
                next += FRESH_BATCH;
            }
            sleep(FRESH_EVERY).await; // load, not synchronisation
        }
        done.extend(batches.join_all().await);
        done
    });

    let delivered = |n: u64| move |s: &Seen| s.deliveries.count >= n;
    wait(&mut seen, "deliveries", delivered(BEFORE_FAULT)).await;
    let mid = |s: &Seen| s.splits > 0 && s.merged.is_empty() && s.deliveries.count < BACKLOG as u64;
    let summary = seen.borrow().summary();
    assert!(mid(&seen.borrow()), "not mid catch-up: {summary}");
    for round in 1..=rounds {
        let committed = kafka.committed(&group, &topic, PARTITIONS);
        let summary = seen.borrow().summary();
        log.say(format!("fault {round}: {summary}, committed {committed:?}"));
        if let Some(downtime) = downtime {
            broker.stop().await;
            sleep(downtime).await; // the downtime is the fault itself
            broker.start().await;
        } else {
            broker.restart().await;
        }
        let now = seen.borrow().deliveries.count;
        wait(&mut seen, "deliveries", delivered(now + AFTER_FAULT)).await;
    }

    // Drain at full speed, without fresh records.
    faults_over.store(true, Relaxed);
    let fresh = timeout(WAIT, producing).await.expect("producer in time");
    let (fresh, failures): (Vec<_>, Vec<u64>) = fresh.expect("producer task").into_iter().unzip();
    produced.extend(fresh.into_iter().flatten());
    let ends: Vec<i64> = kafka
        .watermarks(&topic, PARTITIONS)
        .iter()
        .map(|w| w.1)
        .collect();
    let drained = |s: &Seen| s.deliveries.covers(&ends);
    wait(&mut seen, "every record below the log end", drained).await;
    wait(&mut seen, "merges", |s| s.merged.len() as i32 == PARTITIONS).await;
    consuming.abort();
    _ = consuming.await;
    let seen = seen.borrow().clone();
    let consumer = Arc::into_inner(consumer).expect("the consumer task released the consumer");
    consumer.commit().await.expect("final commit");
    let settled = consumer.settled();
    consumer.close().await.expect("close");

    let (delivered, lost_revocations) = (&seen.deliveries, seen.lost_revocations);
    let lost = delivered.never_delivered(&produced);
    let wrong = delivered.wrong_payload(&produced);
    let duplicates: Vec<_> = (0..PARTITIONS).map(|p| delivered.duplicates(p)).collect();
    log.say(format_args!(
        "{} produced ({} failed attempts), {} deliveries, {lost_revocations} lost revocations, \
         {} assignments; {} never delivered, {} with another payload, {} out of order; \
         offsets delivered more than once, per partition: {duplicates:?}",
        produced.len(),
        failures.iter().sum::<u64>(),
        delivered.count,
        delivered.last.len(),
        lost.len(),
        wrong.len(),
        delivered.disorder.len(),
    ));
    assert!(lost.is_empty(), "never delivered: {lost:?}");
    assert!(wrong.is_empty(), "another payload: {wrong:?}");
    let disorder = delivered.disorder.join("\n");
    assert!(disorder.is_empty(), "Ordered, per assignment:\n{disorder}");
    assert!(seen.recv_errors.is_empty(), "{:?}", seen.recv_errors);
    assert!(settled, "settled after the final commit");
    // Said when it happened and when it ended, not at every retry of every client.
    let unreachable = seen.health.iter().filter(|u| **u).count();
    assert!(
        (1..=2 * rounds).contains(&unreachable),
        "{unreachable} BrokersUnreachable events for {rounds} fault(s): {:?}",
        seen.health
    );
    assert_eq!(
        seen.health.last(),
        Some(&false),
        "reachable again at the end"
    );
    let at_end: Vec<Option<i64>> = ends.iter().map(|end| Some(*end)).collect();
    let committed = kafka.committed(&group, &topic, PARTITIONS);
    assert_eq!(committed, at_end, "committed at the log end");
    log.say("passed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_restarts() {
    broker_fault_mid_catchup("three_restarts", 3, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_longer_than_the_session_timeout() {
    let test = "stopped_longer_than_the_session_timeout";
    broker_fault_mid_catchup(test, 1, Some(LONG_STOP)).await;
}
