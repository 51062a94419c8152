//! A deterministic simulation of the consumer without a broker, driven by one seed.
//!
//! One to three partitions of a topic, all assigned to one member. Each has its log (records,
//! compaction gaps, transaction markers, retention deleting the head, records arriving while
//! fetching, a high watermark that briefly goes back on a leader change). Two simulated
//! consumers behave like librdkafka where it matters: the group member fetches the live lanes
//! of every partition behind one queue, and its errors name no partition (an out-of-range
//! error ends every chain, and the watermarks tell whose it was); the catch-up consumer
//! fetches the backlogs, names the partition of an error on a partition's queue but not on
//! its main queue, and its creation can fail (its partitions wait, then are assigned once it
//! exists). Positions move only past what was handed out and markers; a reassign resets the
//! position asynchronously; a seek is refused while a partition is stopped, and under an
//! eager protocol only an assignment of everything moves it. The production code runs as it
//! is: the lane state machines ([`LanePartition`]) fed through [`Round`], reconciliation
//! ([`reconcile`]) at every assignment with its writes sent as one commit cycle, then its
//! local step ([`LocalStep`]) — a partition whose write failed waits, paused at the log end
//! under the member's client, and is retried; a retry that reconciles it hands that client to
//! the live lane with its chain broken; a local step may also fail without stopping the
//! consumer (a state read back damaged, a start offset not set once the catch-up lane was
//! handed the partition), and the partition waits the same way —, the topic-id fallback
//! ([`incarnation_unknown`]) when the id cannot be read, the commit plans ([`plan_commit`]) and the commit cycle
//! ([`CommitCycle`]) with refused main-log writes and failed side-log writes — a scheduled
//! cycle sent in one step and recorded in a later one, the lanes fetched and the readers
//! reading and acking between, as the group member's commit thread sends it — and the real
//! [`Buffer`] on a temporary directory, read by readers that ack in any order. The process
//! crashes at any step, between two writes included (to Kafka, or to the buffer at an
//! assignment); revokes leave stale writers behind. In half the histories a crash may lose
//! the buffer (marked untrusted, then emptied at the next start), in half it may damage one
//! of its chunks on disk (a byte changed, or the chunk gone). A read may find a partition's
//! records damaged (injected, or on disk): its runtime goes at once, and the live thread
//! later discards its records and reconciles it again from Kafka (`refetch_damaged`); a
//! reuse or a commit that finds the damage is handled as the member handles it. One history
//! in three has a free-space
//! floor ([`DiskGuard`] over a simulated disk): below it every append fails, as the fetchers
//! answer it. Before each round a fetcher pauses and resumes its partitions' clients by the
//! production decisions ([`WriteStops`] for the floor's stops and for clients that are new or
//! were paused out of band — a partition waiting to be reconciled is paused — and, in the
//! histories with a byte budget, [`PausePolicy`] for each partition's share, counted by the
//! production account of each lane, [`LaneAccount`], fed by the appends, hand-outs and acks —
//! a catch-up append counted late, after the reader, the application or a reassignment came
//! between, as the catch-up fetcher's own thread may count it); the budget's read-ahead holds
//! a lane whose reader has not taken what it fetched (the catch-up fetcher leaves its queue
//! untaken, or takes it up to its room; the group member takes a message a turn), and one
//! budget in ten is a few bytes; a budgeted history with a floor drains on the disk it has,
//! often smaller than its budget. Time is simulated (`STEP_TIME` per step): holds and backoffs
//! run on it.
//!
//! Oracle: what Kafka claims processed — read back, after every write, by reconciliation as a
//! restarted consumer would — holds only delivered records (invariant 1); deliveries strictly
//! increase per lane within a process lifetime (invariant 2); every delivered record is the
//! log's record at that offset; stale writers are refused (invariant 8); a side entry this
//! consumer wrote is never rejected as forged or implausible; the byte budget never counts
//! more bytes unacknowledged than a lane holds, nor falls behind its hand-outs by more than
//! the counts still to come, and its counts are back to zero once everything is
//! acknowledged; and once faults stop, everything is delivered and committed
//! (no stall).
//!
//! Shared by `tests/simulation.rs` (thousands of seeds) and the `fetch_sim` fuzz target.

#![allow(dead_code)] // the fuzz target and the test use different parts

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use catchup::fetch::{
    AfterOutOfRange, AppendResult, DiskFloor, DiskGuard, DiskSpace, Facts, Hold, LanePartition,
    PausePolicy, PausedHolds, PollErrorKind, Polled as LanePolled, Round, Schedule, Unprocessed,
    WriteStops, held_below_floor, live_waits_for_backlog, nothing_deliverable, read_ahead_bytes,
    read_ahead_room, read_ahead_share,
};
use catchup::plan::{
    CommitCycle, CommitPlan, Committed, Decision, IdleReads, Inputs, KeyIndex, LaneAccount,
    LocalStep, MainLogCommit, OffsetReset, PlanEvent, Progress, ReadSlot, SideEntry, SideValue,
    SideWrite, SplitSecret, SplitToken, commit_landed, commit_planned, incarnation_unknown,
    may_read, plan_commit, reader_waits_for_commits, reconcile, side_key, waits_unreconciled,
};
#[path = "world.rs"]
mod world;

pub use world::Rng;
use world::{Client, Entry, Log, Polled, key_of, payload, record};

use catchup::store::OffsetRange;

use catchup::plan::Verdict;
use catchup::store::{
    Buffer, BufferOptions, Lane, LayoutId, PartitionLayout, PartitionState, StoreError,
};

/// One fetcher of one partition: a simulated client and the production lane state machine
/// (`fetch::LanePartition`), driven in the order the adapters drive it.
struct Fetcher {
    lane: Lane,
    /// The partition (its index in `Sim::parts`).
    part: usize,
    /// Which assignment of the partition it fetches for (what the live fetcher's rounds
    /// key polled records by: `PartitionRuntime::generation`).
    generation: u64,
    client: Client,
    state: LanePartition,
    /// A writer left behind by a revoke: every append it makes must be refused.
    zombie: bool,
    /// `Latest`: a catch-up-like lane reading keys again into the partition's index, up to
    /// this offset (its appends go to the index, never to the buffer).
    rebuild: Option<i64>,
}

impl Fetcher {
    /// Whether the catch-up consumer (the rebuild consumer: `rebuild`) tracks this fetcher's
    /// partition: a catch-up lane of the current assignment, of that role.
    fn tracked_by(&self, rebuild: bool) -> bool {
        self.lane == Lane::Catchup && !self.zombie && self.rebuild.is_some() == rebuild
    }
}

/// The reader of one lane: deliveries, acks, commits.
struct Reader {
    lane: Lane,
    next: i64,
    /// The production account of the lane (`PartitionRuntime`'s): its acknowledgements and
    /// the bytes the byte budget counts.
    account: LaneAccount,
    unacked: Vec<i64>,
    last_delivered: Option<i64>,
}

impl Reader {
    /// A reader at `committed` of a lane fetched up to `fetched` in `layout` when its runtime
    /// was made.
    fn new(lane: Lane, layout: LayoutId, committed: i64, fetched: i64) -> Self {
        Self {
            lane,
            next: committed,
            account: LaneAccount::new(layout, committed, fetched),
            unacked: Vec::new(),
            last_delivered: None,
        }
    }
}

/// One read in this many finds its partition's records damaged (under faults).
const DAMAGE_ODDS: u64 = 500;

/// One of the catch-up fetcher's consumers (its catch-up role's or its rebuild role's):
/// whether it exists. Its creation can fail and is retried after its hold (the production
/// [`Hold`]), its partitions waiting meanwhile.
#[derive(Debug, Default)]
struct FetcherConsumer {
    created: bool,
    hold: Hold,
}

/// Where the buffer in `dir` keeps its sled database (in the generation `CURRENT` names),
/// and the segment size it was made with.
fn sled_files(dir: &std::path::Path) -> (PathBuf, usize) {
    let dir = match std::fs::read_to_string(dir.join("CURRENT")) {
        Ok(name) => dir.join(name.trim()),
        Err(_) => dir.to_path_buf(),
    };
    let conf = std::fs::read(dir.join("conf")).unwrap_or_default();
    let segment = String::from_utf8_lossy(&conf)
        .lines()
        .find_map(|line| line.strip_prefix("segment_size: ")?.trim().parse().ok())
        .unwrap_or(BufferOptions::default().segment_bytes);
    (dir, segment)
}

/// The buffer's sled database in `dir`, opened by sled itself, to damage it as a disk
/// would.
fn raw_sled(dir: &std::path::Path) -> sled::Result<sled::Db> {
    let (dir, segment) = sled_files(dir);
    sled::Config::new()
        .path(dir)
        .segment_size(segment)
        .flush_every_ms(None)
        .open()
}

/// How a process of the simulation opens its buffer: nothing needs durability, so no
/// periodic flush (closing a buffer waits for sled's flusher to end, up to its period),
/// at the segment size the buffer in `dir` was made with (the fuzz target's are larger).
fn reopen_options(dir: &std::path::Path) -> BufferOptions {
    BufferOptions {
        flush_every_ms: None,
        segment_bytes: sled_files(dir).1,
        ..BufferOptions::default()
    }
}

/// Nine in ten of the catch-up consumer's errors are followed by fewer entries of their run
/// than this (all of them were, before longer tails were drawn).
const SHORT_TAIL: u64 = 4;

/// The appends of a round, in order.
#[derive(Clone, Copy)]
enum Step {
    Polled,
    Truncated,
}

/// Whether a fetcher stays after its round.
enum RoundEnd {
    Keep,
    Remove,
}

/// How a partition's local step at an assignment ended: its fetchers started, or the process
/// died inside it (and a new one has been assigned everything).
enum Applied {
    Started,
    /// A step failed without stopping the consumer: the partition waits to be reconciled
    /// again.
    Deferred,
    Crashed,
}

/// An append the buffer took, to be counted against the byte budget (`Shared::add_buffered`).
struct Count {
    part: usize,
    lane: Lane,
    /// The layout the append was made in.
    layout: LayoutId,
    /// The lane's fetched position after it.
    fetched_next: i64,
    bytes: u64,
}

/// The buffer's answer to an append, as the adapters read it (`None`: the writer is stale and
/// leaves). A stale writer's append that is accepted, or a write that fails (the append's own
/// or the memory tier's spill after it: the simulation injects no I/O failure, so either is a
/// bookkeeping error, such as a spill out of order), is a failure.
fn answer(
    result: Result<catchup::store::AppendOutcome, StoreError>,
    zombie: bool,
    lane: Lane,
) -> Result<Option<AppendResult>, Failure> {
    match &result {
        Ok(_) if zombie => return Err(format!("a stale {lane} writer's append was accepted")),
        Ok(outcome) => {
            if let Some(err) = &outcome.relief_failed {
                return Err(format!(
                    "the memory tier's spill after a {lane} append: {err}"
                ));
            }
        }
        Err(StoreError::StaleLayout { .. } | StoreError::Discontinuous { .. }) => {}
        Err(other) => return Err(format!("append: {other}")),
    }
    Ok(AppendResult::from_store(&result))
}

/// A simulation failure: the seed replays it.
pub type Failure = String;

/// What Kafka holds for the group and one partition.
#[derive(Debug, Default)]
struct KafkaState {
    /// The main log's committed offset and metadata.
    committed: Option<Committed>,
    /// The side topic's latest value under the partition's key.
    side: Option<Vec<u8>>,
}

/// One partition: its log, what Kafka holds for it, the runtime the engine keeps for it
/// between commits, its readers, and what was delivered.
struct Part {
    log: Log,
    /// The first offset the oracle holds the consumer to (the group's committed offset at
    /// the start).
    start: i64,
    kafka: KafkaState,
    layout: PartitionLayout,
    token: Option<SplitToken>,
    side_entry: Option<SideEntry>,
    main_committed: i64,
    readers: [Reader; 2],
    /// The production reader's record of appends reported and reads that reached the
    /// buffer's end (`PartitionRuntime`'s): which reads a fill would leave out.
    idle: IdleReads,
    /// `Ordered`: where the reader goes on in delivery order, and the last offset it handed
    /// out in this process lifetime.
    ordered_next: i64,
    last_ordered: Option<i64>,
    /// Offsets processed: delivered, or skipped as superseded in `Latest`.
    delivered: BTreeSet<i64>,
    /// `Latest`: the partition's key index while it is split (the production [`KeyIndex`]).
    index: Option<KeyIndex>,
    /// `Latest`: records read and not yet handed out, per lane (the engine's reader reads
    /// ahead into queues; a newer record of a key can be noted meanwhile).
    queued: [std::collections::VecDeque<catchup::store::Record>; 2],
    /// `Latest`: per key, the newest offset handed out during this assignment.
    handed_in_assignment: HashMap<Vec<u8>, i64>,
    /// `Latest`: per key, the newest offset the live lane handed out, in any lifetime and
    /// in this one.
    live_handed: HashMap<Vec<u8>, i64>,
    live_handed_here: HashMap<Vec<u8>, i64>,
    /// `Latest`: the offset after the last live record this process handed out.
    live_handed_next: Option<i64>,
    /// `Latest`: where the live lane resumed at this assignment (its checkpoint): what an
    /// earlier lifetime handed out from there on is handed out again.
    live_resumed: i64,
    /// `Latest`: the end of the first catch-up range at this assignment. The backlog below
    /// it is replayed from the committed offset in log order (records an earlier lifetime
    /// handed out included, live or not), as any consumer's restart replays; what the live
    /// lane handed out at or beyond it is not replayed, and no older value of its key may
    /// follow it.
    replay_end: i64,
    /// `Latest`: how far the key index's rebuild has read in this assignment, each time it
    /// said, with the log start then: an offset it passed while retention had deleted it was
    /// never read again.
    rebuilt: Vec<(i64, i64)>,
    /// `Latest`: per key, the offset handed out last (in time, across lifetimes): the
    /// application's state.
    last_handed: HashMap<Vec<u8>, i64>,
}

impl Part {
    /// A partition whose log starts with fewer than `entries` entries.
    fn new(rng: &mut Rng, entries: u64) -> Self {
        let mut log = Log {
            entries: Vec::new(),
            low: 0,
            lowered_high: None,
        };
        for _ in 0..rng.below(entries) {
            log.produce(rng);
        }
        // Compaction gaps anywhere but the last entry.
        let high = log.high();
        for _ in 0..rng.below(30) {
            let at = rng.below(high.max(1) as u64) as i64;
            if at + 1 < high && log.entries[at as usize] == Entry::Record {
                log.entries[at as usize] = Entry::Compacted;
            }
        }
        let start = rng.below(high as u64 / 2 + 1) as i64;
        Self {
            log,
            start,
            kafka: KafkaState {
                committed: Some(Committed {
                    offset: start,
                    metadata: String::new(),
                }),
                side: None,
            },
            layout: PartitionLayout::plain(start),
            token: None,
            side_entry: None,
            main_committed: start,
            readers: [
                Reader::new(Lane::Catchup, LayoutId(0), 0, 0),
                Reader::new(Lane::Live, LayoutId(0), 0, 0),
            ],
            idle: IdleReads::default(),
            ordered_next: 0,
            last_ordered: None,
            delivered: BTreeSet::new(),
            index: None,
            queued: Default::default(),
            handed_in_assignment: HashMap::new(),
            live_handed: HashMap::new(),
            live_handed_here: HashMap::new(),
            live_handed_next: None,
            live_resumed: 0,
            replay_end: 0,
            rebuilt: Vec::new(),
            last_handed: HashMap::new(),
        }
    }
}

