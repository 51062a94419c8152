//! The engine's state, below the Kafka adapters and the public consumer: per assigned
//! partition, the split in effect, the live fetcher's cursor, delivery cursors and
//! acknowledgements — shared by the fetcher threads (`kafka`) and the reader (`consumer`).
//! `types` holds the vocabulary both speak (configuration, deliveries, events), re-exported
//! by [`crate::consumer`].

mod health;
pub(crate) mod telemetry;
pub(crate) mod types;
mod writable;

pub(crate) use health::BrokerHealth;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, broadcast};

use crate::fetch::FetchCursor;
use crate::plan::{AckTracker, CommitPlan, Progress, SideEntry, SplitToken, plan_commit};
use crate::store::{Buffer, Lane, LayoutId, PartitionLayout, PartitionState, StoreError};
use types::{CatchupConfig, Delivery, DeliveryLane, Event, Mode};
use writable::{Measured, Writability};

/// The fewest records read from one partition per refill.
pub(crate) const MIN_READ: usize = 16;

/// A topic and partition.
pub(crate) type PartitionId = (String, i32);

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Catchup => 0,
        Lane::Live => 1,
    }
}

/// One assigned partition.
#[derive(Debug)]
pub(crate) struct PartitionRuntime {
    /// Changes with every assignment; deliveries of an older one are not acknowledged.
    pub generation: u64,
    pub layout: PartitionLayout,
    pub token: Option<SplitToken>,
    pub side: Option<SideEntry>,
    /// The offset the main log holds.
    pub main_committed: i64,
    /// Per lane (catch-up, live): delivered and acknowledged offsets.
    acks: [AckTracker; 2],
    /// Next offset to read: `Ordered` and `Off` use `ordered_next`, `Concurrent` one per lane.
    ordered_next: i64,
    lane_next: [i64; 2],
    drained: bool,
    /// Per lane, bytes fetched and not yet acknowledged (for the byte budget). Signed: the
    /// reader may acknowledge a record before its fetcher has counted the append that
    /// stored it, and the two must cancel out whatever their order (finding F7).
    buffered_bytes: [i64; 2],
    /// Per lane, records below this were in the buffer before this assignment and were never
    /// counted: their acks free nothing from the counters.
    counted_from: [i64; 2],
    /// The live fetcher's cursor on this partition (positioned at assignment).
    pub live_cursor: FetchCursor,
    /// Failed attempts to reposition the live lane since the last success (to report the
    /// first one, not every round).
    pub reposition_failures: u32,
    /// The live lane's wait after its position was found past the log end.
    pub live_hold: crate::fetch::Hold,
    /// When the partition was assigned, until its first live record is delivered.
    awaiting_fresh_since: Option<std::time::Instant>,
}

impl PartitionRuntime {
    pub fn new(
        generation: u64,
        state: &PartitionState,
        layout_id: LayoutId,
        token: Option<SplitToken>,
        side: Option<SideEntry>,
        main_committed: i64,
    ) -> Self {
        let catchup_next = state.catchup.committed_next;
        let live_next = state.live.committed_next;
        let catchup_done = state.catchup_committed();
        Self {
            generation,
            layout: state.layout.clone(),
            token,
            side,
            main_committed,
            acks: [AckTracker::new(catchup_next), AckTracker::new(live_next)],
            ordered_next: if catchup_done {
                live_next
            } else {
                catchup_next
            },
            lane_next: [catchup_next, live_next],
            drained: catchup_done,
            buffered_bytes: [0, 0],
            counted_from: [state.catchup.fetched_next, state.live.fetched_next],
            live_cursor: FetchCursor::new(layout_id, state.live.fetched_next),
            reposition_failures: 0,
            live_hold: Default::default(),
            awaiting_fresh_since: Some(std::time::Instant::now()),
        }
    }

    /// Unacknowledged bytes of `lane`.
    pub fn buffered(&self, lane: Lane) -> u64 {
        self.buffered_bytes[lane_index(lane)].max(0) as u64
    }

