//! The engine's state, below the Kafka adapters and the public consumer: per assigned
//! partition, the split in effect, the live fetcher's cursor, delivery cursors and
//! acknowledgements — shared by the fetcher threads (`kafka`) and the reader (`consumer`).
//! `types` holds the vocabulary both speak (configuration, deliveries, events), re-exported
//! by [`crate::consumer`].

mod commit;
mod health;
mod latest;
mod progress;
mod reader;
mod stopped;
pub(crate) mod telemetry;
pub(crate) mod types;
mod wake;
mod writable;

pub(crate) use health::BrokerHealth;
pub(crate) use latest::{RebuildWanted, key_notes};
pub(crate) use stopped::{BufferFailure, Stopped};
pub(crate) use wake::FetcherWake;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, broadcast};

use crate::fetch::LanePartition;
use crate::plan::{
    AckTracker, CommitPlan, HoldNotice, KeyIndex, LaneAccount, Progress, SideEntry, SplitToken,
    Verdict, may_read, plan_commit, reader_waits_for_commits,
};
use crate::store::{Buffer, Lane, LayoutId, PartitionLayout, PartitionState, StoreError};
use types::{AckToken, CatchupConfig, Delivery, DeliveryLane, Event, Mode};
use writable::{Measured, Probe, Writability};

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

/// The most acknowledgements' room the spare vector keeps between two applications.
const SPARE_ACKS_KEPT: usize = 1 << 16;

/// One assigned partition.
#[derive(Debug)]
pub(crate) struct PartitionRuntime {
    /// Changes with every assignment; deliveries of an older one are not acknowledged.
    pub generation: u64,
    /// The topic's name, shared by every delivery of the assignment (one allocation per
    /// assignment, not one per record).
    topic: std::sync::Arc<str>,
    pub layout: PartitionLayout,
    pub token: Option<SplitToken>,
    pub side: Option<SideEntry>,
    /// The offset the main log holds.
    pub main_committed: i64,
    /// Per lane (catch-up, live): delivered and acknowledged offsets, and the bytes held
    /// against the byte budget.
    lanes: [LaneAccount; 2],
    /// Next offset to read: `Ordered` and `Off` use `ordered_next`, `Concurrent` one per lane.
    ordered_next: i64,
    lane_next: [i64; 2],
    drained: bool,
    /// The live fetcher's lane of this partition (positioned at assignment).
    pub live: LanePartition,
    /// When the partition was assigned, until its first live record is delivered.
    awaiting_fresh_since: Option<std::time::Instant>,
    /// The timestamp (ms) of the newest live record handed out: the live lag in seconds.
    newest_live_ms: Option<i64>,
    /// How fast the backlog is processed: its ETA.
    backlog_rate: crate::plan::BacklogRate,
    /// `Mode::Latest`, while the partition is split: the newest offset of each key.
    latest: Option<KeyIndex>,
    /// The appends reported and the reads that reached the buffer's end: what a fill leaves
    /// out.
    idle: crate::plan::IdleReads,
}