/// What a history ran through, for the report: the suite checks every fault was reached.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u64,
    pub partitions: u64,
    pub splits: u64,
    /// Layouts with several catch-up ranges (re-splits).
    pub multi_range: u64,
    pub merges: u64,
    /// Out-of-range positions judged a truncation, and positions held past the log end.
    pub truncations: u64,
    pub holds: u64,
    /// Errors that named no partition and ended every chain of their consumer.
    pub unnamed_errors: u64,
    /// Transient errors a consumer took in a run, which moved its position past an offset
    /// it never fetched.
    pub transient_errors_in_runs: u64,
    /// Histories whose group member takes its partitions' queues in runs.
    pub member_runs: u64,
    /// Errors the group member took in a partition's run, naming it: its position moved
    /// past them.
    pub member_run_errors: u64,
    /// Entries the catch-up consumer took in the same run after an error (the batch call
    /// hands out the rest of its run; the error ended the queue's turn).
    pub taken_after_an_error: u64,
    /// Of those, entries taken more than [`SHORT_TAIL`] after their error.
    pub long_tails: u64,
    /// Assignments of everything made to move a partition whose seek was refused (eager).
    pub eager_reassigns: u64,
    /// Main-log writes refused within a commit request (an assignment's included).
    pub commit_refusals: u64,
    /// Partitions whose assignment failed at a write to Kafka and waited to be assigned
    /// again.
    pub assign_deferrals: u64,
    /// Writes to Kafka reported failed that were applied all the same (a timed-out request).
    pub failed_yet_written: u64,
    /// Failed creations of the catch-up consumer.
    pub create_failures: u64,
    /// Failed creations of the rebuild consumer (`Latest`).
    pub rebuild_create_failures: u64,
    /// Assignments of a partition to the catch-up consumer that failed (the consumer's
    /// `incremental_assign`): when it is tracked, and when it is moved.
    pub catchup_assign_failures: u64,
    /// Partitions revoked and assigned again inside a poll round of the group member.
    pub rebalances_in_a_round: u64,
    /// Assignments during which the topic's id could not be read.
    pub id_failures: u64,
    /// Assignments that could not read the group's offsets (every partition waited), and
    /// partitions that waited for what could not be read (a split's side entry, records of
    /// an unknown incarnation that could not be dropped): `plan::waits_unreconciled`.
    pub offsets_unread: u64,
    pub waited_unread: u64,
    /// Reuses the buffer refused, laid out afresh instead (the member's fallback).
    pub reuse_fallbacks: u64,
    /// Partitions reconciled on a retry whose live lane started from the member's client
    /// parked at the log end (and was moved to the buffer's position).
    pub parked_repositioned: u64,
    /// Crashes inside an assignment's local steps: between a partition's two buffer writes,
    /// or between two partitions.
    pub local_step_crashes: u64,
    /// Reads that found a partition's records damaged, and partitions discarded for it and
    /// reconciled again (a revoke or a crash may come first).
    pub damaged_reads: u64,
    pub damaged_refetched: u64,
    /// Local steps that failed without stopping the consumer (a state read back damaged, a
    /// start offset not set): the partition waited to be reconciled again.
    pub local_failures: u64,
    /// The free-space floor: histories with a simulated disk, times writing stopped below
    /// the floor, appends refused meanwhile, and resumes below the floor on a drained buffer.
    pub disks: u64,
    pub disk_stops: u64,
    pub disk_refusals: u64,
    pub disk_reuses: u64,
    /// Live appends refused below the floor while a split partition waited for its backlog.
    pub disk_live_stops: u64,
    /// Histories with a byte budget, and the pauses its policy applied to a client.
    pub budgets: u64,
    pub budget_pauses: u64,
    /// Appends counted against the byte budget after other steps came between the append
    /// and its count.
    pub late_counts: u64,
    /// Reads the production reader would have left out (`IdleReads`: they reached the
    /// buffer's end before the last reported append), and of them those that found records
    /// whose report was still to come (the reader reads them once it comes).
    pub reads_left_out: u64,
    pub left_out_awaiting_report: u64,
    /// Of the counts, those made after their partition's layout changed (a reassignment
    /// since): the account must not count them.
    pub counts_of_old_layouts: u64,
    /// Partitions held to their read-ahead (their reader had not taken what was fetched).
    pub read_ahead_holds: u64,
    /// Rounds a fetcher polled less because of the read-ahead: a catch-up queue left
    /// untaken or taken only up to its room, the group member taking one message.
    pub read_ahead_rounds: u64,
    /// Histories whose catch-up lanes share one queue.
    pub shared_queues: u64,
    /// Partitions held in a shared queue and paused for it.
    pub hold_pauses: u64,
    /// Histories that drained on a disk with less room above the floor than their budget (a
    /// simulated record takes its size on disk: a weaker condition than `fetch::room_short`,
    /// which allows for sled's overhead), through the floor.
    pub short_drains: u64,
    /// Histories whose buffer kept appends in memory (a small allowance: spills are common).
    pub memory_tier: u64,
    /// Crashes that lost records the memory tier held.
    pub memory_lost: u64,
    /// Histories whose restarts may find the buffer lost.
    pub losing_histories: u64,
    /// Restarts that found the buffer lost: marked untrusted after a failed write, emptied
    /// and opened again, as the consumer's start does.
    pub buffers_lost: u64,
    /// Histories whose restarts may find the buffer damaged on disk.
    pub damaging_histories: u64,
    /// Chunks damaged on disk between two processes (a byte changed, or the chunk gone).
    pub disk_damages: u64,
    /// Reads that found damage on disk.
    pub damage_found: u64,
    /// Reuses at an assignment that found the damage, and laid the partition out afresh.
    pub damaged_reuses: u64,
    /// Commits whose record in the buffer found the damage.
    pub damaged_commits: u64,
    /// Bytes the memory tier wrote to sled when it held more than its allowance.
    pub spilled_bytes: u64,
    /// Histories in `Latest`.
    pub latest: u64,
    /// `Latest`: records skipped because a newer one of their key was buffered or handed out.
    pub superseded: u64,
    /// `Latest`: assignments whose catch-up lane waited for the keys to be read again.
    pub rebuilds: u64,
    /// Reads that handed out nothing because what was acknowledged waited for commits.
    pub commit_waits: u64,
    /// Histories whose drain began with one partition's every commit failing, until the
    /// others were all delivered and committed, and in which the reader held that partition
    /// back (the others read on).
    pub failing_partition_drains: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, other: Self) {
        self.steps += other.steps;
        self.partitions += other.partitions;
        self.splits += other.splits;
        self.multi_range += other.multi_range;
        self.merges += other.merges;
        self.truncations += other.truncations;
        self.holds += other.holds;
        self.unnamed_errors += other.unnamed_errors;
        self.transient_errors_in_runs += other.transient_errors_in_runs;
        self.member_runs += other.member_runs;
        self.member_run_errors += other.member_run_errors;
        self.taken_after_an_error += other.taken_after_an_error;
        self.long_tails += other.long_tails;
        self.eager_reassigns += other.eager_reassigns;
        self.commit_refusals += other.commit_refusals;
        self.assign_deferrals += other.assign_deferrals;
        self.failed_yet_written += other.failed_yet_written;
        self.create_failures += other.create_failures;
        self.rebuild_create_failures += other.rebuild_create_failures;
        self.catchup_assign_failures += other.catchup_assign_failures;
        self.rebalances_in_a_round += other.rebalances_in_a_round;
        self.id_failures += other.id_failures;
        self.offsets_unread += other.offsets_unread;
        self.waited_unread += other.waited_unread;
        self.reuse_fallbacks += other.reuse_fallbacks;
        self.parked_repositioned += other.parked_repositioned;
        self.local_step_crashes += other.local_step_crashes;
        self.damaged_reads += other.damaged_reads;
        self.damaged_refetched += other.damaged_refetched;
        self.local_failures += other.local_failures;
        self.disks += other.disks;
        self.disk_stops += other.disk_stops;
        self.disk_refusals += other.disk_refusals;
        self.disk_reuses += other.disk_reuses;
        self.disk_live_stops += other.disk_live_stops;
        self.budgets += other.budgets;
        self.budget_pauses += other.budget_pauses;
        self.late_counts += other.late_counts;
        self.reads_left_out += other.reads_left_out;
        self.left_out_awaiting_report += other.left_out_awaiting_report;
        self.counts_of_old_layouts += other.counts_of_old_layouts;
        self.read_ahead_holds += other.read_ahead_holds;
        self.read_ahead_rounds += other.read_ahead_rounds;
        self.shared_queues += other.shared_queues;
        self.hold_pauses += other.hold_pauses;
        self.short_drains += other.short_drains;
        self.memory_tier += other.memory_tier;
        self.memory_lost += other.memory_lost;
        self.losing_histories += other.losing_histories;
        self.buffers_lost += other.buffers_lost;
        self.damaging_histories += other.damaging_histories;
        self.disk_damages += other.disk_damages;
        self.damage_found += other.damage_found;
        self.damaged_reuses += other.damaged_reuses;
        self.damaged_commits += other.damaged_commits;
        self.spilled_bytes += other.spilled_bytes;
        self.latest += other.latest;
        self.superseded += other.superseded;
        self.commit_waits += other.commit_waits;
        self.failing_partition_drains += other.failing_partition_drains;
        self.rebuilds += other.rebuilds;
    }
}

pub struct Sim {
    rng: Rng,
    dir: PathBuf,
    buffer: Option<Buffer>,
    topic: String,
    /// The topic's partitions, all assigned to the one member.
    parts: Vec<Part>,
    fetchers: Vec<Fetcher>,
    faults: bool,
    /// `None`: mode `Off` (never split).
    min_lag: Option<u64>,
    /// The mode's reader: `Ordered` (else `Concurrent`, or `Latest`).
    ordered: bool,
    /// `Latest`: `Concurrent` with the production key index.
    latest: bool,
    /// `Latest`: keys of appends that succeeded (and of what rebuild lanes read), to note
    /// in their partition's index; and where each rebuild lane got.
    appended_keys: Vec<(usize, Vec<u8>, i64)>,
    /// Catch-up appends stored and not counted yet against the byte budget. The catch-up
    /// fetcher counts its append after the buffer took it (`Shared::add_buffered`), on its own
    /// thread: the reader, the application and a reassignment may come between the two. (The
    /// live thread appends, counts and handles reassignments in turn.)
    uncounted: Vec<Count>,
    /// The time every read is taken at (`IdleReads`): it never passes, so what a read left
    /// out waits for is a reported append alone.
    idle_clock: Instant,
    rebuilt: Vec<(usize, i64)>,
    /// The group's protocol is eager: a refused seek is followed by an assignment of
    /// everything (the incremental forms are refused outside a rebalance).
    eager: bool,
    /// The group member takes its partitions' queues in runs (`kafka::live::queues`): its
    /// errors name their partition and move its position past them. Otherwise it polls one
    /// queue whose errors name none.
    member_runs: bool,
    /// The user enabled ends of partition (`enable.partition.eof`), which the group member
    /// then hands out too (`tests/partition_eof_trickle.rs`).
    member_eof: bool,
    /// The catch-up consumer.
    catchup_consumer: FetcherConsumer,
    /// `Latest`: the rebuild consumer, reading keys again (the catch-up fetcher's rebuild
    /// role).
    rebuild_consumer: FetcherConsumer,
    /// Fetchers created so far: each one's generation.
    generations: u64,
    /// Partitions whose assignment failed: no runtime, no fetchers, retried from the loop.
    unreconciled: BTreeSet<usize>,
    /// The group member's client of each unreconciled partition: assigned at the log end and
    /// paused (`kafka/live/assign.rs`, `on_assign`), so never polled. A retry that reconciles
    /// the partition gives it to the live lane with its chain broken, and the production
    /// cursor has it moved to the buffer's position (`retry_unreconciled`).
    parked: BTreeMap<usize, Client>,
    /// Partitions the reader took off as damaged (their runtime gone), for the live thread to
    /// discard and reconcile again (`Shared::take_damaged`, `refetch_damaged`).
    damaged: BTreeSet<usize>,
    /// The buffer's filesystem, when this history has a free-space floor.
    disk: Option<Disk>,
    /// The fetchers' pauses, and the byte budget in histories that have one.
    budget: ByteBudget,
    stats: Stats,
    /// The buffer's spilled bytes when this history began, or when it was last opened again.
    spilled_from: u64,
    /// Bytes spilled by the buffers this history closed (lost or damaged).
    spilled_by_closed: u64,
    /// The memory tier's allowance (set again on a buffer opened after a loss).
    memory: u64,
    /// Whether a crash may lose the buffer (half the histories).
    loses_buffers: bool,
    /// Whether a crash may leave the buffer damaged on disk (half the histories).
    damages_buffers: bool,
    /// Simulated time: a step takes `STEP_TIME`.
    now: Instant,
    /// When the group member commits (the production schedule), with what was acknowledged
    /// in all when the last commit began, and whether the reader held back for commits at
    /// its last read.
    schedule: Schedule,
    /// The byte budget the reader's decisions derive from (the commit schedule, the hold for
    /// commits): the history's own if it has one, as production derives them from the one
    /// knob.
    reader_budget: u64,
    acked_at_commit: u64,
    reader_waits: bool,
    /// A partition whose every commit fails (its main-log writes refused, its side-log writes
    /// failing), as one with a side topic it may not write or an offset Kafka refuses; and
    /// whether the reader has held it back.
    commits_fail_for: Option<usize>,
    failing_held: bool,
    /// The scheduled commit cycle whose writes went out and whose record waits (the group
    /// member's commit thread sends them while the live thread goes on; it records the
    /// answers later): steps come between.
    in_flight: Option<SentCycle>,
}

/// How a cycle's writes went: the parts whose main-log write was refused, and the indices
/// (in the cycle) of those whose side-log write failed.
type CycleSent = (Vec<usize>, Vec<usize>);

/// A commit cycle sent and not yet recorded: each partition's plan (its part, the plan, the
/// catch-up lane's processed offset, and what was acknowledged when it was planned), the
/// cycle, how its writes went, and what the schedule learns when it is recorded.
struct SentCycle {
    plans: Vec<(usize, CommitPlan, i64, [u64; 2])>,
    cycle: CommitCycle<usize>,
    sent: CycleSent,
    started: Instant,
    reader_waits: bool,
}

/// The buffer's filesystem, for the free-space floor: the production guard ([`DiskGuard`])
/// fed its free space — what other files leave (they come and go under faults), less
/// `RECORD_DISK` a record the buffer holds uncommitted — and whether anything it holds can be
/// delivered, as the engine's `may_write` feeds it.
struct Disk {
    guard: DiskGuard,
    floor: DiskFloor,
    total: u64,
    /// Bytes of other files.
    others: u64,
}

/// Each fetcher's pause decisions, as the production fetchers keep them
/// (`kafka::budget::Budget`): the stops of every history, and in some a byte budget of a few
/// to a few dozen records.
#[derive(Default)]
struct ByteBudget {
    limit: Option<u64>,
    /// The catch-up lanes share one queue while there are several (as the catch-up
    /// consumer's fetch queues are shared past eight partitions): a held partition is paused
    /// ([`PausedHolds`]) instead of left in its queue, and the others are taken past their
    /// room. (Nothing is prefetched here: a paused client hands out nothing and resumes at
    /// its application position; a resume's refetch of a whole batch is not modelled.)
    shared_catchup_queue: bool,
    /// The most one fetch brings of a partition, which a lane's read-ahead never goes below
    /// (`fetch::read_ahead_share`): one to four records.
    fetch_bytes: u64,
    /// The catch-up fetcher's and the group member's.
    lanes: [LaneBudget; 2],
}

impl ByteBudget {
    /// `part`'s clients were paused out of band, or are new: the next round sets them.
    fn forget(&mut self, part: usize) {
        for lane in &mut self.lanes {
            lane.stops.forget(&part);
        }
    }
}

#[derive(Default)]
struct LaneBudget {
    policy: PausePolicy<usize>,
    stops: WriteStops<usize>,
    /// The lane's read-ahead, as `kafka::budget::Budget` keeps it: the partitions held
    /// because their reader has not taken what the lane fetched, each one's bytes fetched and
    /// not taken, and a partition's read-ahead, as of the last round.
    read_ahead: PausePolicy<usize>,
    ahead: BTreeMap<usize, u64>,
    read_ahead_share: Option<u64>,
    /// The partitions held in a shared queue, and paused for it.
    paused_holds: PausedHolds<usize>,
}