    /// Whether the catch-up lane still has offsets to fetch (it is one of the budget's slots).
    pub fn catchup_fetching(&self) -> bool {
        !self.drained
    }

    fn delivery_lane(&self, lane: Lane) -> DeliveryLane {
        match lane {
            Lane::Catchup => DeliveryLane::Catchup,
            Lane::Live if self.token.is_some() => DeliveryLane::Live,
            Lane::Live => DeliveryLane::Plain,
        }
    }
}

/// A commit to perform for one partition, computed under the lock, applied after the I/O.
#[derive(Debug, Clone)]
pub(crate) struct PendingCommit {
    pub partition: PartitionId,
    pub generation: u64,
    pub token: Option<SplitToken>,
    pub plan: CommitPlan,
    pub catchup_processed: i64,
}

/// Everything the threads and the reader share.
pub(crate) struct Shared {
    pub buffer: Arc<Buffer>,
    pub config: CatchupConfig,
    pub group: String,
    partitions: Mutex<BTreeMap<PartitionId, PartitionRuntime>>,
    generation: AtomicU64,
    /// Woken when records are appended or partitions change.
    pub notify: Notify,
    /// Bumped on every live-lane append: lets `Concurrent` look for fresh records first.
    pub live_appends: AtomicU64,
    /// Bumped on every revocation: the reader drops queued records of revoked partitions.
    pub revocations: AtomicU64,
    /// Bumped on every assignment, empty ones included.
    pub assignments: AtomicU64,
    /// How many partitions the group member holds once the assignment it is reconciling is
    /// done (the catch-up consumer sizes its queues from it).
    pub assigning: std::sync::atomic::AtomicUsize,
    /// Bytes acknowledged since the last commit: the buffer deletes records only once their
    /// commit is in Kafka, so the live thread commits early when this grows large.
    processed_since_commit: AtomicU64,
    /// Partitions whose buffered records failed verification on read: taken off the reader,
    /// waiting for the live thread to discard them and refetch from Kafka (DESIGN
    /// invariant 7; store audit R1).
    damaged: Mutex<BTreeSet<PartitionId>>,
    events: broadcast::Sender<Event>,
    /// Round-robin start for fairness across partitions.
    next_start: AtomicU64,
    writability: Writability,
    /// What stopped the consumer for good on the Kafka side (a subscribed topic that does
    /// not exist, access refused): `recv` reports it.
    stopped: Mutex<Option<Stopped>>,
    /// How many times the application subscribed (`subscribing`).
    subscription: AtomicU64,
    /// Whether the brokers can be reached, as every client reports it.
    pub health: Arc<BrokerHealth>,
}

impl Stopped {
    /// Whether a new subscription ends it.
    fn cleared_by_subscribing(&self) -> bool {
        matches!(self, Stopped::TopicMissing(_) | Stopped::Subscription(_))
    }
}

/// A write to the buffer failed: the consumer stops fetching (the public API reports it as
/// `Error::BufferFailed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BufferFailure {
    /// The buffer directory.
    pub dir: std::path::PathBuf,
    /// The failed write.
    pub reason: String,
}

/// A condition on the Kafka side the consumer cannot get past by polling on (the public API
/// maps each to its `Error`, with the same words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Stopped {
    /// A subscribed topic the cluster does not know.
    #[error("topic {0} does not exist")]
    TopicMissing(String),
    /// Authentication or authorization failed.
    #[error("the cluster refused access: {0}")]
    Refused(String),
    /// rdkafka refused the subscription (a malformed pattern, say).
    #[error("configuration: {0}")]
    Subscription(String),
    /// A fetcher thread ended by a panic (a bug): its lane gets no more records.
    #[error(
        "the {fetcher} fetcher stopped unexpectedly ({reason}); nothing processed is lost — close the consumer and start it again"
    )]
    FetcherDied {
        /// Which one.
        fetcher: &'static str,
        /// What happened (the panic's own message is in the log).
        reason: String,
    },
}