impl PartitionRuntime {
    pub fn new(
        topic: &str,
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
            topic: topic.into(),
            layout: state.layout.clone(),
            token,
            side,
            main_committed,
            lanes: [
                LaneAccount::new(layout_id, catchup_next, state.catchup.fetched_next),
                LaneAccount::new(layout_id, live_next, state.live.fetched_next),
            ],
            ordered_next: if catchup_done {
                live_next
            } else {
                catchup_next
            },
            lane_next: [catchup_next, live_next],
            drained: catchup_done,
            live: LanePartition::live(layout_id, state.live.fetched_next),
            awaiting_fresh_since: Some(std::time::Instant::now()),
            newest_live_ms: None,
            backlog_rate: crate::plan::BacklogRate::default(),
            latest: None,
            idle: crate::plan::IdleReads::default(),
        }
    }

    /// `Mode::Latest`: indexes the keys of this split partition (assigned with `state`;
    /// `seen_end` as [`KeyIndex::for_assignment`] takes it) from now on, the catch-up lane
    /// waiting until what the application may have seen is read again from Kafka (see
    /// [`KeyIndex`]). A partition that is not split has no index.
    pub fn index_keys(&mut self, state: &PartitionState, seen_end: i64) {
        self.latest = KeyIndex::for_assignment(state, seen_end);
    }

    /// Acknowledges `offset` of lane `lane` (an index): the payload bytes it frees once
    /// committed.
    fn acknowledge(&mut self, lane: usize, offset: i64) -> u64 {
        self.lanes[lane].acknowledge(offset)
    }

    /// Records that `offset` (of `bytes` bytes) of lane `lane` (an index) is handed out.
    fn hand_out(&mut self, lane: usize, offset: i64, bytes: usize) {
        self.lanes[lane].hand_out(offset, bytes);
    }

    /// Lane `lane`'s (an index) acknowledgements.
    pub(super) fn acks(&self, lane: usize) -> &AckTracker {
        self.lanes[lane].acks()
    }

    /// Both lanes' accounts, for reading through gaps, planning a commit and its landing.
    pub(super) fn lanes_mut(&mut self) -> [&mut LaneAccount; 2] {
        self.lanes.each_mut()
    }

    /// Bytes acknowledged, both lanes, whose commit has not landed.
    pub(super) fn awaiting_commit(&self) -> u64 {
        self.lanes
            .iter()
            .map(|lane| lane.acks().awaiting_commit())
            .sum()
    }

    /// Bytes of `lane` fetched and not handed to the application yet.
    pub fn undelivered(&self, lane: Lane) -> u64 {
        self.lanes[lane_index(lane)].undelivered_bytes()
    }

    /// Unacknowledged bytes of `lane`.
    pub fn buffered(&self, lane: Lane) -> u64 {
        self.lanes[lane_index(lane)].unacked_bytes()
    }

    /// Whether the backlog is not all delivered yet (until then the catch-up lane is one of
    /// the budget's slots).
    pub fn backlog_undelivered(&self) -> bool {
        !self.drained
    }

    /// What the partition holds that is not handed out, for the free-space floor's decisions
    /// (`ordered`: the mode is `Ordered`).
    fn unprocessed(&self, ordered: bool) -> crate::fetch::Unprocessed {
        crate::fetch::Unprocessed {
            catchup_bytes: self.undelivered(Lane::Catchup),
            live_bytes: self.undelivered(Lane::Live),
            live_waits_for_backlog: crate::fetch::live_waits_for_backlog(
                ordered,
                self.token.is_some(),
                self.drained,
            ),
        }
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
    /// Per lane, the bytes acknowledged when the commit was planned
    /// ([`AckTracker::acked_bytes`]): once it is in Kafka they wait for no commit.
    pub acked: [u64; 2],
}

/// Everything the threads and the reader share.
pub(crate) struct Shared {
    pub buffer: Arc<Buffer>,
    pub config: CatchupConfig,
    pub group: String,
    partitions: Mutex<BTreeMap<PartitionId, PartitionRuntime>>,
    /// The partition each assignment generation was handed out for: an [`AckToken`]
    /// names its partition by it (pruned to the live generations as it grows).
    generations: Mutex<HashMap<u64, PartitionId>>,
    /// Acknowledgements not yet applied to their partitions: `ack` only queues them (one
    /// short lock, no lookup), and whoever takes the partitions' lock next applies them
    /// first, so every reader of the runtimes sees them.
    pending_acks: Mutex<Vec<AckToken>>,
    /// The vector `pending_acks` is swapped with, emptied: applying acks hands neither
    /// vector's memory to another thread to free (the reader allocates, the live thread
    /// applies), and its capacity is kept. Taken only under the partitions' lock.
    spare_acks: Mutex<Vec<AckToken>>,
    /// Woken when records are appended or partitions change.
    pub notify: Notify,
    /// Bumped on every live-lane append: lets `Concurrent` look for fresh records first.
    pub live_appends: AtomicU64,
    /// Bumped on every revocation: the reader drops queued records of revoked partitions.
    pub revocations: AtomicU64,
    /// Bumped on every assignment, empty ones included.
    pub assignments: AtomicU64,
    /// Bytes acknowledged since the last commit: the buffer deletes records only once their
    /// commit is in Kafka, so the live thread commits early when this grows large.
    processed_since_commit: AtomicU64,
    /// The reader holds back until a commit lands (`plan::reader_waits_for_commits`): a
    /// commit is due sooner meanwhile.
    waiting_for_commits: std::sync::atomic::AtomicBool,
    /// What the log said of the reader's hold (`plan::HoldLog`). Looked at under the
    /// partitions' lock, so never contended.
    hold_log: Mutex<crate::plan::HoldLog>,
    /// What the buffer had spilled when the metric was last told (it is told the difference:
    /// another consumer of the same group in this process counts into the same series).
    spilled_reported: AtomicU64,
    /// Partitions whose buffered records failed verification on read: taken off the reader,
    /// waiting for the live thread to discard them and refetch from Kafka (DESIGN
    /// invariant 7).
    damaged: Mutex<BTreeSet<PartitionId>>,
    events: broadcast::Sender<Event>,
    /// `Mode::Latest`: per partition, the offset after the last live record this process
    /// handed out, over all its assignments (a new assignment's key index covers it).
    live_handed_next: Mutex<HashMap<PartitionId, i64>>,
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
    /// The reader wakes the catch-up fetcher through it when it takes catch-up records.
    pub catchup_taken: FetcherWake,
    /// The reader wakes the live thread through it when a commit is wanted sooner.
    pub live_wake: FetcherWake,
}