impl LaneBudget {
    /// Whether `part` is held to its read-ahead (the catch-up fetcher leaves its queue
    /// untaken; the group member takes a message a turn while any of its lanes is held).
    fn holds(&self, part: usize) -> bool {
        self.read_ahead.is_paused(&part)
    }

    /// How many records `part` may poll this round if it is not held: its room
    /// ([`read_ahead_room`]) in records, at least one.
    fn records_allowed(&self, part: usize) -> u64 {
        let ahead = self.ahead.get(&part).copied().unwrap_or(0);
        read_ahead_room(self.read_ahead_share, ahead).div_ceil(RECORD_BYTES as u64)
    }
}

/// What a record takes on the simulated disk, and the floor: its margin (a tenth, at least
/// 1 MiB) is about 25 records.
const RECORD_DISK: u64 = 64 << 10;
const DISK_FLOOR: u64 = 16 << 20;

/// How much simulated time a step takes (holds of 1 s to 30 s last 20 to 600 steps).
const STEP_TIME: Duration = Duration::from_millis(50);
/// The most partitions a history assigns.
const MAX_PARTITIONS: u64 = 3;
/// What a record counts for the readers (`AckTracker`) and against the byte budget.
const RECORD_BYTES: usize = 64 << 10;
/// The reader's byte budget in a history without a budget of its own (production's default
/// is larger; this one makes the reader's holds common): a commit is due once 8 records were
/// processed (`fetch::Schedule`), and the reader holds back once 32 acknowledged wait for
/// commits (`plan::reader_waits_for_commits`). A history with a budget derives both from
/// it, as production does.
const READER_BUDGET: u64 = 16 << 20;
/// The group member's commit interval.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// The most records a read hands out.
const MAX_READ: usize = 50;
/// Records added to each partition when a drain begins with one partition's commits failing:
/// more than a partition's share of what may wait for commits (32 records in all without a
/// budget of the history's own, at most 57 with one).
const FAILING_DRAIN_BACKLOG: usize = 60;

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Catchup => 0,
        Lane::Live => 1,
    }
}

fn err(context: &str, error: StoreError) -> Failure {
    format!("{context}: {error}")
}

/// The partition id of the part at `index`.
fn id(index: usize) -> i32 {
    index as i32
}

impl Sim {
    /// A new simulation in `dir` (a buffer directory shared by sequential runs; each seed
    /// uses its own topic), or `buffer` already open there.
    pub fn new(seed: u64, dir: PathBuf, buffer: Option<Buffer>) -> Result<Self, Failure> {
        Self::with_choices(seed, &[], SEED_SHAPE, dir, buffer)
    }