/// See [`Shared::stop_on_panic`].
pub(crate) struct StopOnPanic<'a> {
    shared: &'a Shared,
    fetcher: &'static str,
}

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(
                fetcher = self.fetcher,
                "a fetcher thread panicked; the consumer stops"
            );
            self.shared.stop_with(Stopped::FetcherDied {
                fetcher: self.fetcher,
                reason: "it panicked (the message is in the log)".into(),
            });
        }
    }
}

impl Shared {
    pub fn new(
        buffer: Arc<Buffer>,
        config: CatchupConfig,
        group: String,
        health: Arc<BrokerHealth>,
    ) -> Self {
        let (events, _) = broadcast::channel(4096);
        health.attach(events.clone());
        let config_floor = config.disk_floor;
        Self {
            buffer,
            config,
            group,
            partitions: Mutex::new(BTreeMap::new()),
            generation: AtomicU64::new(1),
            notify: Notify::new(),
            live_appends: AtomicU64::new(0),
            processed_since_commit: AtomicU64::new(0),
            assigning: std::sync::atomic::AtomicUsize::new(0),
            revocations: AtomicU64::new(0),
            assignments: AtomicU64::new(0),
            damaged: Mutex::new(BTreeSet::new()),
            events,
            next_start: AtomicU64::new(0),
            writability: Writability::new(config_floor),
            stopped: Mutex::new(None),
            subscription: AtomicU64::new(0),
            health,
        }
    }

    /// Records what stopped the consumer (the first one wins), with an event, and wakes the
    /// reader so that `recv` reports it.
    pub fn stop_with(&self, stopped: Stopped) {
        let slot = self.stopped_slot();
        self.record_stop(slot, stopped);
    }

    /// [`stop_with`](Self::stop_with) for what is wrong with subscription `generation` (a
    /// topic missing, the subscription refused): dropped if the application subscribed
    /// again since — the live thread may still be busy with the old one when `subscribe`
    /// returns.
    pub fn stop_for_subscription(&self, generation: u64, stopped: Stopped) {
        let slot = self.stopped_slot();
        // Read under the lock `subscribing` clears the slot under, after its increment.
        if self.subscription.load(Ordering::SeqCst) == generation {
            self.record_stop(slot, stopped);
        }
    }

    /// A new subscription (`subscribe`): its generation. What was wrong with the last one
    /// no longer stops the consumer, from now on.
    pub fn subscribing(&self) -> u64 {
        let generation = self.subscription.fetch_add(1, Ordering::SeqCst) + 1;
        self.resubscribed();
        generation
    }

    fn record_stop(&self, mut slot: MutexGuard<'_, Option<Stopped>>, stopped: Stopped) {
        // The first reason wins, except that a dead fetcher replaces what a new subscription
        // clears (a missing topic, a refused subscription): that must not revive a consumer
        // without a fetcher.
        let replaces = slot.as_ref().is_some_and(Stopped::cleared_by_subscribing)
            && matches!(stopped, Stopped::FetcherDied { .. });
        if slot.is_some() && !replaces {
            return;
        }
        // Returned by `recv`, where the application decides what to say: logged here only
        // for whoever debugs.
        tracing::debug!("{stopped}");
        self.emit(Event::Error {
            message: stopped.to_string(),
        });
        *slot = Some(stopped);
        drop(slot);
        self.notify.notify_waiters();
    }

