//! A deterministic simulation of the consumer without a broker, driven by one seed.
//!
//! One partition's log (records, compaction gaps, transaction markers, retention deleting the
//! head, records arriving while fetching, a high watermark that briefly goes back on a leader
//! change), two simulated clients that behave like librdkafka where it matters (positions that
//! move only past what was handed out and markers, an asynchronous position reset after a
//! reassign, ends of partition, errors anywhere — some of which skip a message), the real
//! [`FetchCursor`]s and the real [`Buffer`] on a temporary directory, a reader that acks in any
//! order, and the group's state in Kafka: the main log's offset and metadata and the side
//! topic's entry. Every assignment runs the real reconciliation ([`reconcile`]) and applies its
//! decision; every commit runs the real commit plan ([`plan_commit`]) and writes to the main
//! and side logs in the consumer's order; the process crashes at any step, between two writes
//! included; revokes leave a stale writer behind. Splits, re-splits with several ranges and
//! merges all come out of the real decisions.
//!
//! Oracle: what Kafka claims processed — read back, after every write, by reconciliation as a
//! restarted consumer would — holds only delivered records (invariant 1); deliveries strictly
//! increase per lane within a process lifetime (invariant 2); every delivered record is the
//! log's record at that offset; stale writers are refused (invariant 8); a side entry this
//! consumer wrote is never rejected as forged or implausible; and once faults stop,
//! everything is delivered and committed (no stall).
//!
//! Shared by `tests/simulation.rs` (thousands of seeds) and the `fetch_sim` fuzz target.

#![allow(dead_code)] // the fuzz target and the test use different parts

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use catchup::fetch::{AfterOutOfRange, AppendResult, LanePartition, Polled as LanePolled};
use catchup::plan::{
    AckTracker, AssignStep, CommitPlan, Committed, Inputs, OffsetReset, PlanEvent, Progress,
    SideEntry, SideValue, SideWrite, SplitSecret, SplitToken, plan_commit, reconcile, side_key,
};
use catchup::store::{
    Buffer, BufferOptions, Lane, PartitionLayout, PartitionState, Record, StoreError, Timestamp,
};

/// The simulation's choices: taken from a fuzzer's bytes while they last (each choice
/// reads as few bytes as its range needs, so coverage can steer every decision), then from
/// splitmix64 — small, fast, and the same everywhere.
pub struct Rng {
    state: u64,
    choices: Vec<u8>,
    taken: usize,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self::with_choices(seed, &[])
    }

    /// Choices from `choices` first, then from `seed`.
    pub fn with_choices(seed: u64, choices: &[u8]) -> Self {
        Self {
            state: seed,
            choices: choices.to_vec(),
            taken: 0,
        }
    }

    pub fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        let n = n.max(1);
        let width = match n {
            0..=0x100 => 1,
            0x101..=0x1_0000 => 2,
            _ => 8,
        };
        if self.taken + width <= self.choices.len() {
            let bytes = &self.choices[self.taken..self.taken + width];
            self.taken += width;
            let value = bytes
                .iter()
                .fold(0u64, |value, &b| (value << 8) | u64::from(b));
            return value % n;
        }
        self.next() % n
    }

    /// True with probability `permille`/1000.
    pub fn chance(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Record,
    Compacted,
    Marker,
}

/// The partition's log as the broker holds it.
struct Log {
    entries: Vec<Entry>,
    /// Retention deleted everything below.
    low: i64,
    /// A new leader briefly reports a lower high watermark.
    lowered_high: Option<i64>,
}

impl Log {
    fn high(&self) -> i64 {
        self.entries.len() as i64
    }

    fn produce(&mut self, rng: &mut Rng) {
        let entry = match rng.below(20) {
            0 => Entry::Marker,
            _ => Entry::Record,
        };
        self.entries.push(entry);
    }

    fn is_record(&self, offset: i64) -> bool {
        offset >= self.low && self.entries.get(offset as usize) == Some(&Entry::Record)
    }
}

fn payload(offset: i64) -> Vec<u8> {
    offset.to_be_bytes().to_vec()
}

fn record(offset: i64) -> Record {
    Record {
        offset,
        timestamp: Timestamp::NotAvailable,
        key: None,
        payload: Some(payload(offset)),
        headers: Vec::new(),
    }
}

/// What a simulated `poll` returns.
enum Polled {
    Message(i64),
    EndOfPartition,
    Transient,
    OutOfRange,
    BreaksChain,
}