    /// A simulation whose choices come from `choices` first (a fuzzer's bytes), then `seed`.
    pub fn with_choices(
        seed: u64,
        choices: &[u8],
        shape: Shape,
        dir: PathBuf,
        buffer: Option<Buffer>,
    ) -> Result<Self, Failure> {
        let mut rng = Rng::with_choices(seed, choices);
        let now = Instant::now();
        let buffer = match buffer {
            Some(buffer) => buffer,
            None => Buffer::open(&dir, BufferOptions::default()).map_err(|e| err("open", e))?,
        };
        let count = 1 + rng.below(MAX_PARTITIONS);
        let parts: Vec<Part> = (0..count)
            .map(|_| Part::new(&mut rng, shape.log_entries))
            .collect();
        let min_lag = (!rng.chance(250)).then(|| 1 + rng.below(100));
        let eager = rng.chance(300);
        let ordered = rng.chance(500);
        let latest = !ordered && rng.chance(500);
        // Three histories in four keep appends in memory, with room for only a few records:
        // spills are common and a crash loses what memory held (the last seed's memory is
        // gone with it).
        let memory = if rng.chance(250) {
            0
        } else {
            8 * (1 + rng.below(100))
        };
        buffer.forget_memory();
        buffer
            .set_memory_bytes(memory)
            .map_err(|e| err("memory allowance", e))?;
        let spilled_from = buffer.spilled_bytes();
        // One history in three has a floor, with room for a few to a few hundred records
        // above it.
        let disk = rng.chance(333).then(|| Disk {
            guard: DiskGuard::default(),
            floor: DiskFloor::new(DISK_FLOOR, 0.0),
            total: DiskGuard::resume_at(DISK_FLOOR) + (4 + rng.below(200)) * RECORD_DISK,
            others: 0,
        });
        let disks = u64::from(disk.is_some());
        // Two histories in three with a floor have a byte budget (they drain on the disk they
        // have), one in nine without a floor.
        let budgeted = if disk.is_some() {
            rng.chance(667)
        } else {
            rng.chance(111)
        };
        // A budget of a few to a few dozen records; on a disk, of up to twice the room above
        // the floor (one in two is short of it).
        let records = match &disk {
            Some(disk) => 2 * (disk.total - DISK_FLOOR) / RECORD_DISK,
            None => 60,
        };
        let budget = ByteBudget {
            // One budget in ten is a few bytes, less than a record a lane (`tests/tiny_budget.rs`):
            // every lane holding a record is paused and reads ahead by a message a round.
            limit: budgeted.then(|| match rng.chance(100) {
                true => rng.below(64),
                false => (4 + rng.below(records)) * RECORD_BYTES as u64,
            }),
            // Half the budgeted histories, from the seed's bits rather than the generator's
            // draws (the other histories replay unchanged).
            shared_catchup_queue: budgeted
                && count > 1
                && seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1,
            // From the seed's bits too.
            fetch_bytes: (1 + (seed.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) >> 62))
                * RECORD_BYTES as u64,
            lanes: Default::default(),
        };
        // Half the histories, from the seed's bits too.
        let member_runs = seed.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 63 == 1;
        let member_eof = seed.wrapping_mul(0xA24B_AED4_963E_E407) >> 63 == 1;
        let loses_buffers = seed.wrapping_mul(0x94D0_49BB_1331_11EB) >> 63 == 1;
        let damages_buffers = seed.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 63 == 1;
        let reader_budget = budget.limit.unwrap_or(READER_BUDGET);
        let shared_queues = u64::from(budget.shared_catchup_queue);
        let mut sim = Self {
            rng,
            dir,
            buffer: Some(buffer),
            topic: format!("sim-{seed:016x}"),
            parts,
            fetchers: Vec::new(),
            faults: true,
            min_lag,
            ordered,
            latest,
            appended_keys: Vec::new(),
            uncounted: Vec::new(),
            idle_clock: Instant::now(),
            rebuilt: Vec::new(),
            eager,
            member_runs,
            member_eof,
            catchup_consumer: FetcherConsumer::default(),
            rebuild_consumer: FetcherConsumer::default(),
            generations: 0,
            unreconciled: BTreeSet::new(),
            parked: BTreeMap::new(),
            damaged: BTreeSet::new(),
            disk,
            budget,
            stats: Stats {
                partitions: count,
                disks,
                budgets: u64::from(budgeted),
                shared_queues,
                memory_tier: u64::from(memory > 0),
                latest: u64::from(latest),
                member_runs: u64::from(member_runs),
                losing_histories: u64::from(loses_buffers),
                damaging_histories: u64::from(damages_buffers),
                ..Stats::default()
            },
            spilled_from,
            spilled_by_closed: 0,
            memory,
            loses_buffers,
            damages_buffers,
            now,
            schedule: Schedule::new(now, COMMIT_INTERVAL, reader_budget),
            reader_budget,
            acked_at_commit: 0,
            reader_waits: false,
            commits_fail_for: None,
            failing_held: false,
            in_flight: None,
        };
        sim.assign_all()?;
        Ok(sim)
    }

    /// Hands the buffer back for the next seed.
    pub fn into_buffer(mut self) -> Option<Buffer> {
        if let Ok(buffer) = self.buffer() {
            for index in 0..self.parts.len() {
                let _ = buffer.discard_partition(&self.topic, id(index));
            }
        }
        self.buffer.take()
    }

    fn buffer(&self) -> Result<&Buffer, Failure> {
        self.buffer
            .as_ref()
            .ok_or_else(|| "buffer closed".to_owned())
    }

    fn side_key(&self, part: usize) -> String {
        side_key("sim-group", &self.topic, id(part))
    }

    /// What reconciliation decides for `part` from Kafka's state, the log's watermarks and
    /// `local` (without the side entry when the side log could not be read).
    fn decide(&mut self, part: usize, local: Option<&PartitionState>) -> catchup::plan::Decision {
        self.decide_reading(part, local, true)
    }

    fn decide_reading(
        &mut self,
        part: usize,
        local: Option<&PartitionState>,
        side_log_read: bool,
    ) -> catchup::plan::Decision {
        let key = self.side_key(part);
        let mut secret = [0u8; 16];
        secret[..8].copy_from_slice(&self.rng.next().to_le_bytes());
        secret[8..].copy_from_slice(&self.rng.next().to_le_bytes());
        let state = &self.parts[part];
        reconcile(&Inputs {
            committed: state.kafka.committed.as_ref(),
            side: state
                .kafka
                .side
                .as_deref()
                .filter(|_| side_log_read)
                .map(|value| SideValue { key: &key, value }),
            low: state.log.low,
            high: state.log.high(),
            min_lag: self.min_lag,
            reset: OffsetReset::Earliest,
            local,
            fresh_secret: SplitSecret::from_bytes(secret),
        })
    }

    /// The oracle on Kafka's state: what a restarted consumer would take as processed — below
    /// where it would resume, outside the catch-up ranges it would fetch — was delivered.
    fn check_claims(&mut self, part: usize) -> Result<(), Failure> {
        let decision = self.decide(part, None);
        let state = &self.parts[part];
        for offset in state.start..state.log.high() {
            let claimed = offset < decision.layout.live_from
                && !decision
                    .layout
                    .catchup_ranges
                    .iter()
                    .any(|r| r.contains(offset));
            if claimed && state.log.is_record(offset) && !state.delivered.contains(&offset) {
                return Err(format!(
                    "LOSS: Kafka claims offset {offset} of partition {part} processed (main log {:?}, side entry {:?}), but it was never delivered",
                    state.kafka.committed,
                    state.kafka.side.as_deref().map(String::from_utf8_lossy)
                ));
            }
        }
        Ok(())
    }

    fn write_main(&mut self, part: usize, offset: i64, metadata: String) -> Result<(), Failure> {
        self.parts[part].kafka.committed = Some(Committed { offset, metadata });
        self.check_claims(part)
    }

    fn write_side(&mut self, part: usize, value: Option<Vec<u8>>) -> Result<(), Failure> {
        self.parts[part].kafka.side = value;
        self.check_claims(part)
    }

    /// A crash between two writes, sometimes (never once the faults have stopped).
    fn crashes_here(&mut self) -> bool {
        self.faults && self.rng.chance(80)
    }

    /// The process dies (its fetchers, its catch-up consumer, unacked records and runtimes
    /// with it; the buffer stays) and a new one is assigned every partition.
    fn crash(&mut self) -> Result<(), Failure> {
        // A cycle sent and not recorded dies unrecorded: Kafka may hold it, the buffer lags.
        self.in_flight = None;
        // Counts not made die with the fetchers that were to make them.
        self.uncounted.clear();
        // What the buffer held only in memory dies with the process.
        if self.buffer()?.forget_memory() > 0 {
            self.stats.memory_lost += 1;
        }
        // A write failed before the crash (the process marked the buffer untrusted and
        // stopped fetching), or the disk was replaced: the buffer is lost.
        if self.loses_buffers && self.faults && self.rng.chance(12) {
            self.lose_buffer()?;
        } else if self.damages_buffers && self.faults && self.rng.chance(12) {
            self.damage_on_disk()?;
        }
        for part in &mut self.parts {
            part.live_handed_here.clear();
            part.live_handed_next = None;
        }
        self.fetchers.clear();
        // A new process: its fetchers' pauses start afresh.
        self.budget.lanes = Default::default();
        self.catchup_consumer = FetcherConsumer::default();
        self.rebuild_consumer = FetcherConsumer::default();
        self.assign_all()
    }

    /// The buffer is lost, as after a failed write: marked untrusted, closed, then emptied and
    /// opened again as the consumer's start does (`Buffer::empty_if_untrusted`). Everything it
    /// held is fetched again from Kafka.
    fn lose_buffer(&mut self) -> Result<(), Failure> {
        self.buffer()?
            .mark_untrusted()
            .map_err(|e| err("marking untrusted", e))?;
        self.close_buffer()?;
        if !Buffer::empty_if_untrusted(&self.dir).map_err(|e| err("emptying", e))? {
            return Err("a buffer marked untrusted was not emptied at the next start".into());
        }
        self.open_buffer_again()?;
        self.stats.buffers_lost += 1;
        Ok(())
    }

    /// The disk damages the buffer while no process has it open: one chunk of a lane, drawn
    /// among those sled holds, has a byte changed (its checksum no longer matches) or is gone
    /// (a hole in the lane's chain, as sled's recovery could leave). The next process opens it
    /// as it is; its reads must find the damage (`StoreError::Damaged`) and the partition be
    /// discarded and fetched again, as `tests/damaged_buffer.rs` has it on the broker.
    fn damage_on_disk(&mut self) -> Result<(), Failure> {
        self.close_buffer()?;
        {
            let db = raw_sled(&self.dir).map_err(|e| format!("opening sled itself: {e}"))?;
            let chunks: Vec<sled::IVec> = db
                .iter()
                .keys()
                .filter_map(Result::ok)
                .filter(|key| matches!(key.first(), Some(b'C' | b'L')))
                .collect();
            if !chunks.is_empty() {
                let key = &chunks[self.rng.below(chunks.len() as u64) as usize];
                let damaging = |e: sled::Error| format!("damaging a chunk: {e}");
                if self.rng.chance(500) {
                    let mut bytes = db.get(key).map_err(damaging)?.unwrap_or_default().to_vec();
                    let middle = bytes.len() / 2;
                    if let Some(byte) = bytes.get_mut(middle) {
                        *byte ^= 0x5a;
                    }
                    db.insert(key, bytes).map_err(damaging)?;
                } else {
                    db.remove(key).map_err(damaging)?;
                }
                db.flush().map_err(damaging)?;
                self.stats.disk_damages += 1;
            }
        }
        self.open_buffer_again()
    }

    /// The process dies with the buffer open: its lock goes with it (a buffer merely
    /// dropped lets go of it only once sled's threads have ended).
    fn close_buffer(&mut self) -> Result<(), Failure> {
        let closed = self
            .buffer
            .take()
            .ok_or_else(|| "buffer closed".to_owned())?;
        self.spilled_by_closed += closed.spilled_bytes() - self.spilled_from;
        closed.close().map_err(|e| err("closing", e))
    }

    /// The next process opens the buffer. Waits (bounded) for a database opened by the
    /// simulation itself to let go of its lock. (The simulation damages chunks, never what
    /// sled needs to open: a buffer it cannot open is a failure here; the consumer's start
    /// empties one, `tests/power_loss.rs`.)
    fn open_buffer_again(&mut self) -> Result<(), Failure> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let buffer = loop {
            match Buffer::open(&self.dir, reopen_options(&self.dir)) {
                Ok(buffer) => break buffer,
                Err(StoreError::Locked { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(err("opening again", e)),
            }
        };
        buffer
            .set_memory_bytes(self.memory)
            .map_err(|e| err("memory allowance", e))?;
        self.spilled_from = buffer.spilled_bytes();
        self.buffer = Some(buffer);
        Ok(())
    }

    fn assign_all(&mut self) -> Result<(), Failure> {
        self.unreconciled.clear();
        self.parked.clear();
        self.damaged.clear();
        let all: Vec<usize> = (0..self.parts.len()).collect();
        self.assign(&all)
    }

    /// `parts` are assigned, as the group member's `reconcile_all` does: the group's offsets
    /// read (or every partition waits), the topic's incarnation checked (its id may not be
    /// readable, and records it cannot vouch for may fail to be dropped), the side log read
    /// (or not), each partition that need not wait (`waits_unreconciled`) reconciled, every
    /// decision's writes to Kafka sent as one production cycle ([`CommitCycle`]), then the
    /// local step of each partition whose writes all happened, and its fetchers started. A
    /// partition that waits, or whose write failed, waits unreconciled to be assigned again;
    /// a crash between the writes starts the process over.
    fn assign(&mut self, parts: &[usize]) -> Result<(), Failure> {
        if self.faults && self.rng.chance(60) {
            self.stats.offsets_unread += 1;
            for &part in parts {
                self.defer(part);
            }
            return Ok(());
        }
        let stale_kept = self.check_incarnation(parts)?;
        let side_log_read = !(self.faults && self.rng.chance(30));
        let mut decided = Vec::with_capacity(parts.len());
        for &part in parts {
            self.unreconciled.remove(&part);
            let metadata = self.parts[part]
                .kafka
                .committed
                .as_ref()
                .map(|committed| committed.metadata.as_str());
            if waits_unreconciled(metadata, side_log_read, stale_kept.contains(&part)) {
                self.stats.waited_unread += 1;
                self.defer(part);
                continue;
            }
            let local = self
                .buffer()?
                .partition_state(&self.topic, id(part))
                .map_err(|e| err("state", e))?;
            let decision = self.decide_reading(part, local.as_ref(), side_log_read);
            if decision.waits_for_side_log(side_log_read) {
                self.stats.waited_unread += 1;
                self.defer(part);
                continue;
            }
            for event in &decision.events {
                match event {
                    PlanEvent::StaleSideEntry { reason }
                        if !(reason.contains("no split token")
                            || reason.contains("another split")) =>
                    {
                        return Err(format!(
                            "a side entry this consumer wrote was rejected: {reason}"
                        ));
                    }
                    PlanEvent::SplitStarted { .. } => self.stats.splits += 1,
                    PlanEvent::MergeFinished { .. } => self.stats.merges += 1,
                    _ => {}
                }
            }
            decided.push((part, decision));
        }
        let cycle = CommitCycle::new(
            decided
                .iter()
                .map(|(part, decision)| Ok((*part, decision.writes()?)))
                .collect::<Result<Vec<_>, Failure>>()?,
        );
        let tokens: Vec<Option<SplitToken>> =
            decided.iter().map(|(_, decision)| decision.token).collect();
        let Some((refused, side_failed)) = self.send_cycle(&cycle, &tokens)? else {
            return self.crash();
        };
        // A crash once Kafka holds the writes, before any local step.
        if !(cycle.mains().is_empty() && cycle.sides(&[]).is_empty()) && self.crashes_here() {
            return self.crash();
        }
        for index in cycle.unapplied(&refused, &side_failed) {
            let part = decided[index].0;
            if self.commits_fail_for != Some(part) {
                self.stats.assign_deferrals += 1;
            }
            self.defer(part);
        }
        for (nth, index) in cycle
            .applied(&refused, &side_failed)
            .into_iter()
            .enumerate()
        {
            // A crash between two partitions' local steps (before the first, it is the one
            // above).
            if nth > 0 && self.crashes_here() {
                self.stats.local_step_crashes += 1;
                return self.crash();
            }
            let (part, decision) = &decided[index];
            if let Applied::Crashed = self.apply_locally(*part, decision)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// `part` waits unreconciled, paused under the group member at the log end where its
    /// assignment put it (or still where an earlier wait left it).
    fn defer(&mut self, part: usize) {
        self.unreconciled.insert(part);
        let at_end = self.member_client(self.parts[part].log.reported_high());
        self.parked.entry(part).or_insert(at_end).set_paused(true);
        // Without a runtime it leaves the budget's round (at the end of the live thread's
        // turn); when it comes back it is set again.
        self.budget.forget(part);
    }

    /// A client of the group member fetching at `at`: it hands out ends of partition only
    /// in the histories whose user enabled them, and in those whose member takes its
    /// partitions' queues in runs (as production's does, `kafka::live::queues`) its errors
    /// name their partition and move its position past them.
    fn member_client(&self, at: i64) -> Client {
        let mut client = Client::new(at, self.faults);
        if !self.member_eof {
            client = client.without_partition_eof();
        }
        match self.member_runs {
            true => client.taking_runs(),
            false => client,
        }
    }

    /// Whether the catch-up lanes share a queue now: the history shares one (`shared`), and
    /// more than one partition fetches into it
    /// (`kafka::fetch_queues::FetchQueues::shares_queue`).
    fn catchup_queue_shared(&self, shared: bool) -> bool {
        shared && self.fetchers.iter().filter(|f| f.tracked_by(false)).count() > 1
    }

    /// Whether the engine keeps a runtime for `part`: not while it waits to be reconciled,
    /// nor once the reader took it off as damaged.
    fn has_runtime(&self, part: usize) -> bool {
        !self.unreconciled.contains(&part) && !self.damaged.contains(&part)
    }

    /// The reader found `part`'s buffered records damaged (as the engine's fill takes a
    /// `StoreError::Damaged`: `damaged_on_read`). Its runtime goes at once: what it handed
    /// out is acknowledged in vain, and its live lane — whose state the runtime held — appends
    /// nothing more, while the group member's client fetches on until the live thread pauses
    /// it. The catch-up fetcher goes on until the live thread stops it (`refetch_damaged`).
    fn damaged_on_read(&mut self, part: usize) {
        self.stats.damaged_reads += 1;
        self.damaged.insert(part);
        for reader in &mut self.parts[part].readers {
            reader.unacked.clear();
        }
        if let Some(live) = self
            .fetchers
            .iter()
            .position(|f| f.part == part && f.lane == Lane::Live && !f.zombie)
        {
            let fetcher = self.fetchers.remove(live);
            self.parked.insert(part, fetcher.client);
        }
    }

    /// The live thread refetches the partitions taken off as damaged, as `refetch_damaged`
    /// does: the cycle under way recorded, each partition's catch-up lanes stopped (the
    /// fetcher answers before the discard: none appends after it), its records discarded,
    /// and it waits to be reconciled again from Kafka's offsets, its member's client paused
    /// where it got to.
    fn refetch_damaged(&mut self) -> Result<(), Failure> {
        if self.damaged.is_empty() {
            return Ok(());
        }
        self.finish_cycle()?;
        for part in std::mem::take(&mut self.damaged) {
            self.fetchers.retain(|f| f.part != part || f.zombie);
            self.buffer()?
                .discard_partition(&self.topic, id(part))
                .map_err(|e| err("discard (damaged)", e))?;
            self.stats.damaged_refetched += 1;
            self.defer(part);
            if self.crashes_here() {
                return self.crash();
            }
        }
        Ok(())
    }

    /// Assigns again the partitions whose assignment failed, as the live loop retries them
    /// (`retry_unreconciled`).
    fn retry_unreconciled(&mut self) -> Result<(), Failure> {
        let parts: Vec<usize> = self.unreconciled.iter().copied().collect();
        if parts.is_empty() {
            return Ok(());
        }
        self.finish_cycle()?;
        self.assign(&parts)
    }

    /// The topic's id is looked up at every assignment after a start or a revoke; when it
    /// cannot be read, the assigned partitions' records are not reused (the production
    /// decision, `plan::incarnation_unknown`): they are dropped, or — a drop that fails, one
    /// in four — kept, and the partition waits. Returns the partitions whose records were kept.
    fn check_incarnation(&mut self, parts: &[usize]) -> Result<BTreeSet<usize>, Failure> {
        let ids: HashMap<String, u64> = if self.faults && self.rng.chance(30) {
            self.stats.id_failures += 1;
            HashMap::new()
        } else {
            [(self.topic.clone(), 1)].into()
        };
        let assigning: Vec<(String, i32)> = parts
            .iter()
            .map(|&part| (self.topic.clone(), id(part)))
            .collect();
        let mut kept = BTreeSet::new();
        for (topic, partition) in incarnation_unknown(&assigning, &[self.topic.as_str()], &ids) {
            if self.rng.chance(4) {
                kept.insert(*partition as usize);
                continue;
            }
            self.buffer()?
                .discard_partition(topic, *partition)
                .map_err(|e| err("discard (incarnation unknown)", e))?;
        }
        Ok(kept)
    }

    /// Moves `lane`'s cursors of `part` up to `committed` for a reuse (`record_resumed`);
    /// whether that found the buffer damaged on disk. Any other failure is a failure of the
    /// simulation.
    fn resume_finds_damage(
        &self,
        lane: Lane,
        part: usize,
        committed: i64,
    ) -> Result<bool, Failure> {
        match self
            .buffer()?
            .record_resumed(lane, &self.topic, id(part), committed)
        {
            Ok(_) => Ok(false),
            Err(StoreError::Damaged { .. }) => Ok(true),
            Err(other) => Err(err("reuse", other)),
        }
    }

    /// A decision's local step, once its writes to Kafka happened, then the partition's
    /// runtime, readers and fetchers from the buffer (`apply_locally`). The process may die
    /// between the step's two buffer writes (killed, or stopped by the second write failing:
    /// a failed write to the buffer stops the consumer).
    fn apply_locally(&mut self, part: usize, decision: &Decision) -> Result<Applied, Failure> {
        let partition = id(part);
        // The buffer refusing to move its cursors (one in forty, under faults): the member
        // then lays the partition out afresh with the decision's layout, and what cannot be
        // reused is fetched again.
        let reuse_fails = self.faults && self.rng.chance(40);
        let catchup_moved_first = self.rng.chance(2);
        let step = decision.local_step();
        // A reuse that finds the buffer damaged on disk (a chunk it reads to move a cursor)
        // is refused as the injected failures are: the partition is laid out afresh.
        let mut found_damaged = false;
        if let LocalStep::Reuse {
            catchup_committed, ..
        } = step
        {
            if reuse_fails {
                self.stats.reuse_fallbacks += 1;
            }
            // The member moves the catch-up lane's cursor first; a failed reuse may refuse
            // that one already, or only the live lane's.
            if !reuse_fails || catchup_moved_first {
                found_damaged = self.resume_finds_damage(Lane::Catchup, part, catchup_committed)?;
                if !found_damaged && self.crashes_here() {
                    self.stats.local_step_crashes += 1;
                    self.crash()?;
                    return Ok(Applied::Crashed);
                }
            }
        }
        if let LocalStep::Reuse { live_committed, .. } = step {
            if !reuse_fails && !found_damaged {
                found_damaged = self.resume_finds_damage(Lane::Live, part, live_committed)?;
            }
        }
        self.stats.damaged_reuses += u64::from(found_damaged);
        let buffer = self.buffer()?;
        match step {
            LocalStep::Reuse { .. } if reuse_fails || found_damaged => {
                buffer
                    .reset_partition(&self.topic, partition, decision.layout.clone())
                    .map_err(|e| err("layout after a failed reuse", e))?;
            }
            LocalStep::Reuse { .. } => {}
            LocalStep::Reset { layout, .. } => {
                buffer
                    .reset_partition(&self.topic, partition, layout.clone())
                    .map_err(|e| err("layout", e))?;
            }
        }
        // The state read back is damaged (an error that is not a failed write): the partition
        // waits, laid out, and is reconciled again (`assign_failed`).
        if self.faults && self.rng.chance(15) {
            self.stats.local_failures += 1;
            self.defer(part);
            return Ok(Applied::Deferred);
        }
        let state = self
            .buffer()?
            .partition_state(&self.topic, partition)
            .map_err(|e| err("state", e))?
            .ok_or("partition not laid out")?;
        if state.layout.catchup_ranges.len() > 1 {
            self.stats.multi_range += 1;
        }
        let low = self.parts[part].log.low;
        let main_committed =
            decision.main_committed(self.parts[part].kafka.committed.as_ref(), low);
        let runtime = &mut self.parts[part];
        runtime.layout = state.layout.clone();
        runtime.token = decision.token;
        runtime.side_entry = decision.side_entry.clone();
        // As the live fetcher sets it.
        runtime.main_committed = main_committed;
        let retried = self.parked.contains_key(&part);
        self.start_fetching(part, &state)?;
        // At an assignment (not a retry) the group member's start offset may not be set
        // (`start_at`): the partition waits at the log end, its runtime gone, while the
        // catch-up lane it was handed already goes on (`assign_failed`).
        if !retried && self.faults && self.rng.chance(15) {
            self.stats.local_failures += 1;
            self.fetchers
                .retain(|f| f.part != part || f.lane != Lane::Live || f.zombie);
            for reader in &mut self.parts[part].readers {
                reader.unacked.clear();
            }
            self.defer(part);
            return Ok(Applied::Deferred);
        }
        Ok(Applied::Started)
    }

    /// Readers at the committed offsets, fetchers at the fetched ones (the catch-up lane's
    /// waits, unassigned, while the catch-up consumer cannot be created).
    fn start_fetching(&mut self, part: usize, state: &PartitionState) -> Result<(), Failure> {
        let layout = self
            .buffer()?
            .layout_id(&self.topic, id(part))
            .map_err(|e| err("layout id", e))?
            .ok_or("no layout id")?;
        let runtime = &mut self.parts[part];
        runtime.readers = [
            Reader::new(
                Lane::Catchup,
                layout,
                state.catchup.committed_next,
                state.catchup.fetched_next,
            ),
            Reader::new(
                Lane::Live,
                layout,
                state.live.committed_next,
                state.live.fetched_next,
            ),
        ];
        // As the engine's runtime starts it (`PartitionRuntime::new`).
        runtime.idle = IdleReads::default();
        runtime.ordered_next = if state.catchup_committed() {
            state.live.committed_next
        } else {
            state.catchup.committed_next
        };
        runtime.last_ordered = None;
        runtime.handed_in_assignment.clear();
        runtime.queued = Default::default();
        runtime.replay_end = state.layout.catchup_ranges.first().map_or(0, |r| r.end);
        runtime.live_resumed = state.live.committed_next;
        runtime.rebuilt.clear();
        if self.latest {
            // As the live fetcher sets it up, with the high watermark it reads (a new leader
            // may report a lower one for a while).
            let log = &runtime.log;
            let high = log.reported_high();
            let seen_end = high.max(runtime.live_handed_next.unwrap_or(high));
            runtime.index = KeyIndex::for_assignment(state, seen_end);
        }
        let rebuild_left = runtime.index.as_ref().and_then(KeyIndex::rebuild_left);
        self.fetchers.retain(|f| f.part != part || f.zombie);
        if let Some(left) = rebuild_left {
            // The rebuild consumer (its own, outside the group), reading one range.
            self.stats.rebuilds += 1;
            self.generations += 1;
            let mut fetcher = Fetcher {
                lane: Lane::Catchup,
                part,
                generation: self.generations,
                client: Client::unassigned(self.faults).taking_runs(),
                state: LanePartition::catchup(
                    layout,
                    left.start,
                    vec![OffsetRange::new(left.start, left.end)],
                ),
                zombie: false,
                rebuild: Some(left.end),
            };
            // Attached as the catch-up fetcher attaches it (the rebuild role's `add`).
            if self.ensure_consumer(true) {
                self.attach_catchup(&mut fetcher);
            }
            self.fetchers.push(fetcher);
        }
        if !state.catchup_fetched() {
            let mut fetcher = Fetcher {
                lane: Lane::Catchup,
                part,
                generation: self.generations + 1,
                client: Client::unassigned(self.faults).taking_runs(),
                state: LanePartition::catchup(
                    layout,
                    state.catchup.fetched_next,
                    state.layout.catchup_ranges.clone(),
                ),
                zombie: false,
                rebuild: None,
            };
            if self.ensure_consumer(false) {
                self.attach_catchup(&mut fetcher);
            }
            self.generations += 1;
            self.fetchers.push(fetcher);
        }
        let mut live = LanePartition::live(layout, state.live.fetched_next);
        let client = match self.parked.remove(&part) {
            Some(parked) => {
                // As `retry_unreconciled` does: the member's client stands at the log end,
                // and the broken chain has the live lane move it to the buffer's position.
                live.break_chain();
                self.stats.parked_repositioned += 1;
                parked
            }
            None => self.member_client(state.live.fetched_next),
        };
        self.generations += 1;
        self.fetchers.push(Fetcher {
            lane: Lane::Live,
            part,
            generation: self.generations,
            client,
            state: live,
            zombie: false,
            rebuild: None,
        });
        // New clients (the parked one paused): the next round of each fetcher sets them.
        self.budget.forget(part);
        Ok(())
    }

    /// The catch-up consumer, or the rebuild consumer (`rebuild`).
    fn consumer_mut(&mut self, rebuild: bool) -> &mut FetcherConsumer {
        match rebuild {
            true => &mut self.rebuild_consumer,
            false => &mut self.catchup_consumer,
        }
    }

    /// Creates the catch-up consumer (the rebuild consumer: `rebuild`) unless it exists or a
    /// failed creation still holds, as the catch-up fetcher's `ensure_consumer` does in
    /// either role; a consumer created for partitions already waiting assigns them at their
    /// position. Whether there is a consumer now.
    fn ensure_consumer(&mut self, rebuild: bool) -> bool {
        let now = self.now;
        let consumer = self.consumer_mut(rebuild);
        if consumer.created {
            return true;
        }
        if consumer.hold.holds(now) {
            return false;
        }
        if self.faults && self.rng.chance(100) {
            match rebuild {
                true => self.stats.rebuild_create_failures += 1,
                false => self.stats.create_failures += 1,
            }
            self.consumer_mut(rebuild).hold.hold(now);
            return false;
        }
        let consumer = self.consumer_mut(rebuild);
        consumer.created = true;
        consumer.hold.release();
        let mut fetchers = std::mem::take(&mut self.fetchers);
        for fetcher in &mut fetchers {
            if fetcher.tracked_by(rebuild) {
                self.attach_catchup(fetcher);
            }
        }
        self.fetchers = fetchers;
        true
    }

    /// Drops the catch-up and rebuild consumers that have no partition left, as the
    /// catch-up fetcher drops its consumer when it tracks none (the next partition creates
    /// one again, which may fail).
    fn drop_idle_consumers(&mut self) {
        for rebuild in [false, true] {
            if !self
                .fetchers
                .iter()
                .any(|fetcher| fetcher.tracked_by(rebuild))
            {
                *self.consumer_mut(rebuild) = FetcherConsumer::default();
            }
        }
    }

    /// Assigns a tracked partition to the catch-up consumer at the buffer's position, as the
    /// catch-up fetcher attaches it; an assignment that fails leaves the partition
    /// unassigned, its chain broken, to be moved (assigned) by a later round.
    fn attach_catchup(&mut self, fetcher: &mut Fetcher) {
        if self.catchup_assign_fails() {
            fetcher.state.break_chain();
        } else {
            fetcher
                .client
                .assign(fetcher.state.cursor().stored_next(), &mut self.rng);
        }
    }

    /// Whether the catch-up consumer's `incremental_assign` fails now (one in fifty, with
    /// faults).
    fn catchup_assign_fails(&mut self) -> bool {
        let fails = self.faults && self.rng.chance(20);
        self.stats.catchup_assign_failures += u64::from(fails);
        fails
    }

    /// Runs `steps` steps with faults, then without until everything is delivered and
    /// committed. Returns the first violation.
    pub fn run(&mut self, steps: u64) -> Result<(), Failure> {
        for _ in 0..steps {
            self.step()?;
        }
        self.faults = false;
        for part in &mut self.parts {
            part.log.lowered_high = None;
            // One more record, as a live topic brings: a group member without ends of
            // partition (unless the user enables them) proves a trailing transaction marker
            // below which its live lane was repositioned only with the next record
            // (`docs/design.md`, "Out of range").
            part.log.entries.push(Entry::Record);
        }
        for fetcher in &mut self.fetchers {
            fetcher.client.faults = false;
        }
        // The operator makes room: the other files go. A history with a byte budget drains
        // on the disk it has, however short of the budget: the budget and the floor must
        // carry it through. Without a budget (or with one partition's commits failing, which
        // holds its records on disk) the disk grows to hold every record.
        let records: u64 = self
            .parts
            .iter()
            .map(|part| part.log.high() as u64 + FAILING_DRAIN_BACKLOG as u64 + 1)
            .sum();
        let failing_drain = self.parts.len() > 1 && self.rng.chance(333);
        let limit = self.budget.limit;
        if let Some(disk) = self.disk.as_mut() {
            disk.others = 0;
            match limit {
                Some(limit) if !failing_drain => {
                    let room = disk.total - DISK_FLOOR;
                    self.stats.short_drains += u64::from(room < limit);
                }
                _ => {
                    disk.total = disk
                        .total
                        .max(DiskGuard::resume_at(DISK_FLOOR) + 2 * records * RECORD_DISK);
                }
            }
        }
        if failing_drain {
            self.drain_while_one_partition_fails()?;
        }
        for _ in 0..5000 {
            // Kafka may hold a partition processed while its reader still has records to
            // hand out: fetched before retention deleted them, they are delivered all the
            // same (a restarted consumer would not read them again).
            if self.settled()? && self.accounts_balanced() {
                return self.final_check();
            }
            self.step()?;
        }
        if self.settled()? {
            return self.final_check();
        }
        Err(format!("stalled: {}", self.describe()?))
    }

    /// Drains with one partition's every commit failing: the others must be delivered and
    /// committed all the same (the reader holds back only the partitions with their share of
    /// what may wait for commits, `plan::may_read`); then its commits land again. Each
    /// partition gets a backlog beyond that share first, so that the hold is reached (the
    /// drain counts only if the failing partition was held back). How much waits is not
    /// bounded here: deliveries not acknowledged never count (`reader_waits_for_commits`),
    /// and the simulated application leaves many unacknowledged.
    fn drain_while_one_partition_fails(&mut self) -> Result<(), Failure> {
        let failing = self.random_part();
        self.commits_fail_for = Some(failing);
        self.failing_held = false;
        for part in &mut self.parts {
            for _ in 0..FAILING_DRAIN_BACKLOG {
                part.log.entries.push(Entry::Record);
            }
        }
        let others: Vec<usize> = (0..self.parts.len()).filter(|&p| p != failing).collect();
        for _ in 0..5000 {
            if others
                .iter()
                .map(|&part| self.part_settled(part))
                .collect::<Result<Vec<bool>, Failure>>()?
                .into_iter()
                .all(|settled| settled)
            {
                self.commits_fail_for = None;
                if self.failing_held {
                    self.stats.failing_partition_drains += 1;
                }
                return Ok(());
            }
            self.step()?;
        }
        Err(format!(
            "STALL: partition {failing}'s failing commits stopped the others: {}",
            self.describe()?
        ))
    }

    fn describe(&self) -> Result<String, Failure> {
        let mut text = format!(
            "{} partitions, ordered {}, latest {}, eager {}, catch-up consumer {}",
            self.parts.len(),
            self.ordered,
            self.latest,
            self.eager,
            self.catchup_consumer.created
        );
        for fetcher in &self.fetchers {
            text += &format!(
                "; {} fetcher of partition {} (zombie {}): {:?}, {:?}",
                fetcher.lane, fetcher.part, fetcher.zombie, fetcher.client, fetcher.state
            );
        }
        for (index, part) in self.parts.iter().enumerate() {
            let state = self
                .buffer()?
                .partition_state(&self.topic, id(index))
                .map_err(|e| err("state", e))?;
            text += &format!(
                "; partition {index}: log high {} low {}, layout {:?}, state {state:?}, readers next {:?}",
                part.log.high(),
                part.log.low,
                part.layout,
                part.readers.iter().map(|r| r.next).collect::<Vec<_>>()
            );
        }
        Ok(text)
    }

    fn random_part(&mut self) -> usize {
        self.rng.below(self.parts.len() as u64) as usize
    }

    fn random_lane(&mut self) -> Lane {
        if self.rng.chance(500) {
            Lane::Catchup
        } else {
            Lane::Live
        }
    }

    fn step(&mut self) -> Result<(), Failure> {
        self.stats.steps += 1;
        self.now += STEP_TIME;
        let faults = self.faults;
        // The answers of the cycle under way come in some step after it was sent.
        if self.in_flight.is_some() && self.rng.chance(2) {
            self.finish_cycle()?;
        }
        // After its poll round the live thread refetches what the reader found damaged, and
        // retries those at once.
        if !self.damaged.is_empty() && (!faults || self.rng.chance(300)) {
            self.refetch_damaged()?;
            self.retry_unreconciled()?;
        }
        if !self.unreconciled.is_empty() && (!faults || self.rng.chance(100)) {
            self.retry_unreconciled()?;
        }
        match self.rng.below(100) {
            0..=9 if faults => {
                let part = self.random_part();
                for _ in 0..self.rng.below(10) {
                    self.parts[part].log.produce(&mut self.rng);
                }
            }
            10..=11 if faults => {
                // Retention deletes the head (never past what the live lane could reach).
                let part = self.random_part();
                let log = &mut self.parts[part].log;
                log.low = (log.low + self.rng.below(30) as i64).min(log.high());
            }
            12 if faults => {
                let part = self.random_part();
                let log = &mut self.parts[part].log;
                log.lowered_high = Some(log.high() - self.rng.below(10) as i64);
            }
            13 if faults => {
                // The new leader's high watermark catches up: at once, or one offset at a
                // time as its followers fetch.
                let part = self.random_part();
                let stepping = self.rng.chance(2);
                let log = &mut self.parts[part].log;
                log.lowered_high = match log.lowered_high {
                    Some(lowered) if stepping && lowered + 1 < log.high() => Some(lowered + 1),
                    _ => None,
                };
            }
            14 if faults && self.rng.chance(300) => self.crash()?,
            15 if faults && self.rng.chance(300) => {
                let part = self.random_part();
                self.revoke_and_reassign(part)?
            }
            16 if faults && self.disk.is_some() => {
                // Other files fill the disk, or are deleted.
                let fill = self.rng.below(1000);
                if let Some(disk) = self.disk.as_mut() {
                    disk.others = disk.total / 1000 * fill;
                }
            }
            16..=59 => {
                let index = self.rng.below(self.fetchers.len() as u64) as usize;
                self.fetch_round(index)?;
            }
            60..=84 => {
                let (part, lane) = (self.random_part(), self.random_lane());
                self.read(part, lane)?;
            }
            _ => {
                let (part, lane) = (self.random_part(), self.random_lane());
                self.ack(part, lane);
            }
        }
        // The group member commits when its schedule says so: every interval, sooner once
        // much was processed, and while the reader holds back for commits.
        let facts = Facts {
            processed: self.acked_bytes().saturating_sub(self.acked_at_commit),
            reader_waits: self.reader_waits,
            ..Facts::default()
        };
        if self.schedule.due(self.now, facts).commit {
            self.begin_cycle(facts.reader_waits)?;
        }
        if !self.faults {
            // Drain: keep everything moving.
            for index in 0..self.fetchers.len() {
                self.fetch_round(index)?;
            }
            for part in 0..self.parts.len() {
                for lane in Lane::ALL {
                    self.read(part, lane)?;
                    self.ack_all(part, lane);
                }
            }
            self.commit_all()?;
        }
        Ok(())
    }

    /// One poll round of the consumer fetcher `index` belongs to, as the adapters run it:
    /// the group member's live lanes together, the catch-up consumer's lanes together (once
    /// it exists), a stale writer alone.
    fn fetch_round(&mut self, index: usize) -> Result<(), Failure> {
        let Some(chosen) = self.fetchers.get(index) else {
            return Ok(());
        };
        let (lane, zombie, rebuild) = (chosen.lane, chosen.zombie, chosen.rebuild.is_some());
        if lane == Lane::Catchup && !zombie && !self.ensure_consumer(rebuild) {
            return Ok(());
        }
        let members: Vec<usize> = if zombie {
            vec![index]
        } else {
            (0..self.fetchers.len())
                .filter(|&i| {
                    let fetcher = &self.fetchers[i];
                    fetcher.lane == lane && !fetcher.zombie && fetcher.rebuild.is_some() == rebuild
                })
                .collect()
        };
        self.count_late_appends();
        if !zombie && !rebuild {
            self.apply_budget(lane)?;
        }
        let members = self.poll_round(lane, members)?;
        let mut refused = Vec::new();
        let mut leaving = Vec::new();
        for &member in &members {
            if let RoundEnd::Remove = self.after_poll(member, &mut refused)? {
                leaving.push(member);
            }
        }
        for (part, key, offset) in std::mem::take(&mut self.appended_keys) {
            if let Some(index) = self.parts[part].index.as_mut() {
                index.note(Some(&key), offset);
            }
        }
        for (part, next) in std::mem::take(&mut self.rebuilt) {
            let low = self.parts[part].log.low;
            self.parts[part].rebuilt.push((next, low));
            if let Some(index) = self.parts[part].index.as_mut() {
                index.rebuilt_to(next);
            }
        }
        if !refused.is_empty() {
            self.reassign_all(refused);
        }
        for member in leaving.into_iter().rev() {
            self.fetchers.remove(member);
        }
        self.drop_idle_consumers();
        Ok(())
    }

    /// Polls the consumer of `members` (indices of fetchers of one lane) and feeds the round
    /// to their lanes through the production [`Round`]: errors taken in a partition's run
    /// name it (the catch-up consumer's, and the group member's where it takes its
    /// partitions' queues in runs), those of a consumer's main queue name none, and the
    /// group member hands out no end of partition. An error the catch-up consumer took from a
    /// partition's queue ends that queue's turn, not the round, and the batch call may have
    /// taken more of the queue after it (pushed after it, as the fetcher pushes them); an
    /// error of its main queue ends nothing (the partitions' queues go on). An error the
    /// group member took in a run ends nothing; one naming no partition ends its round. A rebalance inside one of the group member's polls may
    /// revoke a partition and assign it again: the round then ends, and what was polled
    /// before reaches only the lanes of the assignments it was polled under (records are
    /// keyed by partition and generation, as the live fetcher keys them). Returns the members
    /// after the round.
    fn poll_round(&mut self, lane: Lane, members: Vec<usize>) -> Result<Vec<usize>, Failure> {
        let mut round = Round::new();
        let mut members = members;
        // Catch-up members whose queue's turn an error ended, and the entries left of the run
        // the batch call was handing out when it took the error (with those taken so far).
        let mut turn_over: Vec<usize> = Vec::new();
        let mut rest_of_run: Option<(usize, u64, u64)> = None;
        // The read-ahead of a budgeted history, as the last `apply_budget` left it: the
        // catch-up fetcher leaves a held partition's queue untaken and takes the others up
        // to their room (records left, per member); while any live lane is held, the group
        // member takes one message a turn.
        let mut room: BTreeMap<usize, u64> = BTreeMap::new();
        let mut one_message = false;
        let first = &self.fetchers[members[0]];
        if self.budget.limit.is_some() && !first.zombie && first.rebuild.is_none() {
            let read_ahead = &self.budget.lanes[lane_index(lane)];
            let held = |member: &usize| read_ahead.holds(self.fetchers[*member].part);
            match lane {
                // A shared queue is not held to a partition's room: its held partitions are
                // paused instead.
                Lane::Catchup if self.catchup_queue_shared(self.budget.shared_catchup_queue) => {}
                Lane::Catchup => {
                    for &member in &members {
                        let allowed = read_ahead.records_allowed(self.fetchers[member].part);
                        // (No room is what `read_ahead_room` never gives: the fetcher polls
                        // while it has some.)
                        if held(&member) || allowed == 0 {
                            turn_over.push(member);
                        }
                        room.insert(member, allowed);
                    }
                }
                Lane::Live => one_message = members.iter().any(held),
            }
            if one_message || !turn_over.is_empty() {
                self.stats.read_ahead_rounds += 1;
            }
        }
        for _ in 0..self.rng.below(40) {
            let group_member = lane == Lane::Live && !self.fetchers[members[0]].zombie;
            if group_member && self.faults && !round.is_empty() && self.rng.chance(10) {
                let part = self.random_part();
                self.stats.rebalances_in_a_round += 1;
                self.revoke_and_reassign(part)?;
                members = (0..self.fetchers.len())
                    .filter(|&i| self.fetchers[i].lane == Lane::Live && !self.fetchers[i].zombie)
                    .collect();
                break;
            }
            let member = match rest_of_run {
                Some((member, left, taken)) if left > 0 => {
                    rest_of_run = Some((member, left - 1, taken + 1));
                    member
                }
                _ => {
                    rest_of_run = None;
                    let open: Vec<usize> = members
                        .iter()
                        .copied()
                        .filter(|member| !turn_over.contains(member))
                        .collect();
                    if open.is_empty() {
                        break;
                    }
                    open[self.rng.below(open.len() as u64) as usize]
                }
            };
            let fetcher = &mut self.fetchers[member];
            let key = (fetcher.part, fetcher.generation);
            let log = &self.parts[key.0].log;
            let Some((polled, named)) = fetcher.client.poll(log, &mut self.rng) else {
                rest_of_run = None; // the queue is empty: the run ends here
                continue;
            };
            if let Some((_, _, taken)) = rest_of_run {
                self.stats.taken_after_an_error += 1;
                if taken > SHORT_TAIL {
                    self.stats.long_tails += 1;
                }
            }
            let kind = match polled {
                Polled::Message(offset) => {
                    round.push(Some(key), LanePolled::Messages(vec![record(offset)]));
                    if one_message {
                        break;
                    }
                    if let Some(left) = room.get_mut(&member) {
                        *left = left.saturating_sub(1);
                        if *left == 0 && !turn_over.contains(&member) {
                            turn_over.push(member);
                        }
                    }
                    continue;
                }
                Polled::EndOfPartition(_) => PollErrorKind::EndOfPartition,
                Polled::Transient => PollErrorKind::Transient,
                Polled::OutOfRange => PollErrorKind::OutOfRange,
                Polled::BreaksChain => PollErrorKind::BreaksChain,
            };
            // An error taken in a partition's run names it (with the offset of its entry). An
            // end of partition the group member hands out only where the user enabled them.
            let keyed = named.is_some();
            if keyed && kind == PollErrorKind::Transient {
                self.stats.transient_errors_in_runs += 1;
            }
            // As the fetchers hand an error to their round: the production decision.
            let ends_turn = round.push_error(keyed.then_some(key), kind, named);
            if kind == PollErrorKind::EndOfPartition {
                continue;
            }
            if !keyed {
                if kind != PollErrorKind::Transient {
                    self.stats.unnamed_errors += 1;
                }
                // One that names no partition ends the group member's round where it polls
                // one queue; where it takes its partitions' queues, it ends the consumer
                // queue's turn, and they are taken after it. The catch-up consumer's main
                // queue is polled apart from its partitions' queues (first, each round),
                // which go on after an error of it.
                if lane == Lane::Live && ends_turn && !self.member_runs {
                    break;
                }
                continue;
            }
            if lane == Lane::Live {
                // The group member's run goes on after an error, as do its queue's turn and
                // the round (`kafka::live::queues`).
                self.stats.member_run_errors += 1;
                continue;
            }
            turn_over.push(member);
            // Mostly a few entries; one error in ten, a longer tail: the batch call hands out
            // the rest of its run (up to 255 entries in production, `MAX_RUN` - 1; here what
            // the round has left, at most 39). `draw % 4` is what `below(4)` drew before, so
            // a seed replays its history unchanged wherever the tail stays short.
            let draw = self.rng.below(40);
            let left = if draw < 36 {
                draw % SHORT_TAIL
            } else {
                SHORT_TAIL + self.rng.below(36)
            };
            rest_of_run = Some((member, left, 0));
        }
        round.feed(
            self.fetchers
                .iter_mut()
                .enumerate()
                .filter(|(index, _)| members.contains(index))
                .map(|(_, fetcher)| ((fetcher.part, fetcher.generation), &mut fetcher.state)),
        );
        for &member in &members {
            let fetcher = &mut self.fetchers[member];
            if let Some(position) = fetcher.client.position() {
                fetcher.state.handle_position(position);
            }
        }
        Ok(members)
    }

    /// What follows a poll round for one fetcher, as the adapters run it: the proven append,
    /// the watermarks after an out-of-range error (and the truncation they may prove), the
    /// move. A live seek refused under an eager protocol is left to `reassign_all`.
    fn after_poll(
        &mut self,
        index: usize,
        refused: &mut Vec<(usize, i64)>,
    ) -> Result<RoundEnd, Failure> {
        let (lane, part) = (self.fetchers[index].lane, self.fetchers[index].part);
        let may_write = self.may_write(lane, part)?;
        // Appends stored, to be counted.
        let mut counted = Vec::new();
        let buffer = self.buffer.as_ref().ok_or("buffer closed")?;
        let now = self.now;
        let fetcher = &mut self.fetchers[index];
        let log = &self.parts[fetcher.part].log;
        let partition = id(fetcher.part);
        let zombie = fetcher.zombie;
        if zombie && fetcher.rebuild.is_some() {
            // A rebuild of a revoked assignment: its index is gone, and so is it.
            return Ok(RoundEnd::Remove);
        }
        // What was polled first, then (after an out-of-range) what retention deleted, as the
        // watermarks tell the production state machine.
        for step in [Step::Polled, Step::Truncated] {
            let append = match step {
                Step::Polled => fetcher.state.poll_append(),
                Step::Truncated if fetcher.state.poll_watermarks(now) => {
                    let watermarks = if self.faults && self.rng.chance(50) {
                        Err("watermarks timed out".to_owned())
                    } else {
                        Ok((log.low, log.reported_high()))
                    };
                    match fetcher.state.handle_watermarks(watermarks, now) {
                        AfterOutOfRange::Truncated { append, .. } => {
                            self.stats.truncations += 1;
                            Some(append)
                        }
                        AfterOutOfRange::PastLogEnd { .. } => {
                            self.stats.holds += 1;
                            None
                        }
                        AfterOutOfRange::InsideLog | AfterOutOfRange::Unknown { .. } => None,
                    }
                }
                Step::Truncated => None,
            };
            let Some(append) = append else { continue };
            if let Some(end) = fetcher.rebuild {
                // As the rebuild fetcher stores: keys into the index, up to its end.
                let next = append.next.min(end);
                self.appended_keys.extend(
                    append
                        .records
                        .iter()
                        .filter(|r| r.offset < end)
                        .filter_map(|record| {
                            Some((fetcher.part, record.key.as_deref()?.to_vec(), record.offset))
                        }),
                );
                self.rebuilt.push((fetcher.part, next));
                fetcher
                    .state
                    .handle_appended(AppendResult::Stored { fetched_next: next });
                continue;
            }
            if !may_write {
                // Below the free-space floor: refetched later from the buffer's position.
                self.stats.disk_refusals += 1;
                if self.disk.as_ref().is_some_and(|disk| !disk.guard.is_low()) {
                    self.stats.disk_live_stops += 1;
                }
                fetcher.state.handle_appended(AppendResult::Failed);
                continue;
            }
            let result = buffer.append(lane, &self.topic, partition, append.as_fetched());
            let stored = result.is_ok();
            if let Ok(outcome) = &result {
                counted.push(Count {
                    part,
                    lane,
                    layout: append.layout,
                    fetched_next: outcome.fetched_next,
                    bytes: outcome.stored as u64 * RECORD_BYTES as u64,
                });
            }
            match answer(result, zombie, lane)? {
                Some(answer) => fetcher.state.handle_appended(answer),
                None => return Ok(RoundEnd::Remove),
            }
            if stored && self.latest && !zombie {
                // As the fetchers do: what the buffer took is noted in the index.
                self.appended_keys
                    .extend(append.records.iter().filter_map(|record| {
                        Some((fetcher.part, record.key.as_deref()?.to_vec(), record.offset))
                    }));
            }
        }
        for count in counted {
            if lane == Lane::Catchup && self.faults && self.rng.chance(125) {
                self.uncounted.push(count);
            } else {
                self.count_append(count);
            }
        }
        if lane == Lane::Catchup && !zombie && self.fetchers[index].state.is_fetched() {
            return Ok(RoundEnd::Remove);
        }
        if let Some(at) = self.fetchers[index].state.poll_move(now) {
            let assign_fails = lane == Lane::Catchup && self.catchup_assign_fails();
            let fetcher = &mut self.fetchers[index];
            let moved = match lane {
                // The catch-up consumer moves by unassign and assign, which may fail (the
                // partition then stays unassigned until a later round moves it).
                Lane::Catchup => {
                    if assign_fails {
                        fetcher.client.unassign();
                        Err("assign failed".to_owned())
                    } else {
                        fetcher.client.assign(at, &mut self.rng);
                        Ok(())
                    }
                }
                // The group member seeks; a seek is refused while the partition is stopped
                // (out of range) and may time out. Under an incremental protocol the adapter
                // then reassigns the partition alone (which may fail too); under an eager one
                // it assigns everything again once the round's seeks are done.
                Lane::Live => {
                    if fetcher.client.seek(at, &mut self.rng) {
                        Ok(())
                    } else if self.eager && !zombie {
                        refused.push((index, at));
                        return Ok(RoundEnd::Keep);
                    } else if self.rng.chance(700) {
                        fetcher.client.assign(at, &mut self.rng);
                        Ok(())
                    } else {
                        Err("seek and reassign failed".to_owned())
                    }
                }
            };
            // (A failure worth reporting is a log line; retried next round.)
            let _ = fetcher.state.handle_moved(at, moved);
        }
        Ok(RoundEnd::Keep)
    }

    /// Whether a fetcher of `lane` may append to `part` now, as the engine's `may_write` and
    /// `may_write_live` decide it: the production guard fed the simulated disk's free space and whether
    /// anything the buffer holds can be processed ([`nothing_deliverable`]); below the floor,
    /// the live lane of a split partition in `Ordered` stays stopped while its backlog waits.
    fn may_write(&mut self, lane: Lane, part: usize) -> Result<bool, Failure> {
        let (stopped, held) = self.measure_disk()?;
        let held_here = lane == Lane::Live && held.contains(&part);
        Ok(!(stopped || held_here))
    }

    /// The simulated disk measured and fed to the production guard, as the engine's
    /// `may_write` does: whether writing is stopped, and the live lanes held below the floor
    /// while their backlog waits ([`held_below_floor`]).
    fn measure_disk(&mut self) -> Result<(bool, BTreeSet<usize>), Failure> {
        if self.disk.is_none() {
            return Ok((false, BTreeSet::new()));
        }
        let mut held = 0;
        let mut unprocessed = Vec::new();
        for index in 0..self.parts.len() {
            let Some(state) = self
                .buffer()?
                .partition_state(&self.topic, id(index))
                .map_err(|e| err("state", e))?
            else {
                continue;
            };
            for cursors in [state.catchup, state.live] {
                held += (cursors.fetched_next - cursors.committed_next).max(0) as u64;
            }
            if !self.has_runtime(index) {
                continue; // no runtime: the engine does not count it
            }
            // As the engine's runtime counts them (`PartitionRuntime::unprocessed`): fetched and
            // not handed out, by the production account.
            let runtime = &self.parts[index];
            let [catchup_bytes, live_bytes] = runtime
                .readers
                .each_ref()
                .map(|reader| reader.account.undelivered_bytes());
            let backlog_delivered = self.backlog_delivered(index);
            let unprocessed_here = Unprocessed {
                catchup_bytes,
                live_bytes,
                live_waits_for_backlog: live_waits_for_backlog(
                    self.ordered,
                    runtime.token.is_some(),
                    backlog_delivered,
                ),
            };
            unprocessed.push((index, unprocessed_here));
        }
        let drained = nothing_deliverable(unprocessed.iter().map(|(_, part)| *part));
        let Some(disk) = self.disk.as_mut() else {
            return Ok((false, BTreeSet::new()));
        };
        let used = disk.others + held * RECORD_DISK;
        let space = DiskSpace {
            available: disk.total.saturating_sub(used),
            total: disk.total,
        };
        if let Some(change) = disk.guard.observe(&disk.floor, space, drained) {
            if change.low {
                self.stats.disk_stops += 1;
            } else if change.reusing {
                self.stats.disk_reuses += 1;
            }
        }
        let below_floor = disk.guard.writes_below_floor(&disk.floor, space);
        Ok((
            disk.guard.is_low(),
            held_below_floor(below_floor, unprocessed),
        ))
    }

    /// The byte budget of the fetcher of `lane`, as `kafka::budget::Budget::apply` runs it
    /// before a round: the stops ([`WriteStops`]: writing stopped, live lanes held below the
    /// floor) and the budget's own pauses ([`PausePolicy`] over each partition's
    /// unacknowledged bytes in the lane, a share of the budget per slot) applied to the
    /// partitions' clients.
    fn apply_budget(&mut self, lane: Lane) -> Result<(), Failure> {
        let mut budget = std::mem::take(&mut self.budget);
        let result = self.apply_budget_of(lane, &mut budget);
        self.budget = budget;
        result
    }

    fn apply_budget_of(&mut self, lane: Lane, budget: &mut ByteBudget) -> Result<(), Failure> {
        // Every lane's count is checked, fetched or not: the floor reads a catch-up lane's
        // after its fetcher left.
        for part in (0..self.parts.len()).filter(|&part| self.has_runtime(part)) {
            self.check_unacked_counts(part)?;
        }
        let (stopped, held) = self.measure_disk()?;
        let held = if lane == Lane::Live && !stopped {
            held
        } else {
            BTreeSet::new()
        };
        let mut usage = BTreeMap::new();
        for fetcher in &self.fetchers {
            let part = fetcher.part;
            if fetcher.lane != lane || fetcher.zombie || fetcher.rebuild.is_some() {
                continue;
            }
            if !self.has_runtime(part) {
                continue;
            }
            // (Checked against what the lane holds above.)
            let account = &self.parts[part].readers[lane_index(lane)].account;
            usage.insert(part, account.unacked_bytes());
        }
        let slots: usize = (0..self.parts.len())
            .filter(|&part| self.has_runtime(part))
            .map(|part| 1 + usize::from(!self.backlog_delivered(part)))
            .sum();
        // (`budget` is out of `self` meanwhile.)
        let shared_queue =
            lane == Lane::Catchup && self.catchup_queue_shared(budget.shared_catchup_queue);
        let lane_budget = &mut budget.lanes[lane_index(lane)];
        let (policy, paused_holds) = (&lane_budget.policy, &lane_budget.paused_holds);
        let mut changes = lane_budget
            .stops
            .round(usage.keys().copied(), stopped, held, |part| {
                policy.is_paused(part) || paused_holds.contains(part)
            });
        if let Some(limit) = budget.limit {
            // The read-ahead, on the bytes fetched and not handed out that the reader could
            // take now.
            let ahead: BTreeMap<usize, u64> = usage
                .keys()
                .map(|&part| {
                    let undelivered = self.parts[part].readers[lane_index(lane)]
                        .account
                        .undelivered_bytes();
                    let delivered = self.backlog_delivered(part);
                    (
                        part,
                        read_ahead_bytes(lane, !self.ordered, delivered, undelivered),
                    )
                })
                .collect();
            let read_ahead = read_ahead_share(limit, slots, budget.fetch_bytes);
            lane_budget.read_ahead_share = Some(read_ahead);
            for change in lane_budget.read_ahead.decide_share(read_ahead, &ahead) {
                self.stats.read_ahead_holds += u64::from(change.paused);
            }
            // Held in a shared queue: paused (`Budget::pause_shared_holds`).
            let wanted: BTreeSet<usize> = ahead
                .keys()
                .copied()
                .filter(|part| shared_queue && lane_budget.read_ahead.is_paused(part))
                .collect();
            let (stops, policy) = (&lane_budget.stops, &lane_budget.policy);
            for (part, paused) in lane_budget.paused_holds.round(
                wanted,
                |part| ahead.contains_key(part),
                |part| stops.stops(part) || policy.is_paused(part),
            ) {
                self.stats.hold_pauses += u64::from(paused);
                changes.push((part, paused));
            }
            lane_budget.ahead = ahead;
        }
        let decided = match budget.limit {
            Some(limit) => lane_budget.policy.decide(limit, slots, &usage),
            None => Vec::new(),
        };
        for change in decided {
            let (stops, paused_holds) = (&lane_budget.stops, &lane_budget.paused_holds);
            if !stops.stops(&change.partition) && !paused_holds.contains(&change.partition) {
                self.stats.budget_pauses += u64::from(change.paused);
                changes.push((change.partition, change.paused));
            }
        }
        for (part, paused) in changes {
            for fetcher in &mut self.fetchers {
                let ours = fetcher.part == part && fetcher.lane == lane;
                if ours && !fetcher.zombie && fetcher.rebuild.is_none() {
                    fetcher.client.set_paused(paused);
                }
            }
        }
        Ok(())
    }

    /// An append to `part`'s `lane` counted, as the fetchers count it (`Shared::add_buffered`):
    /// in the partition's runtime if it has one now, whoever appended.
    fn count_append(&mut self, count: Count) {
        if self.has_runtime(count.part) {
            self.parts[count.part].idle.appended(count.lane);
            self.parts[count.part].readers[lane_index(count.lane)]
                .account
                .appended(count.layout, count.fetched_next, count.bytes);
        }
    }

    /// The appends whose count was late (see `uncounted`), each counted now or left for later.
    fn count_late_appends(&mut self) {
        for count in std::mem::take(&mut self.uncounted) {
            if self.rng.chance(500) {
                self.stats.late_counts += 1;
                // (A count made at once is of the layout its append was just taken in.)
                let layout = self
                    .buffer
                    .as_ref()
                    .and_then(|buffer| buffer.layout_id(&self.topic, id(count.part)).ok())
                    .flatten();
                if layout != Some(count.layout) {
                    self.stats.counts_of_old_layouts += 1;
                }
                self.count_append(count);
            } else {
                self.uncounted.push(count);
            }
        }
    }

    /// Checks the bytes of each of `part`'s lanes the production account counts
    /// unacknowledged (`PartitionRuntime::buffered`): never more than the lane holds from its
    /// reader's committable offset to its fetched position. A count above that pauses the
    /// lane for bytes it does not hold, and a lane whose count never comes down stalls. Nor
    /// less than what the counts still to come make up (`LaneAccount::counted_behind`): a
    /// count lost for a while lets the lane read ahead past its share until it comes back.
    fn check_unacked_counts(&self, part: usize) -> Result<(), Failure> {
        let state = self
            .buffer()?
            .partition_state(&self.topic, id(part))
            .map_err(|e| err("state", e))?;
        for lane in Lane::ALL {
            let fetched = state
                .as_ref()
                .map_or(0, |state| state.lane(lane).fetched_next);
            let account = &self.parts[part].readers[lane_index(lane)].account;
            let committable = account.acks().committable();
            let held = (fetched - committable).max(0) as u64 * RECORD_BYTES as u64;
            let counted = account.unacked_bytes();
            if counted > held {
                return Err(format!(
                    "the byte budget counts {counted} bytes unacknowledged in the {lane} lane of partition {part}, which holds {held} from its committable offset"
                ));
            }
            // From below: every record handed out was appended in the account's layout, so
            // the counts still to come that it will take make up what was handed out ahead of
            // its count.
            let behind = account.counted_behind();
            if behind > 0 {
                let to_come: u64 = self
                    .counts_to_come(part, lane)
                    .map(|count| count.bytes)
                    .sum();
                if behind > to_come {
                    return Err(format!(
                        "the byte budget's count of the {lane} lane of partition {part} is {behind} bytes behind what was handed out, and only {to_come} are still to be counted: {account:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The late counts of `part`'s `lane` not made yet that its account will take (of its
    /// layout, past what the lane held when assigned: `LaneAccount::counts`).
    fn counts_to_come(&self, part: usize, lane: Lane) -> impl Iterator<Item = &Count> {
        let account = &self.parts[part].readers[lane_index(lane)].account;
        self.uncounted.iter().filter(move |count| {
            count.part == part
                && count.lane == lane
                && account.counts(count.layout, count.fetched_next)
        })
    }

    /// Whether `part`'s backlog is all delivered (its catch-up lane is no longer a slot of
    /// the budget: `PartitionRuntime::backlog_undelivered`).
    fn backlog_delivered(&self, part: usize) -> bool {
        let runtime = &self.parts[part];
        let delivered = runtime.readers[0].account.acks().delivered_next();
        runtime
            .layout
            .catchup_ranges
            .last()
            .is_none_or(|range| delivered >= range.end)
    }

    /// Under an eager protocol: the whole assignment assigned again, every live lane
    /// restarting at its buffer's position (`kafka/live/poll.rs`, `reassign_all`); if that
    /// fails, the refused moves are retried next round.
    fn reassign_all(&mut self, refused: Vec<(usize, i64)>) {
        self.stats.eager_reassigns += 1;
        if self.faults && self.rng.chance(100) {
            for (index, at) in refused {
                let _ = self.fetchers[index]
                    .state
                    .handle_moved(at, Err("assign failed".to_owned()));
            }
            return;
        }
        for fetcher in &mut self.fetchers {
            if fetcher.lane == Lane::Live && !fetcher.zombie {
                let cursor = fetcher.state.cursor();
                let at = cursor.reposition().unwrap_or(cursor.stored_next());
                fetcher.client.assign(at, &mut self.rng);
                fetcher.state.restarted_at(at);
            }
        }
        // A partition not reconciled yet is assigned at the log end again, still paused.
        for (&part, client) in &mut self.parked {
            client.assign(self.parts[part].log.reported_high(), &mut self.rng);
        }
    }

    /// `part` is revoked (after a commit attempt, as the live fetcher does) and assigned
    /// again; the buffer keeps its records for reconciliation to reuse (or, as the pruning
    /// does once they are stale, discards them), and its old fetchers linger as stale
    /// writers for a while.
    fn revoke_and_reassign(&mut self, part: usize) -> Result<(), Failure> {
        // The rebalance records the cycle under way first.
        self.finish_cycle()?;
        if self.rng.chance(500) {
            self.commit(&[part])?;
        }
        let discard = self.rng.chance(500);
        let buffer = self.buffer()?;
        if discard {
            buffer
                .discard_partition(&self.topic, id(part))
                .map(|_| ())
                .map_err(|e| err("discard", e))?;
        } else {
            buffer
                .retire_layout(&self.topic, id(part))
                .map_err(|e| err("retire", e))?;
        }
        self.fetchers.retain(|f| f.part != part || !f.zombie);
        for fetcher in &mut self.fetchers {
            if fetcher.part == part {
                fetcher.zombie = true;
            }
        }
        // Unassigned by the revoke: a new assignment starts it afresh (and it is no longer
        // this member's to refetch, had the reader found it damaged: `forget_damaged`).
        self.parked.remove(&part);
        self.damaged.remove(&part);
        self.assign(&[part])
    }

    /// The application reads: in `Ordered` mode the partition's next records in delivery
    /// order (`Buffer::read_ordered`, as the engine's reader does: the catch-up ranges, then
    /// the live lane), in `Concurrent` mode the next records of `lane`.
    fn read(&mut self, part: usize, lane: Lane) -> Result<(), Failure> {
        if !self.has_runtime(part) {
            return Ok(());
        }
        // `Latest`: the backlog waits while its keys are read again (the engine's fill skips
        // the lane).
        let waits = self.latest
            && lane == Lane::Catchup
            && self.parts[part]
                .index
                .as_ref()
                .is_some_and(|index| !index.catchup_may_deliver());
        // As the engine's fill: while what was acknowledged waits for commits, a partition
        // with records waiting is not read.
        let awaiting_of = |part: &Part| -> u64 {
            part.readers
                .iter()
                .map(|reader| reader.account.acks().awaiting_commit())
                .sum()
        };
        let runtimes: Vec<usize> = (0..self.parts.len())
            .filter(|&part| self.has_runtime(part))
            .collect();
        let awaiting: u64 = runtimes
            .iter()
            .map(|&part| awaiting_of(&self.parts[part]))
            .sum();
        self.reader_waits = reader_waits_for_commits(awaiting, self.reader_budget);
        let own = awaiting_of(&self.parts[part]);
        let readable = may_read(own, awaiting, runtimes.len(), self.reader_budget);
        self.stats.commit_waits += u64::from(!readable);
        self.failing_held |= !readable && self.commits_fail_for == Some(part);
        if !waits && readable && self.faults && self.rng.below(DAMAGE_ODDS) == 0 {
            self.damaged_on_read(part);
            return Ok(());
        }
        if !waits && readable {
            self.fill(part, lane)?;
        }
        if self.latest {
            self.hand_out_queued(part)?;
        }
        let state = &mut self.parts[part];
        if state.index.is_some()
            && KeyIndex::done(
                state.layout.catchup_end(),
                state.readers[0].account.acks().committable(),
            )
        {
            state.index = None;
        }
        Ok(())
    }

    /// Reads the next records of `part` (of `lane` unless `Ordered`) and hands them out —
    /// in `Latest` into the lane's queue, each asked about as the engine's fill asks.
    fn fill(&mut self, part: usize, lane: Lane) -> Result<(), Failure> {
        let max = 1 + self.rng.below(MAX_READ as u64) as usize;
        let buffer = self.buffer()?;
        // The production reader's slot for this read, and whether it would make it (the
        // simulation always does, and checks that leaving it out only waits for a report).
        let slot = if self.ordered {
            ReadSlot::Ordered
        } else {
            ReadSlot::Lane(lane)
        };
        let idle_clock = self.idle_clock;
        let worth = self.parts[part].idle.worth_reading(slot, idle_clock);
        let appends = self.parts[part].idle.appends();
        let (from, read) = if self.ordered {
            let from = self.parts[part].ordered_next;
            (from, buffer.read_ordered(&self.topic, id(part), from, max))
        } else {
            let from = self.parts[part].readers[lane_index(lane)].next;
            (from, buffer.read(lane, &self.topic, id(part), from, max))
        };
        let batch = match read {
            Ok(batch) => batch,
            // As the engine's reader: the partition is taken off and fetched again.
            Err(StoreError::Damaged { .. }) => {
                self.stats.damage_found += 1;
                self.damaged_on_read(part);
                return Ok(());
            }
            Err(e) => return Err(err("read", e)),
        };
        let lane = if self.ordered {
            self.parts[part].ordered_next = batch.next;
            batch.lane
        } else {
            lane
        };
        if !worth {
            self.stats.reads_left_out += 1;
            if !batch.records.is_empty() || batch.next != from {
                // What the slot waits for: an append to either lane in `Ordered`, to its own
                // lane otherwise.
                let awaited =
                    |count: &&Count| count.part == part && (self.ordered || count.lane == lane);
                if !self.uncounted.iter().any(|count| awaited(&count)) {
                    return Err(format!(
                        "a read of partition {part} from {from} that the reader leaves out (it reached the buffer's end, and no append was reported since) found records or moved to {}",
                        batch.next
                    ));
                }
                self.stats.left_out_awaiting_report += 1;
            }
        }
        self.parts[part]
            .idle
            .read(slot, appends, batch.exhausted, idle_clock);
        let next = batch.next;
        for record in batch.records {
            let offset = record.offset;
            if record.payload.as_deref() != Some(payload(offset).as_slice()) {
                return Err(format!(
                    "{lane} delivered a record that is not the log's at {offset} of partition {part}"
                ));
            }
            if !self.latest {
                self.hand_out(part, lane, &record)?;
                continue;
            }
            let state = &mut self.parts[part];
            let reader = &mut state.readers[lane_index(lane)];
            reader.account.hand_out(offset, RECORD_BYTES);
            let verdict = state.index.as_mut().map_or(Verdict::Deliver, |index| {
                index.verdict(record.key.as_deref(), offset)
            });
            if verdict == Verdict::Skip {
                reader.account.acknowledge(offset);
                state.delivered.insert(offset);
                self.stats.superseded += 1;
            } else {
                state.queued[lane_index(lane)].push_back(record);
            }
        }
        let reader = &mut self.parts[part].readers[lane_index(lane)];
        reader.account.read_through(next);
        reader.next = reader.next.max(next);
        Ok(())
    }

    /// `Latest`: the application takes some queued records (all once faults stopped), in
    /// any interleaving of the lanes; a backlog record is asked about again, as the engine's
    /// reader does when it hands one out.
    fn hand_out_queued(&mut self, part: usize) -> Result<(), Failure> {
        let count = if self.faults {
            self.rng.below(8)
        } else {
            u64::MAX
        };
        for _ in 0..count {
            let [catchup, live] = &self.parts[part].queued;
            let lane = match (catchup.is_empty(), live.is_empty()) {
                (true, true) => break,
                (true, false) => Lane::Live,
                (false, true) => Lane::Catchup,
                (false, false) if self.rng.chance(600) => Lane::Live,
                (false, false) => Lane::Catchup,
            };
            let state = &mut self.parts[part];
            let Some(record) = state.queued[lane_index(lane)].pop_front() else {
                break;
            };
            let superseded = lane == Lane::Catchup
                && state
                    .index
                    .as_ref()
                    .is_some_and(|index| index.superseded(record.key.as_deref(), record.offset));
            if superseded {
                state.readers[0].account.acknowledge(record.offset);
                state.delivered.insert(record.offset);
                self.stats.superseded += 1;
                continue;
            }
            self.hand_out(part, lane, &record)?;
        }
        Ok(())
    }

    /// `record` of `lane` reaches the application: the oracles on order, then the reader's
    /// bookkeeping (in `Latest` the fill counted it delivered already).
    fn hand_out(
        &mut self,
        part: usize,
        lane: Lane,
        record: &catchup::store::Record,
    ) -> Result<(), Failure> {
        let (ordered, latest) = (self.ordered, self.latest);
        let state = &mut self.parts[part];
        let offset = record.offset;
        if let Some(key) = record.key.as_deref().filter(|_| latest) {
            if let Some(&newer) = state
                .handed_in_assignment
                .get(key)
                .filter(|&&o| o >= offset)
            {
                return Err(format!(
                    "Latest handed out {offset} of partition {part} after {newer} of its key in the same assignment"
                ));
            }
            // An older value after a newer one the live lane handed out: never in one
            // process; after a crash, only of a newer one the live lane hands out again
            // (see `KeyIndex::for_assignment`) or one retention deleted.
            let newer_here = state.live_handed_here.get(key).copied();
            let newer_before = state
                .live_handed
                .get(key)
                .copied()
                .filter(|&newer| newer < state.live_resumed);
            // Unless retention deleted the newer one before the rebuild read its key again (in
            // this process too, at a reassignment): the buffer may still hold an older one
            // (docs/design.md, "Latest: the key index").
            let deleted_before_read = |newer: i64| {
                state
                    .rebuilt
                    .iter()
                    .find(|&&(next, _)| next > newer)
                    .is_some_and(|&(_, low)| low > newer)
            };
            if let Some(newer) = newer_here
                .into_iter()
                .chain(newer_before)
                .filter(|&newer| !deleted_before_read(newer))
                .find(|&newer| newer > offset && newer >= state.replay_end)
                .filter(|_| lane == Lane::Catchup)
            {
                return Err(format!(
                    "Latest's catch-up lane handed out {offset} of partition {part} after the live lane handed out {newer} of its key"
                ));
            }
            state.handed_in_assignment.insert(key.to_vec(), offset);
            state.last_handed.insert(key.to_vec(), offset);
            if lane == Lane::Live {
                for handed in [&mut state.live_handed, &mut state.live_handed_here] {
                    let newest = handed.entry(key.to_vec()).or_insert(offset);
                    *newest = (*newest).max(offset);
                }
            }
        }
        let reader = &mut state.readers[lane_index(lane)];
        if reader.last_delivered.is_some_and(|last| offset <= last) {
            return Err(format!(
                "{lane} delivered {offset} of partition {part} after {:?}",
                reader.last_delivered
            ));
        }
        // `Ordered`: strictly in offset order across the lanes within a lifetime.
        if ordered && state.last_ordered.is_some_and(|last| offset <= last) {
            return Err(format!(
                "Ordered delivered {offset} of partition {part} after {:?}",
                state.last_ordered
            ));
        }
        if lane == Lane::Live {
            state.live_handed_next = Some(state.live_handed_next.unwrap_or(0).max(offset + 1));
        }
        state.last_ordered = Some(offset);
        reader.last_delivered = Some(offset);
        if !latest {
            reader.account.hand_out(offset, RECORD_BYTES);
        }
        reader.unacked.push(offset);
        state.delivered.insert(offset);
        Ok(())
    }

    fn ack(&mut self, part: usize, lane: Lane) {
        let waiting = self.parts[part].readers[lane_index(lane)].unacked.len();
        if waiting == 0 {
            return;
        }
        let index = self.rng.below(waiting as u64) as usize;
        let reader = &mut self.parts[part].readers[lane_index(lane)];
        let offset = reader.unacked.swap_remove(index);
        reader.account.acknowledge(offset);
    }

    fn ack_all(&mut self, part: usize, lane: Lane) {
        let reader = &mut self.parts[part].readers[lane_index(lane)];
        for offset in reader.unacked.drain(..) {
            reader.account.acknowledge(offset);
        }
    }

    fn commit_all(&mut self) -> Result<(), Failure> {
        // What was processed so far is covered now: the early-commit count restarts.
        self.acked_at_commit = self.acked_bytes();
        let all: Vec<usize> = (0..self.parts.len()).collect();
        self.commit(&all)
    }

    /// Bytes acknowledged in all, as the readers of the partitions' runtimes count them.
    fn acked_bytes(&self) -> u64 {
        self.parts
            .iter()
            .flat_map(|part| &part.readers)
            .map(|reader| reader.account.acks().acked_bytes())
            .sum()
    }

    /// Commits what the readers of `parts` processed, as the group member does on its own
    /// thread (a revoke's commit, the drain's): after the cycle under way is recorded, each
    /// partition's real commit plan and the production cycle ([`CommitCycle`]) over them — the
    /// main-log writes in one request (refused as a whole or for some partitions), then the
    /// side-log writes of the others (each may fail), then the buffer's cursors of those whose
    /// every write happened; a crash possible after the main-log request and between the
    /// side-log writes.
    fn commit(&mut self, parts: &[usize]) -> Result<(), Failure> {
        self.finish_cycle()?;
        match self.plan_and_send(parts)? {
            Some(sent) => self.record(sent),
            None => self.crash(),
        }
    }

    /// The group member's scheduled commit: planned and sent now, recorded in a later step
    /// (or first thing in a rebalance, a retried assignment or a commit of its own), as the
    /// commit thread sends a cycle while the live lane is fetched.
    fn begin_cycle(&mut self, reader_waits: bool) -> Result<(), Failure> {
        // What was processed so far is covered now: the early-commit count restarts.
        self.acked_at_commit = self.acked_bytes();
        let all: Vec<usize> = (0..self.parts.len()).collect();
        let started = self.now;
        match self.plan_and_send(&all)? {
            None => {
                self.crash()?;
                self.schedule.committed(started, self.now, reader_waits);
            }
            // Nothing to write: it ended at once.
            Some(sent) if sent.plans.is_empty() => {
                self.schedule.committed(started, self.now, reader_waits);
            }
            Some(sent) => {
                self.in_flight = Some(SentCycle {
                    started,
                    reader_waits,
                    ..sent
                });
                self.schedule.commit_started();
            }
        }
        Ok(())
    }

    /// Records the cycle under way, if any, and tells the schedule it ended.
    fn finish_cycle(&mut self) -> Result<(), Failure> {
        let Some(sent) = self.in_flight.take() else {
            return Ok(());
        };
        let (started, reader_waits) = (sent.started, sent.reader_waits);
        self.record(sent)?;
        self.schedule.committed(started, self.now, reader_waits);
        Ok(())
    }

    /// Plans the commits of `parts` and sends the cycle's writes; `None` when the process
    /// crashed during the sends.
    fn plan_and_send(&mut self, parts: &[usize]) -> Result<Option<SentCycle>, Failure> {
        // A partition waiting for its reconciliation, or taken off as damaged, has no runtime
        // to commit.
        let with_runtime: Vec<usize> = parts
            .iter()
            .copied()
            .filter(|&part| self.has_runtime(part))
            .collect();
        let plans: Vec<(usize, CommitPlan, i64, [u64; 2])> = with_runtime
            .iter()
            .filter_map(|&part| {
                let state = &mut self.parts[part];
                let catchup_processed = state.readers[0].account.acks().committable();
                let plan = plan_commit(&Progress {
                    token: state.token,
                    side: state.side_entry.as_ref(),
                    layout: &state.layout,
                    main_committed: state.main_committed,
                    catchup_processed,
                    live_processed: state.readers[1].account.acks().committable(),
                });
                // As the engine's `pending_commits`: what was acknowledged waits for this
                // plan's commit, or for none when it writes nothing.
                let lanes = state.readers.each_mut().map(|reader| &mut reader.account);
                let acked = commit_planned(lanes, &plan)?;
                Some((part, plan, catchup_processed, acked))
            })
            .collect();
        let cycle = CommitCycle::new(
            plans
                .iter()
                .map(|(part, plan, ..)| (*part, plan.writes(self.parts[*part].token.as_ref())))
                .collect(),
        );
        let tokens: Vec<Option<SplitToken>> = plans
            .iter()
            .map(|(part, ..)| self.parts[*part].token)
            .collect();
        Ok(self.send_cycle(&cycle, &tokens)?.map(|sent| SentCycle {
            plans,
            cycle,
            sent,
            started: self.now,
            reader_waits: false,
        }))
    }

    /// Records what a sent cycle left in Kafka: the partitions whose every write happened.
    fn record(&mut self, sent: SentCycle) -> Result<(), Failure> {
        let SentCycle {
            plans,
            cycle,
            sent: (refused, side_failed),
            ..
        } = sent;
        for index in cycle.applied(&refused, &side_failed) {
            let (part, plan, catchup_processed, acked) = &plans[index];
            if !self.has_runtime(*part) {
                continue; // `commit_applied` finds no runtime of the plan's generation
            }
            let lanes = self.parts[*part].readers.each_mut();
            commit_landed(lanes.map(|reader| &mut reader.account), *acked);
            self.applied(*part, plan, *catchup_processed)?;
        }
        Ok(())
    }

    /// Sends a cycle's writes to Kafka as the group member does (`send_cycle`): the main-log
    /// writes in one request (refused as a whole or for some partitions), then the side-log
    /// writes of the others (each may fail), each sealed under `tokens[index]`. Returns the
    /// partitions refused and the indices whose side write failed, or `None` when the process
    /// crashed after the main-log request or between the side-log writes.
    fn send_cycle(
        &mut self,
        cycle: &CommitCycle<usize>,
        tokens: &[Option<SplitToken>],
    ) -> Result<Option<CycleSent>, Failure> {
        let mains: Vec<(usize, MainLogCommit)> = cycle
            .mains()
            .into_iter()
            .map(|(part, main)| (*part, main.clone()))
            .collect();
        let request_failed = self.faults && self.rng.chance(20);
        let mut refused = Vec::new();
        for (part, main) in &mains {
            if self.commits_fail_for == Some(*part) {
                refused.push(*part);
                continue;
            }
            if request_failed || (self.faults && self.rng.chance(30)) {
                self.stats.commit_refusals += 1;
                refused.push(*part);
                // A request that timed out may still have been applied: the consumer must
                // not count on either.
                if self.rng.chance(300) {
                    self.stats.failed_yet_written += 1;
                    self.write_main(*part, main.offset, main.metadata.clone())?;
                }
                continue;
            }
            self.write_main(*part, main.offset, main.metadata.clone())?;
        }
        let sides: Vec<(usize, usize, SideWrite)> = cycle
            .sides(&refused)
            .into_iter()
            .map(|(index, part, side)| (index, *part, side.clone()))
            .collect();
        if !mains.is_empty() && !sides.is_empty() && self.crashes_here() {
            return Ok(None);
        }
        let mut side_failed = Vec::new();
        for (index, part, side) in sides {
            if self.commits_fail_for == Some(part) {
                side_failed.push(index);
                continue;
            }
            let failed = self.faults && self.rng.chance(30);
            if failed {
                side_failed.push(index);
                // As a main-log request, a side write reported failed may have landed.
                if !self.rng.chance(300) {
                    continue;
                }
                self.stats.failed_yet_written += 1;
            }
            let key = self.side_key(part);
            match side {
                SideWrite::Keep => {}
                SideWrite::Write(entry) => {
                    let token = tokens
                        .get(index)
                        .copied()
                        .flatten()
                        .ok_or("a side write without a token")?;
                    self.write_side(part, Some(entry.seal(&key, &token.secret).into_bytes()))?;
                }
                SideWrite::Tombstone => self.write_side(part, None)?,
            }
            if self.crashes_here() {
                return Ok(None);
            }
        }
        Ok(Some((refused, side_failed)))
    }

    /// What the engine records once Kafka holds a partition's writes
    /// (`Shared::commit_applied`).
    fn applied(
        &mut self,
        part: usize,
        plan: &CommitPlan,
        catchup_processed: i64,
    ) -> Result<(), Failure> {
        let buffer = self.buffer.as_ref().ok_or("buffer closed")?;
        let (topic, partition) = (&self.topic, id(part));
        // Whether the buffer recorded it: a chunk it reads to delete what the commit covers
        // may be damaged on disk, and the engine then reports the error and records nothing
        // more of this partition's cycle (the damaged chunk starts below the commit: a later
        // commit past its end deletes it, a read from the commit finds it, or the next reuse).
        let mut damaged = false;
        let mut record = |lane: Lane, offset: i64| -> Result<bool, Failure> {
            match buffer.record_committed(lane, topic, partition, offset) {
                Ok(_) => Ok(true),
                Err(StoreError::Damaged { .. }) => {
                    damaged = true;
                    Ok(false)
                }
                Err(e) => Err(err("record_committed", e)),
            }
        };
        let state = &mut self.parts[part];
        match plan {
            CommitPlan::Nothing => {}
            CommitPlan::Plain { offset } => {
                state.main_committed = *offset;
                record(Lane::Live, *offset)?;
            }
            CommitPlan::Split { main, side } => {
                let recorded = match main {
                    Some(main) => {
                        state.main_committed = *main;
                        record(Lane::Catchup, *main)?
                    }
                    None => true,
                };
                if let Some(side) = side.as_ref().filter(|_| recorded) {
                    state.side_entry = Some(side.clone());
                    record(Lane::Live, side.live_next)?;
                }
            }
            CommitPlan::Merge { offset } => {
                self.stats.merges += 1;
                state.main_committed = *offset;
                state.token = None;
                state.side_entry = None;
                if record(Lane::Catchup, catchup_processed)? {
                    record(Lane::Live, *offset)?;
                }
            }
        }
        self.stats.damaged_commits += u64::from(damaged);
        Ok(())
    }

    /// Kafka claims every offset of every partition processed.
    fn settled(&mut self) -> Result<bool, Failure> {
        for part in 0..self.parts.len() {
            if !self.part_settled(part)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether Kafka holds `part` as processed to its log end.
    fn part_settled(&mut self, part: usize) -> Result<bool, Failure> {
        let decision = self.decide(part, None);
        Ok(decision.layout.catchup_ranges.is_empty()
            && decision.layout.live_from >= self.parts[part].log.high())
    }

    /// Whether every reader's byte count is back to zero, or waits for a count still to
    /// come: everything the buffer held was handed out and acknowledged.
    fn accounts_balanced(&self) -> bool {
        self.parts.iter().enumerate().all(|(index, part)| {
            !self.has_runtime(index)
                || part.readers.iter().all(|reader| {
                    reader.account.balanced()
                        || self.counts_to_come(index, reader.lane).next().is_some()
                })
        })
    }

    /// Once settled, every record of every log at or after its start is delivered.
    /// In `Latest`, skipped records count as processed, and per key the application's last
    /// value is the log's latest.
    fn final_check(&self) -> Result<(), Failure> {
        // Everything is handed out and acknowledged: each lane's byte count is back to zero,
        // unless a count it takes is still to come.
        for (index, part) in self.parts.iter().enumerate() {
            if !self.has_runtime(index) {
                continue;
            }
            for reader in &part.readers {
                let pending = self.counts_to_come(index, reader.lane).next().is_some();
                if !pending && !reader.account.balanced() {
                    return Err(format!(
                        "the byte budget's count of the {} lane of partition {index} is off once everything is acknowledged: {:?}",
                        reader.lane, reader.account
                    ));
                }
            }
        }
        for (index, part) in self.parts.iter().enumerate() {
            let mut latest: HashMap<Vec<u8>, i64> = HashMap::new();
            for offset in part.start..part.log.high() {
                if !part.log.is_record(offset) {
                    continue;
                }
                if !part.delivered.contains(&offset) {
                    return Err(format!(
                        "LOSS: record {offset} of partition {index} was never delivered"
                    ));
                }
                if let Some(key) = key_of(offset) {
                    latest.insert(key, offset);
                }
            }
            if !self.latest {
                continue;
            }
            for (key, offset) in latest {
                let last = part.last_handed.get(&key);
                if last != Some(&offset) {
                    return Err(format!(
                        "LOSS: the last value of key {} of partition {index} handed out is {last:?}, the log's latest is {offset}",
                        String::from_utf8_lossy(&key)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// How long a history is: its faulty steps (then it drains), and fewer than how many
/// entries each log starts with.
#[derive(Debug, Clone)]
pub struct Shape {
    pub steps: std::ops::Range<u64>,
    pub log_entries: u64,
}

/// The suite's histories: 200 to 1,000 faulty steps over logs of up to 400 entries.
pub const SEED_SHAPE: Shape = Shape {
    steps: 200..1000,
    log_entries: 400,
};

/// A fuzzer's histories: short (10 to 60 faulty steps, logs of up to 60 entries), so that
/// the fuzzer runs many and its choices steer each.
pub const INPUT_SHAPE: Shape = Shape {
    steps: 10..60,
    log_entries: 60,
};

/// Runs one seed in `dir`, reusing `buffer` if given; returns the buffer for the next seed.
pub fn run_seed(
    seed: u64,
    dir: PathBuf,
    buffer: Option<Buffer>,
) -> (Result<Stats, Failure>, Option<Buffer>) {
    run_choices(seed, &[], SEED_SHAPE, dir, buffer)
}

/// Runs the history a fuzzer's input describes: its first eight bytes are the seed, the rest
/// the choices, in the fuzzer's shape. The fuzz target and the replay of its corpus run
/// exactly this.
pub fn run_input(
    input: &[u8],
    dir: PathBuf,
    buffer: Option<Buffer>,
) -> (Result<Stats, Failure>, Option<Buffer>) {
    let mut seed = [0u8; 8];
    let len = input.len().min(8);
    seed[..len].copy_from_slice(&input[..len]);
    let seed = u64::from_le_bytes(seed);
    run_choices(seed, &input[len..], INPUT_SHAPE, dir, buffer)
}

/// Runs a history whose choices come from `choices` first, then `seed`, in `shape`; returns
/// the buffer for the next run, without this run's partitions.
pub fn run_choices(
    seed: u64,
    choices: &[u8],
    shape: Shape,
    dir: PathBuf,
    buffer: Option<Buffer>,
) -> (Result<Stats, Failure>, Option<Buffer>) {
    let steps = shape.steps.clone();
    let mut sim = match Sim::with_choices(seed, choices, shape, dir, buffer) {
        Ok(sim) => sim,
        Err(failure) => return (Err(failure), None),
    };
    let steps = steps.start + sim.rng.below(steps.end.saturating_sub(steps.start));
    let result = sim.run(steps).and_then(|()| {
        let spilled = sim.buffer()?.spilled_bytes() - sim.spilled_from + sim.spilled_by_closed;
        Ok(Stats {
            spilled_bytes: spilled,
            ..sim.stats
        })
    });
    let buffer = sim.into_buffer();
    (result, buffer)
}
