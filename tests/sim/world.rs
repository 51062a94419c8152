//! The simulated world the consumer runs in: the choices that drive a history, one
//! partition's log as the broker holds it, and a client's view of one partition as
//! librdkafka keeps it (positions, resets, ends of partition, errors).

use catchup::store::{Record, Timestamp};

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
pub(super) enum Entry {
    Record,
    Compacted,
    Marker,
}

/// The partition's log as the broker holds it.
pub(super) struct Log {
    pub(super) entries: Vec<Entry>,
    /// Retention deleted everything below.
    pub(super) low: i64,
    /// A new leader briefly reports a lower high watermark.
    pub(super) lowered_high: Option<i64>,
}

impl Log {
    pub(super) fn high(&self) -> i64 {
        self.entries.len() as i64
    }

    /// The high watermark the leader reports (a new one may report a lower one for a while).
    pub(super) fn reported_high(&self) -> i64 {
        self.lowered_high.unwrap_or(self.high()).min(self.high())
    }

    pub(super) fn produce(&mut self, rng: &mut Rng) {
        let entry = match rng.below(20) {
            0 => Entry::Marker,
            _ => Entry::Record,
        };
        self.entries.push(entry);
    }

    pub(super) fn is_record(&self, offset: i64) -> bool {
        offset >= self.low && self.entries.get(offset as usize) == Some(&Entry::Record)
    }
}

pub(super) fn payload(offset: i64) -> Vec<u8> {
    offset.to_be_bytes().to_vec()
}