/// A consumer's view of the partition, as librdkafka keeps it.
struct Client {
    /// `None`: not fetching (stopped by an out-of-range error).
    fetch_pos: Option<i64>,
    /// The application position: past the last message handed out (or marker passed).
    app_pos: Option<i64>,
    /// After a reassign the old position is still reported for a few calls (the reset runs on
    /// another thread).
    stale: Option<(i64, u32)>,
    /// The end of partition already reported at this offset.
    eof_at: Option<i64>,
    faults: bool,
}

impl Client {
    fn new(at: i64, faults: bool) -> Self {
        Self {
            fetch_pos: Some(at),
            app_pos: None,
            stale: None,
            eof_at: None,
            faults,
        }
    }

    fn assign(&mut self, at: i64, rng: &mut Rng) {
        if let Some(old) = self.app_pos {
            if rng.chance(500) {
                self.stale = Some((old, 1 + rng.below(3) as u32));
            }
        }
        self.fetch_pos = Some(at);
        self.app_pos = None;
        self.eof_at = None;
    }

    /// librdkafka's seek: refused unless the partition is fetching; moves the fetch and the
    /// application position at once (the old fetch's messages are dropped by version).
    fn seek(&mut self, at: i64, rng: &mut Rng) -> bool {
        if self.fetch_pos.is_none() || (self.faults && rng.chance(100)) {
            return false;
        }
        self.fetch_pos = Some(at);
        self.app_pos = Some(at);
        self.stale = None;
        self.eof_at = None;
        true
    }

    fn position(&mut self) -> Option<i64> {
        if let Some((old, left)) = self.stale.as_mut() {
            let old = *old;
            *left -= 1;
            if *left == 0 {
                self.stale = None;
            }
            return Some(old);
        }
        self.app_pos
    }

    fn poll(&mut self, log: &Log, rng: &mut Rng) -> Option<Polled> {
        let polled = self.poll_inner(log, rng);
        if matches!(polled, Some(Polled::Message(_) | Polled::EndOfPartition)) {
            // librdkafka resets the position when the old fetch stops, on the partition's op
            // queue, before the new fetch starts: anything the new assignment hands out comes
            // after the reset.
            self.stale = None;
        }
        polled
    }

    fn poll_inner(&mut self, log: &Log, rng: &mut Rng) -> Option<Polled> {
        let mut pos = self.fetch_pos?;
        if self.faults {
            if rng.chance(20) {
                if rng.chance(500) {
                    // A client that moves past a message it could not hand out.
                    self.fetch_pos = Some(pos + 1);
                }
                return Some(Polled::BreaksChain);
            }
            if rng.chance(10) {
                return Some(Polled::Transient);
            }
            if rng.chance(5) {
                return Some(Polled::EndOfPartition); // spurious, e.g. a lowered watermark
            }
        }
        loop {
            if pos < log.low {
                self.fetch_pos = None;
                return Some(Polled::OutOfRange);
            }
            let high = log.lowered_high.unwrap_or(log.high()).min(log.high());
            if pos > high {
                // A new leader whose high watermark is below the fetch position: out of range,
                // and with `auto.offset.reset=error` the partition stops fetching.
                self.fetch_pos = None;
                return Some(Polled::OutOfRange);
            }
            if pos >= high {
                self.fetch_pos = Some(pos);
                if self.eof_at != Some(pos) {
                    self.eof_at = Some(pos);
                    return Some(Polled::EndOfPartition);
                }
                return None;
            }
            match log.entries[pos as usize] {
                Entry::Record => {
                    self.fetch_pos = Some(pos + 1);
                    self.app_pos = Some(pos + 1);
                    return Some(Polled::Message(pos));
                }
                Entry::Compacted => pos += 1,
                Entry::Marker => {
                    pos += 1;
                    self.app_pos = Some(pos);
                }
            }
        }
    }
}

/// One fetcher on the partition: a simulated client and the production lane state machine
/// (`fetch::LanePartition`), driven in the order the adapters drive it.
struct Fetcher {
    lane: Lane,
    client: Client,
    partition: LanePartition,
    /// A writer left behind by a revoke: every append it makes must be refused.
    zombie: bool,
}

/// The reader of one lane: deliveries, acks, commits.
struct Reader {
    lane: Lane,
    next: i64,
    acks: AckTracker,
    unacked: Vec<i64>,
    last_delivered: Option<i64>,
    committed: i64,
}