    /// A guard for the body of the `fetcher` thread, to be held as its first local: if the
    /// thread unwinds from a panic (a bug), the consumer stops with
    /// [`Error::FetcherDied`](crate::Error::FetcherDied) rather than leaving the application
    /// waiting in `recv` for records that will never come. Declared inside the body, it runs
    /// before the body's parameters — the thread's Kafka consumer among them — are dropped:
    /// closing a consumer can wait on the brokers.
    pub fn stop_on_panic(&self, fetcher: &'static str) -> StopOnPanic<'_> {
        StopOnPanic {
            shared: self,
            fetcher,
        }
    }

    fn stopped_slot(&self) -> MutexGuard<'_, Option<Stopped>> {
        self.stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What was wrong with the last subscription (a missing topic, looked up again if still
    /// missing; a refused subscription) no longer stops the consumer. Access refused stays.
    fn resubscribed(&self) {
        let mut slot = self.stopped_slot();
        if slot.as_ref().is_some_and(Stopped::cleared_by_subscribing) {
            *slot = None;
        }
    }

    /// What stopped the consumer on the Kafka side: what a fetcher recorded, else
    /// credentials the brokers refused (any client's).
    pub fn stopped(&self) -> Option<Stopped> {
        self.stopped_slot()
            .clone()
            .or_else(|| self.health.refused().map(Stopped::Refused))
    }

    /// Whether a fetcher may append now: no write has failed and the filesystem is above
    /// the free-space floor (measured every 200 ms, at every append near the floor; a change is reported once).
    pub fn may_write(&self) -> bool {
        if self.writability.failure().is_some() {
            return false;
        }
        let measured = self.writability.check(
            || self.buffer.free_space().map_err(|e| e.to_string()),
            || {
                self.partitions()
                    .values()
                    .all(|runtime| Lane::ALL.iter().all(|&lane| runtime.buffered(lane) == 0))
            },
        );
        match measured {
            Measured::Unchanged => {}
            Measured::Changed(change) => {
                let path = self.buffer.dir().to_path_buf();
                if change.low {
                    tracing::warn!(
                        path = %path.display(),
                        available_bytes = change.available,
                        floor_bytes = change.floor,
                        "the buffer's filesystem is below its free-space floor ({} free, floor {}): fetching paused until space returns",
                        mib(change.available),
                        mib(change.floor)
                    );
                } else if change.reusing {
                    tracing::info!(
                        path = %path.display(),
                        available_bytes = change.available,
                        "the buffer is drained: fetching resumes below the free-space floor ({} free, floor {}) into the space the buffer already holds",
                        mib(change.available),
                        mib(change.floor)
                    );
                } else {
                    tracing::info!(
                        path = %path.display(),
                        available_bytes = change.available,
                        "free space is back above the buffer's floor ({} free): fetching resumes",
                        mib(change.available)
                    );
                }
                self.emit(Event::DiskSpace {
                    path,
                    low: change.low,
                    available_bytes: change.available,
                    floor_bytes: change.floor,
                });
            }
            Measured::Unreadable(reason) => {
                tracing::warn!("{reason}; the free-space floor cannot be enforced");
                self.emit(Event::Error { message: reason });
            }
        }
        !self.writability.disk_low()
    }

    /// Stops every write after one failed with `err` (not a refusal: an I/O failure). The
    /// reader hands the failure to the application; the sled handle is never dropped, since
    /// sled's flush on drop can block for good after a failed write.
    pub fn write_failed(&self, err: &StoreError) {
        if self.writability.fail(err.to_string()) {
            tracing::error!(
                "{err}: the consumer stops fetching; start a new process once the disk is usable"
            );
            std::mem::forget(self.buffer.clone());
            if let Err(mark) = self.buffer.mark_untrusted() {
                tracing::error!("{mark}");
            }
            self.emit(Event::Error {
                message: err.to_string(),
            });
            self.notify.notify_waiters();
        }
    }

    /// The write failure that stopped the consumer.
    pub fn failure(&self) -> Option<BufferFailure> {
        self.writability.failure().map(|reason| BufferFailure {
            dir: self.buffer.dir().to_path_buf(),
            reason: reason.to_owned(),
        })
    }

    pub fn partitions(&self) -> MutexGuard<'_, BTreeMap<PartitionId, PartitionRuntime>> {
        // The map is only ever replaced entry by entry; a panic elsewhere leaves it usable.
        self.partitions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::Relaxed)
    }

    pub fn emit(&self, event: Event) {
        tracing::debug!(?event, "catchup event");
        let _ = self.events.send(event); // no subscriber is fine
    }