/// The key of the record at `offset`: one of ten, skewed (the first half the time, the next
/// a quarter, ...), or none for one record in sixteen.
pub(super) fn key_of(offset: i64) -> Option<Vec<u8>> {
    let mut z = (offset as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z ^= z >> 29;
    z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^= z >> 32;
    (z % 16 != 0).then(|| format!("k{}", (z >> 8).trailing_zeros().min(9)).into_bytes())
}

pub(super) fn record(offset: i64) -> Record {
    Record {
        offset,
        timestamp: Timestamp::NotAvailable,
        key: key_of(offset).map(Into::into),
        payload: Some(payload(offset).into()),
        headers: Vec::new(),
    }
}

/// What a simulated `poll` returns.
pub(super) enum Polled {
    Message(i64),
    /// At the offset the fetch stood at.
    EndOfPartition(i64),
    Transient,
    OutOfRange,
    BreaksChain,
}

/// A consumer's view of the partition, as librdkafka keeps it.
#[derive(Debug)]
pub(super) struct Client {
    /// `None`: not fetching (stopped by an out-of-range error).
    pub(super) fetch_pos: Option<i64>,
    /// The application position: past the last message handed out (or marker passed).
    pub(super) app_pos: Option<i64>,
    /// After a reassign the old position is still reported for a few calls (the reset runs on
    /// another thread).
    pub(super) stale: Option<(i64, u32)>,
    /// The end of partition already reported at this offset.
    pub(super) eof_at: Option<i64>,
    pub(super) faults: bool,
    /// Taken from in runs, as the catch-up consumer takes its partition queues: librdkafka's
    /// batch call moves the application position one past every entry it hands out, an end
    /// of partition or an error included (librdkafka issue 4844).
    pub(super) runs: bool,
    /// The high watermark this client is told, when it lags the log's (a client taken in
    /// runs, after a spurious end of partition: a new leader, or a follower it fetches from,
    /// behind); it rises one offset a poll until it has caught up.
    pub(super) told_high: Option<i64>,
    /// Paused by the application (the byte budget, the free-space floor): it hands out
    /// nothing, and librdkafka drops what it prefetched.
    pub(super) paused: bool,
    /// Ends of partition are handed out (`enable.partition.eof`: the catch-up consumer's,
    /// and the group member's where the user enables them); otherwise an end moves nothing.
    pub(super) partition_eof: bool,
}

impl Client {
    pub(super) fn new(at: i64, faults: bool) -> Self {
        Self {
            fetch_pos: Some(at),
            app_pos: None,
            stale: None,
            eof_at: None,
            faults,
            runs: false,
            told_high: None,
            paused: false,
            partition_eof: true,
        }
    }

    /// A consumer that has not been assigned the partition yet (it fetches nothing).
    pub(super) fn unassigned(faults: bool) -> Self {
        Self {
            fetch_pos: None,
            app_pos: None,
            stale: None,
            eof_at: None,
            faults,
            runs: false,
            told_high: None,
            paused: false,
            partition_eof: true,
        }
    }

    pub(super) fn assign(&mut self, at: i64, rng: &mut Rng) {
        if let Some(old) = self.app_pos {
            if rng.chance(500) {
                self.stale = Some((old, 1 + rng.below(3) as u32));
            }
        }
        self.fetch_pos = Some(at);
        self.app_pos = None;
        self.eof_at = None;
    }

    /// librdkafka's unassign: the partition fetches nothing until it is assigned again (a
    /// pause is kept). The position it last had may still be reported meanwhile.
    pub(super) fn unassign(&mut self) {
        self.fetch_pos = None;
        self.eof_at = None;
    }

    /// librdkafka's seek: refused unless the partition is fetching; moves the fetch and the
    /// application position at once (the old fetch's messages are dropped by version).
    pub(super) fn seek(&mut self, at: i64, rng: &mut Rng) -> bool {
        if self.fetch_pos.is_none() || (self.faults && rng.chance(100)) {
            return false;
        }
        self.fetch_pos = Some(at);
        self.app_pos = Some(at);
        self.stale = None;
        self.eof_at = None;
        true
    }

    pub(super) fn position(&mut self) -> Option<i64> {
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

    /// librdkafka's pause and resume: a resumed partition fetches again from the application
    /// position (what was prefetched before the pause is gone); one stopped out of range
    /// stays stopped. An assignment keeps the pause.
    pub(super) fn set_paused(&mut self, paused: bool) {
        if self.paused && !paused && self.fetch_pos.is_some() {
            if let Some(at) = self.app_pos {
                self.fetch_pos = Some(at);
                self.eof_at = None;
            }
        }
        self.paused = paused;
    }

    /// The same client, taken from in runs.
    pub(super) fn taking_runs(self) -> Self {
        Self { runs: true, ..self }
    }

    /// The same client, handing out no end of partition, as the group member unless the
    /// user enables them (`enable.partition.eof`): taken in runs, an end moves no position,
    /// and nothing shows that an assignment's reset of the position has run.
    pub(super) fn without_partition_eof(self) -> Self {
        Self {
            partition_eof: false,
            ..self
        }
    }

    /// Polls once: what came, and the offset the entry names when it is an error taken in a
    /// run from the partition's own queue (the batch call moved the position one past it).
    /// A client taken in runs has its errors from that queue, but for one in two hundred
    /// from its main queue, which names no partition and moves nothing; an end of partition
    /// is always its partition's.
    pub(super) fn poll(&mut self, log: &Log, rng: &mut Rng) -> Option<(Polled, Option<i64>)> {
        if self.paused {
            return None;
        }
        // Tried more often while the batch call's position stands past the fetch (after an
        // end of partition): where a resume can pass an offset never fetched.
        let past_fetch = self.app_pos > self.fetch_pos;
        let pause_odds = if past_fetch { 2 } else { 8 };
        if self.runs && self.faults && self.fetch_pos.is_some() && rng.chance(pause_odds) {
            // Paused and resumed (the byte budget holding its queue): librdkafka resumes the
            // fetch at the application position, which the batch call may have moved.
            if let Some(at) = self.app_pos {
                self.fetch_pos = Some(at);
                self.eof_at = None;
            }
        }
        if let Some(told) = self.told_high {
            self.told_high = Some(told + 1).filter(|&risen| risen < log.high());
        }
        let fetching_at = self.fetch_pos;
        let polled = self.poll_inner(log, rng);
        let named = match (&polled, self.runs) {
            (_, false) | (None | Some(Polled::Message(_)), true) => None,
            (Some(Polled::EndOfPartition(at)), true) => Some(*at).filter(|_| self.partition_eof),
            (Some(_), true) => fetching_at.filter(|_| !rng.chance(200)),
        };
        if let Some(at) = named {
            self.hand_out(at + 1);
        }
        let handed_out = match polled {
            Some(Polled::Message(_)) => true,
            Some(Polled::EndOfPartition(_)) => self.partition_eof,
            _ => false,
        };
        if handed_out {
            // librdkafka resets the position when the old fetch stops, on the partition's op
            // queue, before the new fetch starts: anything the new assignment hands out comes
            // after the reset.
            self.stale = None;
        }
        polled.map(|polled| (polled, named))
    }

    /// Moves the application position past an entry handed out: one at a time, to it
    /// (`rd_kafka_fetch_op_app_prepare`); in runs, only forward (`rd_kafka_q_serve_rkmessages`
    /// takes the highest of the run's entries, an end of partition or an error included).
    fn hand_out(&mut self, next: i64) {
        self.app_pos = Some(match self.app_pos {
            Some(pos) if self.runs => pos.max(next),
            _ => next,
        });
    }

    pub(super) fn poll_inner(&mut self, log: &Log, rng: &mut Rng) -> Option<Polled> {
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
                // Spurious, e.g. a lowered watermark.
                if self.runs {
                    self.told_high = Some(pos);
                }
                return Some(Polled::EndOfPartition(pos));
            }
        }
        loop {
            if pos < log.low {
                self.fetch_pos = None;
                return Some(Polled::OutOfRange);
            }
            let high = log.reported_high();
            let high = self.told_high.map_or(high, |told| told.min(high));
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
                    return Some(Polled::EndOfPartition(pos));
                }
                return None;
            }
            match log.entries[pos as usize] {
                Entry::Record => {
                    self.fetch_pos = Some(pos + 1);
                    self.hand_out(pos + 1);
                    return Some(Polled::Message(pos));
                }
                Entry::Compacted => pos += 1,
                Entry::Marker => {
                    pos += 1;
                    self.hand_out(pos);
                }
            }
        }
    }
}