impl Reader {
    fn new(lane: Lane, committed: i64) -> Self {
        Self {
            lane,
            next: committed,
            acks: AckTracker::new(committed),
            unacked: Vec::new(),
            last_delivered: None,
            committed,
        }
    }
}

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

/// The buffer's answer to an append, as the adapters read it (`None`: the writer is stale and
/// leaves). A stale writer's append that is accepted, or a write that fails, is a failure.
fn answer(
    result: Result<catchup::store::AppendOutcome, StoreError>,
    zombie: bool,
    lane: Lane,
) -> Result<Option<AppendResult>, Failure> {
    match &result {
        Ok(_) if zombie => return Err(format!("a stale {lane} writer's append was accepted")),
        Ok(_) | Err(StoreError::StaleLayout { .. } | StoreError::Discontinuous { .. }) => {}
        Err(other) => return Err(format!("append: {other}")),
    }
    Ok(AppendResult::from_store(&result))
}

/// A simulation failure: the seed replays it.
pub type Failure = String;

/// What Kafka holds for the group and partition.
#[derive(Debug, Default)]
struct KafkaState {
    /// The main log's committed offset and metadata.
    committed: Option<Committed>,
    /// The side topic's latest value under the partition's key.
    side: Option<Vec<u8>>,
}

pub struct Sim {
    rng: Rng,
    dir: PathBuf,
    buffer: Option<Buffer>,
    topic: String,
    log: Log,
    layout: PartitionLayout,
    fetchers: Vec<Fetcher>,
    readers: [Reader; 2],
    delivered: BTreeSet<i64>,
    /// The first offset the oracle holds the consumer to (the group's committed offset at
    /// the start).
    start: i64,
    faults: bool,
    kafka: KafkaState,
    /// The partition's runtime, as the engine keeps it between commits.
    token: Option<SplitToken>,
    side_entry: Option<SideEntry>,
    main_committed: i64,
    /// `None`: mode `Off` (never split).
    min_lag: Option<u64>,
    /// Splits, layouts with several catch-up ranges (re-splits) and merges, for the report.
    pub splits: u64,
    pub multi_range: u64,
    pub merges: u64,
    /// Out-of-range positions judged a truncation, and positions held past the log end.
    pub truncations: u64,
    pub holds: u64,
    /// Steps run, for the report.
    pub steps: u64,
    /// Simulated time: a step takes `STEP_TIME`.
    now: Instant,
}

/// How much simulated time a step takes (holds of 1 s to 30 s last 20 to 600 steps).
const STEP_TIME: Duration = Duration::from_millis(50);

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Catchup => 0,
        Lane::Live => 1,
    }
}

fn err(context: &str, error: StoreError) -> Failure {
    format!("{context}: {error}")
}

impl Sim {
    /// A new simulation in `dir` (a buffer directory shared by sequential runs; each seed
    /// uses its own topic), or `buffer` already open there.
    pub fn new(seed: u64, dir: PathBuf, buffer: Option<Buffer>) -> Result<Self, Failure> {
        Self::with_choices(seed, &[], dir, buffer)
    }