    pub fn subscribe_events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Reads up to about `max` deliverable records from the buffer. `Ordered` and `Off` fill
    /// `queues[0]` in delivery order; `Concurrent` fills `queues[0]` with catch-up records
    /// and `queues[1]` with live ones, reading only `lanes`.
    pub fn fill(
        &self,
        queues: &mut [VecDeque<Delivery>; 2],
        max: usize,
        lanes: &[Lane],
    ) -> Result<(), StoreError> {
        let mut partitions = self.partitions();
        let count = partitions.len();
        if count == 0 {
            return Ok(());
        }
        let start = self.next_start.fetch_add(1, Ordering::Relaxed) as usize % count;
        let keys: Vec<PartitionId> = partitions.keys().cloned().collect();
        let per_partition = (max / count).max(MIN_READ);
        let mut filled = 0;
        for index in 0..count {
            let key = &keys[(start + index) % count];
            let Some(runtime) = partitions.get_mut(key) else {
                continue;
            };
            let delivered = match self.read_partition(key, runtime, lanes, per_partition) {
                Ok(delivered) => delivered,
                Err(StoreError::Damaged { reason, .. }) => {
                    partitions.remove(key);
                    self.damaged_on_read(key, reason);
                    continue;
                }
                Err(err) => return Err(err),
            };
            if !runtime.drained
                && runtime.acks[0].delivered_next() >= runtime.layout.catchup_end().unwrap_or(0)
            {
                runtime.drained = true;
                self.emit(Event::CatchupDrained {
                    topic: key.0.clone(),
                    partition: key.1,
                });
            }
            for (queue, deliveries) in delivered {
                filled += deliveries.len();
                queues[queue].extend(deliveries);
            }
            if filled >= max {
                break;
            }
        }
        Ok(())
    }

    /// Reads one partition's next records as (queue, deliveries) pairs. A `Damaged` error
    /// concerns this partition only.
    fn read_partition(
        &self,
        key: &PartitionId,
        runtime: &mut PartitionRuntime,
        lanes: &[Lane],
        per_partition: usize,
    ) -> Result<Vec<(usize, Vec<Delivery>)>, StoreError> {
        let mut delivered = Vec::new();
        match self.config.mode {
            Mode::Ordered | Mode::Off => {
                let batch =
                    self.buffer
                        .read_ordered(&key.0, key.1, runtime.ordered_next, per_partition)?;
                runtime.ordered_next = batch.next;
                delivered.push((
                    0,
                    self.deliver(key, runtime, batch.lane, batch.records, batch.next),
                ));
            }
            Mode::Concurrent => {
                for &lane in lanes {
                    let from = runtime.lane_next[lane_index(lane)];
                    let batch = self.buffer.read(lane, &key.0, key.1, from, per_partition)?;
                    runtime.lane_next[lane_index(lane)] = batch.next;
                    delivered.push((
                        lane_index(lane),
                        self.deliver(key, runtime, lane, batch.records, batch.next),
                    ));
                }
            }
        }
        Ok(delivered)
    }