impl Shared {
    /// A group's state over a fresh buffer in `dir`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(dir: &std::path::Path) -> Self {
        let buffer =
            Buffer::open(dir, crate::store::BufferOptions::default()).expect("test buffer");
        Self::new(
            Arc::new(buffer),
            CatchupConfig::new(dir),
            "group".into(),
            Arc::new(BrokerHealth::new("group", None)),
        )
    }

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
            generations: Mutex::new(HashMap::new()),
            pending_acks: Mutex::new(Vec::new()),
            spare_acks: Mutex::new(Vec::new()),
            notify: Notify::new(),
            live_appends: AtomicU64::new(0),
            processed_since_commit: AtomicU64::new(0),
            spilled_reported: AtomicU64::new(0),
            waiting_for_commits: std::sync::atomic::AtomicBool::new(false),
            hold_log: Mutex::new(crate::plan::HoldLog::default()),
            revocations: AtomicU64::new(0),
            assignments: AtomicU64::new(0),
            damaged: Mutex::new(BTreeSet::new()),
            events,
            next_start: AtomicU64::new(0),
            live_handed_next: Mutex::new(HashMap::new()),
            writability: Writability::new(config_floor),
            stopped: Mutex::new(None),
            subscription: AtomicU64::new(0),
            health,
            catchup_taken: FetcherWake::default(),
            live_wake: FetcherWake::default(),
        }
    }

    /// Whether a fetcher may append now: no write has failed and the filesystem is above
    /// the free-space floor (measured every 200 ms, at every append near the floor and once
    /// the buffer spent the write allowance the last measurement gave it; a change is
    /// reported once).
    pub fn may_write(&self) -> bool {
        let ordered = self.config.mode == Mode::Ordered;
        self.check_disk(self.buffer.write_allowance_spent(), || {
            crate::fetch::nothing_deliverable(
                self.partitions()
                    .values()
                    .map(|runtime| runtime.unprocessed(ordered)),
            )
        })
    }

    /// Warns once, at start, when the buffer's filesystem leaves it less room above the
    /// free-space floor than its byte budget may take ([`crate::fetch::room_short`]). A
    /// measurement that fails says nothing here: the floor's own checks report it.
    pub fn warn_if_room_short(&self) {
        let config = &self.config;
        let (Ok(space), Ok(held)) = (self.buffer.free_space(), self.buffer.disk_bytes()) else {
            return;
        };
        let Some(short) = crate::fetch::room_short(
            &config.disk_floor,
            space,
            held,
            config.buffer_budget_bytes,
            config.disk_allowance_bytes,
        ) else {
            return;
        };
        tracing::warn!(
            path = %self.buffer.dir().display(),
            room_bytes = short.room,
            needed_bytes = short.needed,
            "the buffer's filesystem leaves it {} above the free-space floor, and a byte budget of {} may take about {}: once that room is full fetching pauses, and a backlog in Ordered mode goes on only into the space the buffer frees, down to half the floor; give the buffer more disk or a smaller budget",
            mib(short.room),
            mib(config.buffer_budget_bytes),
            mib(short.needed)
        );
    }

    /// Whether the live fetcher may append to `key` now ([`may_write`](Self::may_write), and
    /// `key` not [`held_below_floor`](Self::held_below_floor)).
    pub fn may_write_live(&self, key: &PartitionId) -> bool {
        self.may_write() && !self.held_below_floor().contains(key)
    }

    /// The partitions whose live lane may not be written while writing goes on below the
    /// floor ([`crate::fetch::held_below_floor`]). Empty above the floor.
    pub fn held_below_floor(&self) -> BTreeSet<PartitionId> {
        let ordered = self.config.mode == Mode::Ordered;
        if !ordered || !self.writability.below_floor() {
            return BTreeSet::new();
        }
        crate::fetch::held_below_floor(
            true,
            self.partitions()
                .iter()
                .map(|(key, runtime)| (key.clone(), runtime.unprocessed(ordered))),
        )
    }

    /// Whether the buffer may write its memory out at a clean close, and how much (the write
    /// allowance): measured once more, since a fetcher's last measurement may be minutes old,
    /// and never counted as drained (its partitions are gone, not processed), which would
    /// resume writing below the floor.
    pub fn may_write_at_close(&self) -> bool {
        self.check_disk(true, || false)
    }

    fn check_disk(&self, due: bool, drained: impl FnOnce() -> bool) -> bool {
        if self.writability.failure().is_some() {
            return false;
        }
        let (measured, allowance) = self.writability.check(
            due,
            |exact| {
                if exact {
                    if let Err(err) = self.buffer.write_out() {
                        if err.is_io_failure() {
                            self.write_failed(&err);
                        }
                    }
                }
                let unwritten = self.buffer.unwritten_bytes();
                let space = self.buffer.free_space().map_err(|e| e.to_string())?;
                Ok(Probe { space, unwritten })
            },
            drained,
        );
        if let Some(disk_bytes) = allowance {
            self.buffer.set_write_allowance(disk_bytes);
        }
        match measured {
            Measured::Unchanged => {}
            Measured::Changed(change) => {
                let path = self.buffer.dir().to_path_buf();
                if change.repeated {
                    // A drained buffer going on below the floor, a margin at a time: the
                    // first stop and resume said so.
                    tracing::info!(
                        path = %path.display(),
                        available_bytes = change.available,
                        floor_bytes = change.floor,
                        "below the free-space floor ({} free, floor {}): fetching {}",
                        mib(change.available),
                        mib(change.floor),
                        if change.low { "paused again" } else { "resumes again into the space the buffer already holds" }
                    );
                } else if change.low {
                    tracing::warn!(
                        path = %path.display(),
                        available_bytes = change.available,
                        floor_bytes = change.floor,
                        "the buffer's filesystem is below its free-space floor ({} free, floor {}): fetching paused until space returns",
                        mib(change.available),
                        mib(change.floor)
                    );
                } else if change.reusing {
                    tracing::warn!(
                        path = %path.display(),
                        available_bytes = change.available,
                        "nothing the buffer holds can be processed before more is written: fetching resumes below the free-space floor ({} free, floor {}) into the space the buffer already holds",
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
        !self.writability.disk_low() && self.writability.failure().is_none()
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

    /// The partitions' runtimes, with every acknowledgement queued so far applied.
    pub fn partitions(&self) -> MutexGuard<'_, BTreeMap<PartitionId, PartitionRuntime>> {
        // The map is only ever replaced entry by entry; a panic elsewhere leaves it usable.
        let mut partitions = self
            .partitions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Taken under the partitions' lock: acks queued before it are applied before anyone
        // who got the lock first (a commit at a revoke) is done with them.
        let mut spare = self
            .spare_acks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        {
            let mut pending = self
                .pending_acks
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if pending.is_empty() {
                return partitions;
            }
            std::mem::swap(&mut *pending, &mut *spare);
        }
        self.apply_acks(&mut partitions, &spare);
        spare.clear();
        // A burst (acks queued while the lock was held long) does not pin its memory.
        spare.shrink_to(SPARE_ACKS_KEPT);
        drop(spare);
        partitions
    }

    /// Queues an acknowledgement (see `pending_acks`).
    pub fn queue_ack(&self, token: AckToken) {
        self.pending_acks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(token);
    }

    /// Queues acknowledgements to apply, under one lock.
    pub fn queue_acks(&self, tokens: impl IntoIterator<Item = AckToken>) {
        self.pending_acks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(tokens);
    }

    /// A new assignment generation for partition `id`: unique in the process (two consumers'
    /// tokens never name each other's assignments).
    pub fn next_generation(&self, id: &PartitionId) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let generation = NEXT.fetch_add(1, Ordering::Relaxed);
        // Entries of generations no longer assigned are dropped once they outnumber the
        // assigned ones. Each lock is let go before the next is taken (one statement each:
        // a guard lives to the end of its statement).
        let entries = self.generations().len();
        let assigned = self.partitions().len();
        let live: Option<HashSet<u64>> = if entries > 2 * assigned + 64 {
            Some(self.partitions().values().map(|r| r.generation).collect())
        } else {
            None
        };
        let mut generations = self.generations();
        if let Some(live) = live {
            generations.retain(|generation, _| live.contains(generation));
        }
        generations.insert(generation, id.clone());
        generation
    }

    /// The index of generations (applying acks takes it while holding the partitions' lock;
    /// nothing takes the partitions' lock while holding it).
    pub(super) fn generations(&self) -> MutexGuard<'_, HashMap<u64, PartitionId>> {
        self.generations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn emit(&self, event: Event) {
        tracing::debug!(?event, "catchup event");
        telemetry::event(&self.group, &event);
        let _ = self.events.send(event); // no subscriber is fine
    }

    pub fn subscribe_events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Counts `bytes` appended to `lane` of `key` in `layout`, which left the lane fetched up
    /// to `fetched_next`, against the byte budget (see [`LaneAccount`]: an append of another
    /// layout, or below where this assignment's count starts, is not counted). Every append
    /// the buffer took is reported, records or not: the reader reads again only partitions
    /// reported since a read reached their end ([`crate::plan::IdleReads`]).
    pub fn add_buffered(
        &self,
        key: &PartitionId,
        lane: Lane,
        layout: LayoutId,
        fetched_next: i64,
        bytes: u64,
    ) {
        if let Some(runtime) = self.partitions().get_mut(key) {
            runtime.idle.appended(lane);
            runtime.lanes[lane_index(lane)].appended(layout, fetched_next, bytes);
        }
    }

    /// Unacknowledged bytes of `lane` per assigned partition.
    pub fn buffered_by_partition(&self, lane: Lane) -> BTreeMap<PartitionId, u64> {
        self.partitions()
            .iter()
            .map(|(key, runtime)| (key.clone(), runtime.buffered(lane)))
            .collect()
    }

    /// Bytes of `lane` fetched and not handed out yet, per assigned partition, that the
    /// reader could take now: a live lane waiting behind its backlog in `Ordered` counts none
    /// (its records wait by design, and the budget's share bounds them).
    pub fn undelivered_by_partition(&self, lane: Lane) -> BTreeMap<PartitionId, u64> {
        let fresh_first = self.config.mode.fresh_first();
        self.partitions()
            .iter()
            .map(|(key, runtime)| {
                let counted = crate::fetch::read_ahead_bytes(
                    lane,
                    fresh_first,
                    runtime.drained,
                    runtime.undelivered(lane),
                );
                (key.clone(), counted)
            })
            .collect()
    }

    /// The byte budget's slots: a live lane per assigned partition, plus a catch-up lane per
    /// partition whose backlog is not read through yet.
    pub fn budget_slots(&self) -> usize {
        self.partitions()
            .values()
            .map(|runtime| 1 + usize::from(runtime.backlog_undelivered()))
            .sum()
    }

    /// Delivered records not yet acknowledged, over all partitions.
    pub fn unacked(&self) -> usize {
        self.partitions()
            .values()
            .map(|r| {
                r.lanes
                    .iter()
                    .map(|lane| lane.acks().unacked())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Whether every assigned partition has its split merged and all deliveries acked and
    /// committed.
    pub fn settled(&self) -> bool {
        self.partitions().values().all(|runtime| {
            runtime.token.is_none()
                && runtime.lanes.iter().all(|lane| lane.acks().unacked() == 0)
                && runtime.main_committed >= runtime.acks(1).committable()
        })
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BufferOptions, OffsetRange};

    const KEY: fn() -> PartitionId = || ("orders".to_owned(), 0);

    /// A split partition (backlog 0..1000) whose catch-up lane was fetched up to 100 before
    /// this assignment, in a consumer of its own.
    fn consumer_with_split(dir: &std::path::Path) -> Shared {
        let buffer = Buffer::open(dir, BufferOptions::default()).expect("buffer");
        let shared = Shared::new(
            Arc::new(buffer),
            CatchupConfig::new(dir),
            "group".into(),
            Arc::new(BrokerHealth::new("group", None)),
        );
        let mut state = PartitionState::new(PartitionLayout {
            epoch: 1,
            catchup_ranges: vec![OffsetRange::new(0, 1000)],
            live_from: 1000,
        });
        state.catchup.fetched_next = 100;
        let runtime = PartitionRuntime::new(&KEY().0, 1, &state, LayoutId(1), None, None, 0);
        shared.partitions().insert(KEY(), runtime);
        shared
    }

    fn undelivered(shared: &Shared) -> u64 {
        shared.partitions()[&KEY()].undelivered(Lane::Catchup)
    }

    fn hand_out(shared: &Shared, offset: i64, bytes: usize) {
        let catchup = lane_index(Lane::Catchup);
        if let Some(runtime) = shared.partitions().get_mut(&KEY()) {
            runtime.hand_out(catchup, offset, bytes);
        }
    }

    fn acknowledge(shared: &Shared, offset: i64) {
        let catchup = lane_index(Lane::Catchup);
        if let Some(runtime) = shared.partitions().get_mut(&KEY()) {
            runtime.acknowledge(catchup, offset);
        }
    }

    #[test]
    fn what_is_fetched_and_not_handed_out_is_counted_in_any_order() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = consumer_with_split(dir.path());
        let layout = shared.partitions()[&KEY()].live.cursor().layout();
        // A late append of an earlier assignment (below where this one counts from).
        shared.add_buffered(&KEY(), Lane::Catchup, layout, 100, 500);
        assert_eq!(undelivered(&shared), 0, "a stale append is not counted");
        // One of another layout (a partition laid out afresh since), counted late.
        shared.add_buffered(&KEY(), Lane::Catchup, LayoutId(layout.0 + 1), 103, 30);
        assert_eq!(undelivered(&shared), 0, "nor one of another layout");
        // Records the buffer held before this assignment count for nothing either way.
        hand_out(&shared, 50, 10);
        acknowledge(&shared, 50);
        assert_eq!(undelivered(&shared), 0);
        // 100..103 fetched (10 bytes each), then handed out one by one.
        shared.add_buffered(&KEY(), Lane::Catchup, layout, 103, 30);
        assert_eq!(undelivered(&shared), 30);
        hand_out(&shared, 100, 10);
        assert_eq!(undelivered(&shared), 20);
        // Acknowledging a handed-out record frees it from both counters.
        acknowledge(&shared, 100);
        assert_eq!(undelivered(&shared), 20);
        hand_out(&shared, 101, 10);
        hand_out(&shared, 102, 10);
        assert_eq!(undelivered(&shared), 0);
        // The reader may hand out and acknowledge before the fetcher counts the append.
        hand_out(&shared, 103, 10);
        acknowledge(&shared, 103);
        assert_eq!(undelivered(&shared), 0, "never below zero");
        shared.add_buffered(&KEY(), Lane::Catchup, layout, 104, 10);
        assert_eq!(undelivered(&shared), 0, "the two cancel out");
        acknowledge(&shared, 101);
        acknowledge(&shared, 102);
        let runtime = &shared.partitions()[&KEY()];
        assert_eq!(runtime.buffered(Lane::Catchup), 0, "all acknowledged");
        assert_eq!(runtime.undelivered(Lane::Catchup), 0);
    }

    #[test]
    fn the_reader_wakes_the_live_thread_when_a_commit_is_wanted_sooner() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = consumer_with_split(dir.path());
        let woken = Arc::new(AtomicUsize::new(0));
        let counter = woken.clone();
        shared.live_wake.wake_with(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        let woken = || woken.load(Ordering::Relaxed);
        // Processed bytes bring a commit forward at the early commit's mark.
        let mark = crate::fetch::early_commit_bytes(shared.config.buffer_budget_bytes);
        shared.add_processed(mark - 1);
        assert_eq!(woken(), 0, "below the mark");
        shared.add_processed(1);
        assert_eq!(woken(), 1, "at the mark");
        shared.add_processed(mark);
        assert_eq!(woken(), 1, "once per crossing");
        shared.take_processed_since_commit();
        shared.add_processed(2 * mark);
        assert_eq!(woken(), 2, "a commit started: crossed again");
        // The reader starts holding back for commits: a commit is due now.
        let limit = shared.config.buffer_budget_bytes / 8;
        hand_out(&shared, 100, limit as usize);
        acknowledge(&shared, 100);
        let awaiting = shared.awaiting_commits(&shared.partitions());
        assert!(shared.reader_waits_for_commits(), "{awaiting} bytes wait");
        assert_eq!(woken(), 3, "the hold starts");
        shared.awaiting_commits(&shared.partitions());
        assert_eq!(woken(), 3, "once per hold");
    }
}