    /// A simulation whose choices come from `choices` first (a fuzzer's bytes), then `seed`.
    pub fn with_choices(
        seed: u64,
        choices: &[u8],
        dir: PathBuf,
        buffer: Option<Buffer>,
    ) -> Result<Self, Failure> {
        let mut rng = Rng::with_choices(seed, choices);
        let buffer = match buffer {
            Some(buffer) => buffer,
            None => Buffer::open(&dir, BufferOptions::default()).map_err(|e| err("open", e))?,
        };
        let mut log = Log {
            entries: Vec::new(),
            low: 0,
            lowered_high: None,
        };
        for _ in 0..rng.below(400) {
            log.produce(&mut rng);
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
        let min_lag = (!rng.chance(250)).then(|| 1 + rng.below(100));
        let topic = format!("sim-{seed:016x}");
        let mut sim = Self {
            rng,
            dir,
            buffer: Some(buffer),
            topic,
            log,
            layout: PartitionLayout::plain(start),
            fetchers: Vec::new(),
            readers: [Reader::new(Lane::Catchup, 0), Reader::new(Lane::Live, 0)],
            delivered: BTreeSet::new(),
            start,
            faults: true,
            kafka: KafkaState {
                committed: Some(Committed {
                    offset: start,
                    metadata: String::new(),
                }),
                side: None,
            },
            token: None,
            side_entry: None,
            main_committed: start,
            min_lag,
            splits: 0,
            multi_range: 0,
            merges: 0,
            truncations: 0,
            holds: 0,
            steps: 0,
            now: Instant::now(),
        };
        sim.assign()?;
        Ok(sim)
    }

    /// Hands the buffer back for the next seed.
    pub fn into_buffer(mut self) -> Option<Buffer> {
        let _ = self.buffer().map(|b| b.discard_partition(&self.topic, 0));
        self.buffer.take()
    }

    fn buffer(&self) -> Result<&Buffer, Failure> {
        self.buffer
            .as_ref()
            .ok_or_else(|| "buffer closed".to_owned())
    }

    fn side_key(&self) -> String {
        side_key("sim-group", &self.topic, 0)
    }

    /// What reconciliation decides from Kafka's state, the log's watermarks and `local`.
    fn decide(&mut self, local: Option<&PartitionState>) -> catchup::plan::Decision {
        let key = self.side_key();
        let mut secret = [0u8; 16];
        secret[..8].copy_from_slice(&self.rng.next().to_le_bytes());
        secret[8..].copy_from_slice(&self.rng.next().to_le_bytes());
        reconcile(&Inputs {
            committed: self.kafka.committed.as_ref(),
            side: self
                .kafka
                .side
                .as_deref()
                .map(|value| SideValue { key: &key, value }),
            low: self.log.low,
            high: self.log.high(),
            min_lag: self.min_lag,
            reset: OffsetReset::Earliest,
            local,
            fresh_secret: SplitSecret::from_bytes(secret),
        })
    }

    /// The oracle on Kafka's state: what a restarted consumer would take as processed — below
    /// where it would resume, outside the catch-up ranges it would fetch — was delivered.
    fn check_claims(&mut self) -> Result<(), Failure> {
        let decision = self.decide(None);
        for offset in self.start..self.log.high() {
            let claimed = offset < decision.layout.live_from
                && !decision
                    .layout
                    .catchup_ranges
                    .iter()
                    .any(|r| r.contains(offset));
            if claimed && self.log.is_record(offset) && !self.delivered.contains(&offset) {
                return Err(format!(
                    "LOSS: Kafka claims offset {offset} processed (main log {:?}, side entry {:?}), but it was never delivered",
                    self.kafka.committed,
                    self.kafka.side.as_deref().map(String::from_utf8_lossy)
                ));
            }
        }
        Ok(())
    }

    fn write_main(&mut self, offset: i64, metadata: String) -> Result<(), Failure> {
        self.kafka.committed = Some(Committed { offset, metadata });
        self.check_claims()
    }

    fn write_side(&mut self, value: Option<Vec<u8>>) -> Result<(), Failure> {
        self.kafka.side = value;
        self.check_claims()
    }

    /// A crash between two writes, sometimes (never once the faults have stopped).
    fn crashes_here(&mut self) -> bool {
        self.faults && self.rng.chance(80)
    }

    /// The process dies (its fetchers, unacked records and runtime with it; the buffer stays)
    /// and a new one is assigned the partition.
    fn crash(&mut self) -> Result<(), Failure> {
        self.fetchers.clear();
        self.assign()
    }

    /// The partition is assigned: reconcile, apply the decision in the consumer's order (main
    /// log, side log, local buffer), and start readers and fetchers from the buffer.
    fn assign(&mut self) -> Result<(), Failure> {
        let local = self
            .buffer()?
            .partition_state(&self.topic, 0)
            .map_err(|e| err("state", e))?;
        let decision = self.decide(local.as_ref());
        for event in &decision.events {
            match event {
                PlanEvent::StaleSideEntry { reason }
                    if !(reason.contains("no split token") || reason.contains("another split")) =>
                {
                    return Err(format!(
                        "a side entry this consumer wrote was rejected: {reason}"
                    ));
                }
                PlanEvent::SplitStarted { .. } => self.splits += 1,
                PlanEvent::MergeFinished { .. } => self.merges += 1,
                _ => {}
            }
        }
        // The production steps, in order, with a crash possible after each write to Kafka.
        let key = self.side_key();
        let steps = decision.steps()?;
        for step in steps {
            let buffer = self.buffer.as_ref().ok_or("buffer closed")?;
            match step {
                AssignStep::CommitMain(commit) => {
                    self.write_main(commit.offset, commit.metadata.clone())?
                }
                AssignStep::WriteSide(entry, token) => {
                    self.write_side(Some(entry.seal(&key, &token.secret).into_bytes()))?
                }
                AssignStep::TombstoneSide => self.write_side(None)?,
                AssignStep::ReuseLocal {
                    catchup_committed,
                    live_committed,
                } => {
                    buffer
                        .record_committed(Lane::Catchup, &self.topic, 0, catchup_committed)
                        .and_then(|_| {
                            buffer.record_committed(Lane::Live, &self.topic, 0, live_committed)
                        })
                        .map_err(|e| err("reuse", e))?;
                }
                AssignStep::ResetLocal { layout, .. } => {
                    buffer
                        .reset_partition(&self.topic, 0, layout.clone())
                        .map_err(|e| err("layout", e))?;
                }
            }
            if matches!(
                step,
                AssignStep::CommitMain(_) | AssignStep::WriteSide(..) | AssignStep::TombstoneSide
            ) && self.crashes_here()
            {
                return self.crash();
            }
        }
        let buffer = self.buffer.as_ref().ok_or("buffer closed")?;
        let state = buffer
            .partition_state(&self.topic, 0)
            .map_err(|e| err("state", e))?
            .ok_or("partition not laid out")?;
        self.layout = state.layout.clone();
        if self.layout.catchup_ranges.len() > 1 {
            self.multi_range += 1;
        }
        self.token = decision.token;
        self.side_entry = decision.side_entry.clone();
        // As the live fetcher sets it.
        self.main_committed = decision.main_committed(self.kafka.committed.as_ref(), self.log.low);
        self.start_fetching(&state)
    }

    /// Readers at the committed offsets, fetchers at the fetched ones.
    fn start_fetching(&mut self, state: &PartitionState) -> Result<(), Failure> {
        let layout = self
            .buffer()?
            .layout_id(&self.topic, 0)
            .map_err(|e| err("layout id", e))?
            .ok_or("no layout id")?;
        self.readers = [
            Reader::new(Lane::Catchup, state.catchup.committed_next),
            Reader::new(Lane::Live, state.live.committed_next),
        ];
        self.fetchers.retain(|f| f.zombie);
        if !state.catchup_fetched() {
            self.fetchers.push(Fetcher {
                lane: Lane::Catchup,
                client: Client::new(state.catchup.fetched_next, self.faults),
                partition: LanePartition::catchup(
                    layout,
                    state.catchup.fetched_next,
                    state.layout.catchup_ranges.clone(),
                ),
                zombie: false,
            });
        }
        self.fetchers.push(Fetcher {
            lane: Lane::Live,
            client: Client::new(state.live.fetched_next, self.faults),
            partition: LanePartition::live(layout, state.live.fetched_next),
            zombie: false,
        });
        Ok(())
    }

    /// Runs `steps` steps with faults, then without until everything is delivered and
    /// committed. Returns the first violation.
    pub fn run(&mut self, steps: u64) -> Result<(), Failure> {
        for _ in 0..steps {
            self.step()?;
        }
        self.faults = false;
        self.log.lowered_high = None;
        for fetcher in &mut self.fetchers {
            fetcher.client.faults = false;
        }
        for _ in 0..5000 {
            if self.settled()? {
                return self.final_check();
            }
            self.step()?;
        }
        Err(format!("stalled: {}", self.describe()?))
    }

    fn describe(&self) -> Result<String, Failure> {
        let state = self
            .buffer()?
            .partition_state(&self.topic, 0)
            .map_err(|e| err("state", e))?;
        Ok(format!(
            "log high {} low {}, layout {:?}, state {state:?}, readers next/committed {:?}",
            self.log.high(),
            self.log.low,
            self.layout,
            self.readers
                .iter()
                .map(|r| (r.next, r.committed))
                .collect::<Vec<_>>()
        ))
    }

    fn step(&mut self) -> Result<(), Failure> {
        self.steps += 1;
        self.now += STEP_TIME;
        let faults = self.faults;
        match self.rng.below(100) {
            0..=9 if faults => {
                for _ in 0..self.rng.below(10) {
                    self.log.produce(&mut self.rng);
                }
            }
            10..=11 if faults => {
                // Retention deletes the head (never past what the live lane could reach).
                let high = self.log.high();
                self.log.low = (self.log.low + self.rng.below(30) as i64).min(high);
            }
            12 if faults => {
                self.log.lowered_high = Some(self.log.high() - self.rng.below(10) as i64);
            }
            13 if faults => self.log.lowered_high = None,
            14 if faults && self.rng.chance(300) => self.crash()?,
            15 if faults && self.rng.chance(300) => self.revoke_and_reassign()?,
            16..=59 => {
                let index = self.rng.below(self.fetchers.len() as u64) as usize;
                self.fetch_round(index)?;
            }
            60..=84 => {
                let lane = if self.rng.chance(500) {
                    Lane::Catchup
                } else {
                    Lane::Live
                };
                self.read(lane)?;
            }
            85..=94 => {
                let lane = if self.rng.chance(500) {
                    Lane::Catchup
                } else {
                    Lane::Live
                };
                self.ack(lane);
            }
            _ => self.commit()?,
        }
        if !self.faults {
            // Drain: keep everything moving.
            for index in 0..self.fetchers.len() {
                self.fetch_round(index)?;
            }
            for lane in Lane::ALL {
                self.read(lane)?;
                self.ack_all(lane);
            }
            self.commit()?;
        }
        Ok(())
    }

    /// One poll round of one fetcher, as the adapters run it.
    fn fetch_round(&mut self, index: usize) -> Result<(), Failure> {
        if index >= self.fetchers.len() {
            return Ok(());
        }
        match self.fetch_round_inner(index)? {
            RoundEnd::Keep => {}
            RoundEnd::Remove => {
                self.fetchers.remove(index);
            }
        }
        Ok(())
    }

    fn fetch_round_inner(&mut self, index: usize) -> Result<RoundEnd, Failure> {
        let buffer = self.buffer.as_ref().ok_or("buffer closed")?;
        let now = self.now;
        let fetcher = &mut self.fetchers[index];
        for _ in 0..self.rng.below(40) {
            let polled = match fetcher.client.poll(&self.log, &mut self.rng) {
                None | Some(Polled::Transient) => break,
                Some(Polled::Message(offset)) => LanePolled::Messages(vec![record(offset)]),
                Some(Polled::EndOfPartition) => LanePolled::EndOfPartition,
                Some(Polled::OutOfRange) => LanePolled::OutOfRange,
                Some(Polled::BreaksChain) => LanePolled::BreaksChain,
            };
            let ends_round = matches!(polled, LanePolled::OutOfRange | LanePolled::BreaksChain);
            fetcher.partition.handle_polled(polled);
            if ends_round {
                break;
            }
        }
        if let Some(position) = fetcher.client.position() {
            fetcher.partition.handle_position(position);
        }
        let lane = fetcher.lane;
        let zombie = fetcher.zombie;
        // What was polled first, then (after an out-of-range) what retention deleted, as the
        // watermarks tell the production state machine.
        for step in [Step::Polled, Step::Truncated] {
            let append = match step {
                Step::Polled => fetcher.partition.poll_append(),
                Step::Truncated if fetcher.partition.poll_watermarks(now) => {
                    let watermarks = if self.faults && self.rng.chance(50) {
                        Err("watermarks timed out".to_owned())
                    } else {
                        let high = self.log.high();
                        Ok((
                            self.log.low,
                            self.log.lowered_high.unwrap_or(high).min(high),
                        ))
                    };
                    match fetcher.partition.handle_watermarks(watermarks, now) {
                        AfterOutOfRange::Truncated { append, .. } => {
                            self.truncations += 1;
                            Some(append)
                        }
                        AfterOutOfRange::PastLogEnd { .. } => {
                            self.holds += 1;
                            None
                        }
                        AfterOutOfRange::InsideLog | AfterOutOfRange::Unknown { .. } => None,
                    }
                }
                Step::Truncated => None,
            };
            let Some(append) = append else { continue };
            let result = buffer.append(lane, &self.topic, 0, append.as_fetched());
            match answer(result, zombie, lane)? {
                Some(answer) => fetcher.partition.handle_appended(answer),
                None => return Ok(RoundEnd::Remove),
            }
        }
        if lane == Lane::Catchup && !zombie && fetcher.partition.is_fetched() {
            return Ok(RoundEnd::Remove);
        }
        if let Some(at) = fetcher.partition.poll_move(now) {
            let moved = match lane {
                // The catch-up consumer moves by unassign and assign.
                Lane::Catchup => {
                    fetcher.client.assign(at, &mut self.rng);
                    Ok(())
                }
                // The group member seeks; a seek is refused while the partition is stopped
                // (out of range) and may time out, and the adapter then reassigns it (alone,
                // or with the whole assignment under an eager protocol), which may fail too.
                Lane::Live => {
                    if fetcher.client.seek(at, &mut self.rng) {
                        Ok(())
                    } else if self.rng.chance(700) {
                        fetcher.client.assign(at, &mut self.rng);
                        Ok(())
                    } else {
                        Err("seek and reassign failed".to_owned())
                    }
                }
            };
            // (A failure worth reporting is a log line; retried next round.)
            let _ = fetcher.partition.handle_moved(at, moved);
        }
        Ok(RoundEnd::Keep)
    }

    /// The partition is revoked (after a commit attempt, as the live fetcher does) and
    /// assigned again; the buffer keeps its records for reconciliation to reuse (or, as the
    /// pruning does once they are stale, discards them), and the old fetchers linger as
    /// stale writers for a while.
    fn revoke_and_reassign(&mut self) -> Result<(), Failure> {
        if self.rng.chance(500) {
            self.commit()?;
        }
        let discard = self.rng.chance(500);
        let buffer = self.buffer()?;
        if discard {
            buffer
                .discard_partition(&self.topic, 0)
                .map(|_| ())
                .map_err(|e| err("discard", e))?;
        } else {
            buffer
                .retire_layout(&self.topic, 0)
                .map_err(|e| err("retire", e))?;
        }
        self.fetchers.retain(|f| !f.zombie);
        for fetcher in &mut self.fetchers {
            fetcher.zombie = true;
        }
        self.assign()
    }

    fn read(&mut self, lane: Lane) -> Result<(), Failure> {
        let max = 1 + self.rng.below(50) as usize;
        let reader = &self.readers[lane_index(lane)];
        let batch = self
            .buffer()?
            .read(lane, &self.topic, 0, reader.next, max)
            .map_err(|e| err("read", e))?;
        for record in &batch.records {
            let offset = record.offset;
            if record.payload.as_deref() != Some(payload(offset).as_slice()) {
                return Err(format!(
                    "{lane} delivered a record that is not the log's at {offset}"
                ));
            }
            let reader = &mut self.readers[lane_index(lane)];
            if reader.last_delivered.is_some_and(|last| offset <= last) {
                return Err(format!(
                    "{lane} delivered {offset} after {:?}",
                    reader.last_delivered
                ));
            }
            reader.last_delivered = Some(offset);
            reader.acks.delivered(offset, 1);
            reader.unacked.push(offset);
            self.delivered.insert(offset);
        }
        let reader = &mut self.readers[lane_index(lane)];
        reader.acks.read_through(batch.next);
        reader.next = reader.next.max(batch.next);
        Ok(())
    }

    fn ack(&mut self, lane: Lane) {
        let reader = &mut self.readers[lane_index(lane)];
        if reader.unacked.is_empty() {
            return;
        }
        let index = self.rng.below(reader.unacked.len() as u64) as usize;
        let offset = reader.unacked.swap_remove(index);
        reader.acks.ack(offset);
    }

    fn ack_all(&mut self, lane: Lane) {
        let reader = &mut self.readers[lane_index(lane)];
        for offset in reader.unacked.drain(..) {
            reader.acks.ack(offset);
        }
    }

    /// Commits what the readers processed, as the engine does: the real commit plan, the
    /// main log first, then the side log, then the buffer's cursors — with a crash possible
    /// between the two writes.
    fn commit(&mut self) -> Result<(), Failure> {
        let catchup_processed = self.readers[0].acks.committable();
        let plan = plan_commit(&Progress {
            token: self.token,
            side: self.side_entry.as_ref(),
            layout: &self.layout,
            main_committed: self.main_committed,
            catchup_processed,
            live_processed: self.readers[1].acks.committable(),
        });
        let key = self.side_key();
        let record = |sim: &Self, lane: Lane, offset: i64| -> Result<(), Failure> {
            sim.buffer()?
                .record_committed(lane, &sim.topic, 0, offset)
                .map(|_| ())
                .map_err(|e| err("record_committed", e))
        };
        // The writes in the production order (`CommitPlan::writes`), a crash possible
        // between the main-log and the side-log write.
        let writes = plan.writes(self.token.as_ref());
        if let Some(main) = &writes.main {
            self.write_main(main.offset, main.metadata.clone())?;
            if writes.side != SideWrite::Keep && self.crashes_here() {
                return self.crash();
            }
        }
        match &writes.side {
            SideWrite::Keep => {}
            SideWrite::Write(side) => {
                let token = self.token.ok_or("a side write without a token")?;
                self.write_side(Some(side.seal(&key, &token.secret).into_bytes()))?;
            }
            SideWrite::Tombstone => self.write_side(None)?,
        }
        // What the engine records once Kafka holds the writes (`Shared::commit_applied`).
        match plan {
            CommitPlan::Nothing => {}
            CommitPlan::Plain { offset } => {
                self.main_committed = offset;
                record(self, Lane::Live, offset)?;
            }
            CommitPlan::Split { main, side } => {
                if let Some(main) = main {
                    self.main_committed = main;
                    record(self, Lane::Catchup, main)?;
                }
                if let Some(side) = side {
                    record(self, Lane::Live, side.live_next)?;
                    self.side_entry = Some(side);
                }
            }
            CommitPlan::Merge { offset } => {
                self.merges += 1;
                self.main_committed = offset;
                self.token = None;
                self.side_entry = None;
                record(self, Lane::Catchup, catchup_processed)?;
                record(self, Lane::Live, offset)?;
            }
        }
        Ok(())
    }

    /// Kafka claims every offset of the log processed.
    fn settled(&mut self) -> Result<bool, Failure> {
        let decision = self.decide(None);
        Ok(decision.layout.catchup_ranges.is_empty()
            && decision.layout.live_from >= self.log.high())
    }

    /// Once settled, every record of the log at or after the start is delivered.
    fn final_check(&self) -> Result<(), Failure> {
        for offset in self.start..self.log.high() {
            if self.log.is_record(offset) && !self.delivered.contains(&offset) {
                return Err(format!("LOSS: record {offset} was never delivered"));
            }
        }
        Ok(())
    }
}

/// What one seed ran through.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u64,
    pub splits: u64,
    pub multi_range: u64,
    pub merges: u64,
    pub truncations: u64,
    pub holds: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, other: Self) {
        self.steps += other.steps;
        self.splits += other.splits;
        self.multi_range += other.multi_range;
        self.merges += other.merges;
        self.truncations += other.truncations;
        self.holds += other.holds;
    }
}