    /// Takes a partition whose buffered records failed verification off the reader: its
    /// queued deliveries are dropped, its acknowledgements ignored, and the live thread
    /// discards its records and reconciles it again from Kafka's committed offsets.
    fn damaged_on_read(&self, key: &PartitionId, reason: String) {
        tracing::warn!(
            topic = key.0,
            partition = key.1,
            "buffered records failed verification ({reason}); discarding them and refetching from the committed offset"
        );
        self.damaged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key.clone());
        self.revocations.fetch_add(1, Ordering::Relaxed);
        self.emit(Event::LocalDiscarded {
            topic: key.0.clone(),
            partition: key.1,
            reason: format!("damaged: {reason}"),
        });
    }

    /// Drops `partitions` from those waiting to be refetched as damaged (revoked meanwhile).
    pub fn forget_damaged(&self, partitions: &[PartitionId]) {
        let mut damaged = self
            .damaged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for key in partitions {
            damaged.remove(key);
        }
    }

    /// The partitions taken off the reader as damaged since the last call.
    pub fn take_damaged(&self) -> BTreeSet<PartitionId> {
        std::mem::take(
            &mut *self
                .damaged
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    fn deliver(
        &self,
        key: &PartitionId,
        runtime: &mut PartitionRuntime,
        lane: Lane,
        records: Vec<crate::store::Record>,
        next: i64,
    ) -> Vec<Delivery> {
        let delivery_lane = runtime.delivery_lane(lane);
        if lane == Lane::Live && !records.is_empty() {
            if let Some(since) = runtime.awaiting_fresh_since.take() {
                telemetry::time_to_first_fresh(&self.group, since.elapsed().as_secs_f64());
            }
        }
        telemetry::records_delivered(&self.group, lane.as_str(), records.len() as u64);
        let acks = &mut runtime.acks[lane_index(lane)];
        let mut out = Vec::with_capacity(records.len());
        for record in records {
            acks.delivered(record.offset, record.payload_bytes());
            out.push(Delivery {
                topic: key.0.clone(),
                partition: key.1,
                offset: record.offset,
                key: record.key,
                payload: record.payload,
                headers: types::DeliveryHeaders(record.headers),
                timestamp: record.timestamp,
                lane: delivery_lane,
                generation: runtime.generation,
            });
        }
        acks.read_through(next);
        out
    }

    /// Counts `bytes` appended to `lane` of `key` against the byte budget.
    pub fn add_buffered(&self, key: &PartitionId, lane: Lane, bytes: u64) {
        if let Some(runtime) = self.partitions().get_mut(key) {
            runtime.buffered_bytes[lane_index(lane)] += bytes as i64;
        }
    }

    /// Unacknowledged bytes of `lane` per assigned partition.
    pub fn buffered_by_partition(&self, lane: Lane) -> BTreeMap<PartitionId, u64> {
        self.partitions()
            .iter()
            .map(|(key, runtime)| (key.clone(), runtime.buffered(lane)))
            .collect()
    }

    /// The byte budget's slots: a live lane per assigned partition, plus a catch-up lane per
    /// partition whose backlog is not read through yet.
    pub fn budget_slots(&self) -> usize {
        self.partitions()
            .values()
            .map(|runtime| 1 + usize::from(runtime.catchup_fetching()))
            .sum()
    }

    /// Whether `delivery` belongs to a current assignment of its partition.
    pub fn is_current(&self, delivery: &Delivery) -> bool {
        let partitions = self.partitions();
        partitions
            .get(&(delivery.topic.clone(), delivery.partition))
            .is_some_and(|runtime| runtime.generation == delivery.generation)
    }

    /// Marks a delivery processed. Deliveries of a revoked assignment are ignored.
    pub fn ack(&self, delivery: &Delivery) {
        let mut partitions = self.partitions();
        if let Some(runtime) = partitions.get_mut(&(delivery.topic.clone(), delivery.partition)) {
            if runtime.generation == delivery.generation {
                let lane = lane_index(store_lane(delivery.lane));
                let freed = runtime.acks[lane].ack(delivery.offset) as i64;
                if delivery.offset >= runtime.counted_from[lane] {
                    runtime.buffered_bytes[lane] -= freed;
                }
                self.processed_since_commit
                    .fetch_add(freed.max(0) as u64, Ordering::Relaxed);
            }
        }
    }

    /// Bytes acknowledged since the last call, which a commit is about to cover.
    pub fn take_processed_since_commit(&self) -> u64 {
        self.processed_since_commit.swap(0, Ordering::Relaxed)
    }

    /// Bytes acknowledged since the last commit.
    pub fn processed_since_commit(&self) -> u64 {
        self.processed_since_commit.load(Ordering::Relaxed)
    }

    /// The commits due for `only` (or every assigned partition).
    pub fn pending_commits(&self, only: Option<&[PartitionId]>) -> Vec<PendingCommit> {
        let mut partitions = self.partitions();
        let mut lag = [0i64; 2];
        for (key, runtime) in partitions.iter_mut() {
            let state = match self.buffer.partition_state(&key.0, key.1) {
                Ok(Some(state)) => state,
                Ok(None) => continue,
                Err(err) => {
                    self.emit(Event::Error {
                        message: err.to_string(),
                    });
                    continue;
                }
            };
            for lane in Lane::ALL {
                let fetched_next = state.lane(lane).fetched_next;
                self.skip_trailing_gap(
                    key,
                    lane,
                    &mut runtime.acks[lane_index(lane)],
                    fetched_next,
                );
                let processed = runtime.acks[lane_index(lane)].committable();
                lag[lane_index(lane)] += (fetched_next - processed).max(0);
            }
        }
        for lane in Lane::ALL {
            // Offsets fetched into the buffer and not yet processed.
            let bytes: u64 = partitions.values().map(|r| r.buffered(lane)).sum();
            telemetry::lag(&self.group, lane.as_str(), lag[lane_index(lane)], bytes);
        }
        partitions
            .iter()
            .filter(|(key, _)| only.is_none_or(|only| only.contains(key)))
            .filter_map(|(key, runtime)| {
                let catchup_processed = runtime.acks[0].committable();
                let plan = plan_commit(&Progress {
                    token: runtime.token,
                    side: runtime.side.as_ref(),
                    layout: &runtime.layout,
                    main_committed: runtime.main_committed,
                    catchup_processed,
                    live_processed: runtime.acks[1].committable(),
                });
                (plan != CommitPlan::Nothing).then(|| PendingCommit {
                    partition: key.clone(),
                    generation: runtime.generation,
                    token: runtime.token,
                    plan,
                    catchup_processed,
                })
            })
            .collect()
    }

    /// Offsets past the last delivered record that hold no record (transaction markers,
    /// compaction) count as processed once everything delivered is acknowledged — even when
    /// the reader has not been asked for more since.
    fn skip_trailing_gap(
        &self,
        key: &PartitionId,
        lane: Lane,
        acks: &mut AckTracker,
        fetched_next: i64,
    ) {
        let from = acks.delivered_next();
        // Only a lane read through everything it delivered, with fetched offsets beyond, can
        // have such a gap; anything else needs no read.
        if acks.unacked() > 0 || from >= fetched_next {
            return;
        }
        match self.buffer.read(lane, &key.0, key.1, from, 1) {
            Ok(batch) if batch.records.is_empty() && batch.next > from => {
                acks.read_through(batch.next)
            }
            Ok(_) => {}
            Err(err) => self.emit(Event::Error {
                message: err.to_string(),
            }),
        }
    }

    /// Records a commit that Kafka now holds, and lets the buffer delete what it covers.
    pub fn commit_applied(&self, commit: &PendingCommit) -> Result<(), StoreError> {
        let (topic, partition) = &commit.partition;
        let mut partitions = self.partitions();
        let Some(runtime) = partitions.get_mut(&commit.partition) else {
            return Ok(());
        };
        if runtime.generation != commit.generation {
            return Ok(());
        }
        match &commit.plan {
            CommitPlan::Nothing => {}
            CommitPlan::Plain { offset } => {
                runtime.main_committed = *offset;
                self.buffer
                    .record_committed(Lane::Live, topic, *partition, *offset)?;
            }
            CommitPlan::Split { main, side } => {
                if let Some(main) = main {
                    runtime.main_committed = *main;
                    self.buffer
                        .record_committed(Lane::Catchup, topic, *partition, *main)?;
                }
                if let Some(side) = side {
                    runtime.side = Some(side.clone());
                    self.buffer
                        .record_committed(Lane::Live, topic, *partition, side.live_next)?;
                }
            }
            CommitPlan::Merge { offset } => {
                runtime.main_committed = *offset;
                runtime.token = None;
                runtime.side = None;
                self.buffer.record_committed(
                    Lane::Catchup,
                    topic,
                    *partition,
                    commit.catchup_processed,
                )?;
                self.buffer
                    .record_committed(Lane::Live, topic, *partition, *offset)?;
                drop(partitions);
                tracing::info!(
                    topic,
                    partition,
                    offset,
                    "split merged into the group's offsets"
                );
                telemetry::merged(&self.group);
                self.emit(Event::Merged {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: *offset,
                });
            }
        }
        Ok(())
    }

    /// Delivered records not yet acknowledged, over all partitions.
    pub fn unacked(&self) -> usize {
        self.partitions()
            .values()
            .map(|r| r.acks.iter().map(AckTracker::unacked).sum::<usize>())
            .sum()
    }

    /// Whether every assigned partition has its split merged and all deliveries acked and
    /// committed.
    pub fn settled(&self) -> bool {
        self.partitions().values().all(|runtime| {
            runtime.token.is_none()
                && runtime.acks.iter().all(|a| a.unacked() == 0)
                && runtime.main_committed >= runtime.acks[1].committable()
        })
    }
}

fn store_lane(lane: DeliveryLane) -> Lane {
    match lane {
        DeliveryLane::Catchup => Lane::Catchup,
        DeliveryLane::Live | DeliveryLane::Plain => Lane::Live,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::BufferOptions;

    fn shared(dir: &std::path::Path) -> Shared {
        let buffer = Buffer::open(dir, BufferOptions::default()).expect("buffer");
        Shared::new(
            Arc::new(buffer),
            CatchupConfig::new(dir),
            "group".into(),
            Arc::new(BrokerHealth::new("group", None)),
        )
    }

    #[test]
    fn what_an_old_subscription_reports_is_dropped() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = shared(dir.path());
        let first = shared.subscribing();
        shared.stop_for_subscription(first, Stopped::TopicMissing("orders".into()));
        assert!(matches!(shared.stopped(), Some(Stopped::TopicMissing(_))));
        // The application subscribes again while the live thread still checks the first.
        let second = shared.subscribing();
        assert!(shared.stopped().is_none(), "cleared by subscribing");
        shared.stop_for_subscription(first, Stopped::TopicMissing("orders".into()));
        assert!(shared.stopped().is_none(), "the first subscription's news");
        shared.stop_for_subscription(second, Stopped::Subscription("refused".into()));
        assert!(matches!(shared.stopped(), Some(Stopped::Subscription(_))));
        // Access refused is not the subscription's: subscribing again keeps it.
        let third = shared.subscribing();
        shared.stop_with(Stopped::Refused("denied".into()));
        shared.subscribing();
        shared.stop_for_subscription(third, Stopped::TopicMissing("orders".into()));
        assert!(matches!(shared.stopped(), Some(Stopped::Refused(_))));
    }

    #[test]
    fn a_fetcher_that_panics_stops_the_consumer_with_an_error() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = Arc::new(shared(dir.path()));
        let mut events = shared.subscribe_events();
        let body = |shared: Arc<Shared>, fail: bool| {
            std::thread::spawn(move || {
                let _guard = shared.stop_on_panic("catch-up");
                assert!(!fail, "injected failure");
            })
            .join()
        };
        assert!(body(shared.clone(), false).is_ok());
        assert!(
            shared.stopped().is_none(),
            "a body that returns stops nothing"
        );
        // A missing topic is replaced (a new subscription would clear it), and stays so.
        shared.stop_with(Stopped::TopicMissing("orders".into()));
        assert!(body(shared.clone(), true).is_err());
        shared.resubscribed();
        match shared.stopped() {
            Some(Stopped::FetcherDied { fetcher, .. }) => assert_eq!(fetcher, "catch-up"),
            other => panic!("expected FetcherDied, got {other:?}"),
        }
        let messages: Vec<String> = std::iter::from_fn(|| events.try_recv().ok())
            .filter_map(|event| match event {
                Event::Error { message } => Some(message),
                _ => None,
            })
            .collect();
        assert!(
            messages
                .iter()
                .any(|m| m.contains("catch-up fetcher stopped")),
            "the stop is reported as an event too: {messages:?}"
        );
    }
}