/// Runs one seed in `dir`, reusing `buffer` if given; returns the buffer for the next seed.
pub fn run_seed(
    seed: u64,
    dir: PathBuf,
    buffer: Option<Buffer>,
) -> (Result<Stats, Failure>, Option<Buffer>) {
    run_choices(seed, &[], 200..1000, dir, buffer)
}

/// Runs the history a fuzzer's input describes: its first eight bytes are the seed, the rest
/// the choices, with a short history (20 to 120 faulty steps). The fuzz target and the
/// replay of its corpus run exactly this.
pub fn run_input(
    input: &[u8],
    dir: PathBuf,
    buffer: Option<Buffer>,
) -> (Result<Stats, Failure>, Option<Buffer>) {
    let mut seed = [0u8; 8];
    let len = input.len().min(8);
    seed[..len].copy_from_slice(&input[..len]);
    let seed = u64::from_le_bytes(seed);
    run_choices(seed, &input[len..], 20..120, dir, buffer)
}

/// Runs a history whose choices come from `choices` first, then `seed`, with a number of
/// faulty steps in `steps` (then it drains); returns the buffer for the next run, without
/// this run's partition.
pub fn run_choices(
    seed: u64,
    choices: &[u8],
    steps: std::ops::Range<u64>,
    dir: PathBuf,
    buffer: Option<Buffer>,
) -> (Result<Stats, Failure>, Option<Buffer>) {
    let mut sim = match Sim::with_choices(seed, choices, dir, buffer) {
        Ok(sim) => sim,
        Err(failure) => return (Err(failure), None),
    };
    let steps = steps.start + sim.rng.below(steps.end.saturating_sub(steps.start));
    let result = sim.run(steps).map(|()| Stats {
        steps: sim.steps,
        splits: sim.splits,
        multi_range: sim.multi_range,
        merges: sim.merges,
        truncations: sim.truncations,
        holds: sim.holds,
    });
    let buffer = sim.into_buffer();
    (result, buffer)
}
