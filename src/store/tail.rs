//! The memory tier: appends the buffer has proven (invariant 8) but not written to sled yet.
//!
//! Most records are read soon after they are fetched, and most are committed soon after
//! they are read: writing each one to sled, reading it back and decoding it is the whole cost
//! of the buffer when nothing waits. So an append that passes the buffer's proofs is kept
//! here, in the order it came, exactly as the chunks it would have written; the reader takes
//! records from it, a commit drops what it covers without it ever reaching the disk, and only
//! what waits beyond the memory the buffer may use is *spilled*: written to sled, oldest
//! first, as the append would have written it.
//!
//! What a reader took out of memory and the application has not committed yet is about to go:
//! it counts against the allowance only up to a second allowance of its own ([`must_spill`]).
//! Counted with what waits, a reader a few batches ahead of its commits made the tier spill
//! the very records that were being committed, and read back nothing of them.
//!
//! sled holds a prefix of each lane, the memory the rest: a lane's appends in memory start
//! where its chunks in sled end (`persisted`'s `fetched_next`) and chain on without a gap. The
//! state in sled describes only what sled holds, so a crash loses the memory and nothing
//! else — those records are fetched again from Kafka, which still has them. The state the
//! buffer proves to its writers and readers (`logical`) is sled's with each lane fetched up to
//! its last append in memory.

use std::collections::VecDeque;

use super::{Lane, PartitionState, Record};

/// One append held in memory: the chunk it would have written.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// First offset covered: the lane's `fetched_next` before the append.
    pub first: i64,
    /// One past the last offset covered, as a chunk records it.
    pub next: i64,
    /// The lane's `fetched_next` after the append (`next`, moved to the next catch-up range
    /// when it ends one).
    pub fetched_next: i64,
    /// The records, by increasing offset, all inside `[first, next)`.
    pub records: Vec<Record>,
    /// What the records take in memory ([`cost`]): what the allowance counts.
    pub bytes: u64,
    /// A reader took its records (they wait for their commit, not for a reader).
    pub taken: bool,
}

/// What an append of `records` takes in memory: its records and the append itself (never 0,
/// so that an append proving a gap with no record is spilled and flushed like any other).
pub(super) fn append_cost(records: &[Record]) -> u64 {
    std::mem::size_of::<Pending>() as u64 + records.iter().map(cost).sum::<u64>()
}

/// What `record` takes in memory: its key, payload and header bytes, the record itself, and
/// an allocator's due for each buffer it owns — 100-byte records take about twice their
/// payload, and the allowance bounds the memory, not the payload.
pub(super) fn cost(record: &Record) -> u64 {
    let buffers = 1 + record.headers.len() * 2;
    (record.payload_bytes() + std::mem::size_of::<Record>() + 16 * buffers) as u64
}

/// One lane's appends in memory, oldest first.
#[derive(Debug, Clone, Default)]
pub(super) struct LaneTail {
    pub pending: VecDeque<Pending>,
    /// Sum of the appends' `bytes`.
    pub bytes: u64,
    /// Sum of the taken appends' `bytes`.
    pub taken: u64,
}

impl LaneTail {
    /// Bytes no reader took yet: what waits.
    fn untaken(&self) -> u64 {
        self.bytes - self.taken
    }
}

/// Whether the tier, holding `held` bytes of which readers took `taken`, must spill under an
/// allowance of `allowed`: when what waits is above the allowance, or everything is above
/// twice of it. Taken records leave at their commit (a commit is due every 32nd of the budget,
/// and the allowance is a quarter of it), so the second allowance is reached only when
/// commits stall.
pub(super) fn must_spill(held: u64, taken: u64, allowed: u64) -> bool {
    held.saturating_sub(taken) > allowed || held > allowed.saturating_mul(2)
}

/// Whether a spill went far enough: a quarter of each bound is free again (a spill per
/// append at the bound would write small chunks).
pub(super) fn spilled_enough(held: u64, taken: u64, allowed: u64) -> bool {
    held.saturating_sub(taken) <= allowed / 4 * 3 && held <= allowed / 4 * 3 * 2
}

/// What the buffer holds of one partition beyond sled, with sled's state of it.
#[derive(Debug, Clone)]
pub(super) struct Tail {
    /// The partition's state as sled holds it (kept equal to it by every write).
    pub persisted: PartitionState,
    /// Catch-up lane, then live lane.
    pub lanes: [LaneTail; 2],
}

/// The index of `lane` in per-lane arrays.
pub(super) fn index(lane: Lane) -> usize {
    match lane {
        Lane::Catchup => 0,
        Lane::Live => 1,
    }
}

impl Tail {
    /// A partition with nothing in memory, whose state in sled is `persisted`.
    pub fn new(persisted: PartitionState) -> Self {
        Self {
            persisted,
            lanes: Default::default(),
        }
    }

    /// The state the buffer proves: sled's, each lane fetched up to its last append in
    /// memory.
    pub fn logical(&self) -> PartitionState {
        let mut state = self.persisted.clone();
        for lane in Lane::ALL {
            state.lane_mut(lane).fetched_next = self.fetched_next(lane);
        }
        state
    }

    /// Where `lane` is fetched up to, memory included (as in [`logical`](Self::logical)).
    pub fn fetched_next(&self, lane: Lane) -> i64 {
        self.lanes[index(lane)]
            .pending
            .back()
            .map_or(self.persisted.lane(lane).fetched_next, |last| {
                last.fetched_next
            })
    }

    /// Bytes held in memory, both lanes.
    pub fn bytes(&self) -> u64 {
        self.lanes.iter().map(|lane| lane.bytes).sum()
    }

    /// Bytes held in memory that a reader took, both lanes.
    pub fn taken_bytes(&self) -> u64 {
        self.lanes.iter().map(|lane| lane.taken).sum()
    }

    /// Bytes of `lane` that no reader took.
    pub fn untaken(&self, lane: Lane) -> u64 {
        self.lanes[index(lane)].untaken()
    }

    /// Keeps an append in memory.
    pub fn push(&mut self, lane: Lane, pending: Pending) {
        let lane = &mut self.lanes[index(lane)];
        lane.bytes += pending.bytes;
        lane.pending.push_back(pending);
    }

    /// The bytes of `lane`'s oldest append in memory, if any.
    pub fn oldest_bytes(&self, lane: Lane) -> Option<u64> {
        self.lanes[index(lane)]
            .pending
            .front()
            .map(|pending| pending.bytes)
    }

    /// Takes `lane`'s oldest append out of memory (to be spilled).
    pub fn pop_oldest(&mut self, lane: Lane) -> Option<Pending> {
        let lane = &mut self.lanes[index(lane)];
        let pending = lane.pending.pop_front()?;
        lane.bytes -= pending.bytes;
        if pending.taken {
            lane.taken -= pending.bytes;
        }
        Some(pending)
    }

    /// Takes `lane`'s newest append back out (an append whose write-through failed).
    pub fn pop_newest(&mut self, lane: Lane) -> Option<Pending> {
        let lane = &mut self.lanes[index(lane)];
        let pending = lane.pending.pop_back()?;
        lane.bytes -= pending.bytes;
        if pending.taken {
            lane.taken -= pending.bytes;
        }
        Some(pending)
    }

    /// Puts appends taken by [`pop_oldest`](Self::pop_oldest) back, oldest first (their
    /// spill failed).
    pub fn restore_oldest(&mut self, lane: Lane, popped: Vec<Pending>) {
        let lane = &mut self.lanes[index(lane)];
        for pending in popped.into_iter().rev() {
            lane.bytes += pending.bytes;
            if pending.taken {
                lane.taken += pending.bytes;
            }
            lane.pending.push_front(pending);
        }
    }

    /// Drops what of `lane` lies below `committed` (normalized, at most the lane's logical
    /// `fetched_next`): Kafka holds those offsets, so they are never written. Whole appends
    /// go; one that `committed` cuts keeps its records from `committed` on and starts there
    /// (what it proved of the offsets above still holds). Returns the bytes dropped. Sled's
    /// state then moves its `fetched_next` up to `committed` if it was below: it holds
    /// nothing anyone will read down there, and memory chains on from `committed`.
    /// Returns the bytes dropped, and of them those a reader had taken.
    pub fn drop_committed(&mut self, lane: Lane, committed: i64) -> (u64, u64) {
        let tail = &mut self.lanes[index(lane)];
        let (mut dropped, mut dropped_taken) = (0, 0);
        while let Some(front) = tail.pending.front_mut() {
            if front.fetched_next <= committed {
                dropped += front.bytes;
                if front.taken {
                    dropped_taken += front.bytes;
                }
                tail.pending.pop_front();
                continue;
            }
            if front.first < committed {
                let cut = front.records.partition_point(|r| r.offset < committed);
                let cut_bytes: u64 = front.records[..cut].iter().map(cost).sum();
                front.records.drain(..cut);
                front.first = committed;
                front.bytes -= cut_bytes;
                dropped += cut_bytes;
                if front.taken {
                    dropped_taken += cut_bytes;
                }
            }
            break;
        }
        tail.bytes -= dropped;
        tail.taken -= dropped_taken;
        (dropped, dropped_taken)
    }

    /// `lane`'s records in memory from offset `from` on (normalized, at or past sled's end),
    /// at most `max_records`; with the position the next read continues from (the offset of
    /// the first record left out, when a read stops inside an append). `None` when memory does
    /// not hold `from` (a spill moved it to sled meanwhile: read sled again). The appends read
    /// are taken, one read in part too: the third value is the bytes this read took that no
    /// read took before.
    ///
    /// (Reads took whole appends, up to a poll round of one partition, 2,000 records: a reader
    /// that asked for 128 held a thousand records of a busy partition, and a quiet
    /// partition's fresh record waited behind them half a second in `tests/read_ahead.rs`.)
    pub fn read(
        &mut self,
        lane: Lane,
        from: i64,
        max_records: usize,
    ) -> Option<(Vec<Record>, i64, u64)> {
        let tail = &mut self.lanes[index(lane)];
        let mut records = Vec::new();
        let mut next = from;
        let mut newly_taken = 0;
        for pending in &mut tail.pending {
            if pending.fetched_next <= next {
                continue;
            }
            if pending.first > next {
                // Appends chain from sled's end: a gap means `from` is not in memory.
                if next == from {
                    return None;
                }
                break;
            }
            let skip = pending.records.partition_point(|r| r.offset < from);
            let left = &pending.records[skip..];
            let read = left.len().min(max_records.saturating_sub(records.len()));
            records.extend(left[..read].iter().cloned());
            next = left
                .get(read)
                .map_or(pending.fetched_next, |record| record.offset);
            if !pending.taken {
                pending.taken = true;
                newly_taken += pending.bytes;
            }
            if records.len() >= max_records {
                break;
            }
        }
        tail.taken += newly_taken;
        Some((records, next, newly_taken))
    }

    /// Records and bytes of `lane` in memory.
    pub fn counts(&self, lane: Lane) -> (u64, u64) {
        let tail = &self.lanes[index(lane)];
        let records = tail.pending.iter().map(|p| p.records.len() as u64).sum();
        (records, tail.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{OffsetRange, PartitionLayout, Timestamp};

    fn record(offset: i64) -> Record {
        Record {
            offset,
            timestamp: Timestamp::NotAvailable,
            key: None,
            payload: Some(vec![0; 10].into()),
            headers: Vec::new(),
        }
    }

    fn pending(first: i64, offsets: &[i64], next: i64) -> Pending {
        let records: Vec<Record> = offsets.iter().map(|&o| record(o)).collect();
        Pending {
            first,
            next,
            fetched_next: next,
            bytes: append_cost(&records),
            records,
            taken: false,
        }
    }

    /// What one of the tests' records costs.
    fn each() -> u64 {
        cost(&record(0))
    }

    /// What an append of the tests' costs beyond its records.
    fn overhead() -> u64 {
        append_cost(&[])
    }

    fn tail() -> Tail {
        let mut state = PartitionState::new(PartitionLayout {
            epoch: 1,
            catchup_ranges: vec![OffsetRange::new(0, 100)],
            live_from: 100,
        });
        state.live.fetched_next = 110;
        state.live.committed_next = 100;
        Tail::new(state)
    }

    #[test]
    fn the_logical_state_ends_at_the_last_append_in_memory() {
        let mut tail = tail();
        assert_eq!(tail.logical().live.fetched_next, 110);
        tail.push(Lane::Live, pending(110, &[110, 112], 115));
        tail.push(Lane::Live, pending(115, &[119], 120));
        assert_eq!(tail.logical().live.fetched_next, 120);
        assert_eq!(
            tail.persisted.live.fetched_next, 110,
            "sled's state unchanged"
        );
        assert_eq!(tail.bytes(), 3 * each() + 2 * overhead());
    }

    #[test]
    fn reads_chain_from_sleds_end_and_stop_at_a_gap() {
        let mut tail = tail();
        tail.push(Lane::Live, pending(110, &[110, 112], 115));
        tail.push(Lane::Live, pending(115, &[119], 120));
        let offsets = |read: Option<(Vec<Record>, i64, u64)>| {
            read.map(|(records, next, _)| {
                (records.iter().map(|r| r.offset).collect::<Vec<_>>(), next)
            })
        };
        assert_eq!(
            offsets(tail.read(Lane::Live, 110, 10)),
            Some((vec![110, 112, 119], 120))
        );
        assert_eq!(
            offsets(tail.read(Lane::Live, 111, 1)),
            Some((vec![112], 115))
        );
        assert_eq!(offsets(tail.read(Lane::Live, 120, 10)), Some((vec![], 120)));
        // A read stops inside an append at its most: the next goes on from the record left.
        assert_eq!(
            offsets(tail.read(Lane::Live, 110, 1)),
            Some((vec![110], 112))
        );
        assert_eq!(
            offsets(tail.read(Lane::Live, 112, 2)),
            Some((vec![112, 119], 120))
        );
        // The oldest append was spilled meanwhile: 110 is not in memory any more.
        let spilled = tail.pop_oldest(Lane::Live);
        assert!(spilled.is_some());
        assert_eq!(offsets(tail.read(Lane::Live, 110, 10)), None);
        assert_eq!(
            offsets(tail.read(Lane::Live, 116, 10)),
            Some((vec![119], 120))
        );
    }

    #[test]
    fn a_commit_drops_what_it_covers_and_cuts_the_append_it_falls_in() {
        let mut tail = tail();
        tail.push(Lane::Live, pending(110, &[110, 112], 115));
        tail.push(Lane::Live, pending(115, &[119], 120));
        assert_eq!(tail.drop_committed(Lane::Live, 110), (0, 0));
        // 111 cuts the first append: 110 goes, 112 stays, and it starts at 111.
        assert_eq!(tail.drop_committed(Lane::Live, 111), (each(), 0));
        let front = &tail.lanes[1].pending[0];
        assert_eq!(
            (front.first, front.records.len(), front.bytes),
            (111, 1, each() + overhead())
        );
        assert_eq!(
            tail.drop_committed(Lane::Live, 117),
            (each() + overhead(), 0)
        );
        assert_eq!(tail.counts(Lane::Live), (1, each() + overhead()));
        assert_eq!(tail.lanes[1].pending[0].first, 117);
        assert_eq!(
            tail.drop_committed(Lane::Live, 120),
            (each() + overhead(), 0)
        );
        assert_eq!(tail.counts(Lane::Live), (0, 0));
    }

    #[test]
    fn a_failed_spill_puts_the_appends_back_in_order() {
        let mut tail = tail();
        tail.push(Lane::Live, pending(110, &[110], 115));
        tail.push(Lane::Live, pending(115, &[119], 120));
        let taken: Vec<Pending> = std::iter::from_fn(|| tail.pop_oldest(Lane::Live)).collect();
        assert_eq!(tail.bytes(), 0);
        tail.restore_oldest(Lane::Live, taken);
        let firsts: Vec<i64> = tail.lanes[1].pending.iter().map(|p| p.first).collect();
        assert_eq!(firsts, [110, 115]);
        assert_eq!(tail.bytes(), 2 * (each() + overhead()));
    }

    #[test]
    fn what_a_reader_took_is_counted_until_it_leaves() {
        let mut tail = tail();
        tail.push(Lane::Live, pending(110, &[110, 112], 115));
        tail.push(Lane::Live, pending(115, &[119], 120));
        let first = 2 * each() + overhead();
        let second = each() + overhead();
        // A read takes the appends it reads any of whole, and each only once.
        assert_eq!(tail.read(Lane::Live, 111, 1).map(|r| r.2), Some(first));
        assert_eq!(tail.read(Lane::Live, 110, 1).map(|r| r.2), Some(0));
        assert_eq!(
            (tail.taken_bytes(), tail.untaken(Lane::Live)),
            (first, second)
        );
        // A commit cutting a taken append drops taken bytes.
        assert_eq!(tail.drop_committed(Lane::Live, 111), (each(), each()));
        assert_eq!(tail.taken_bytes(), first - each());
        // A spill of a taken append, put back when it failed.
        let popped = tail.pop_oldest(Lane::Live).into_iter().collect::<Vec<_>>();
        assert_eq!(tail.taken_bytes(), 0);
        tail.restore_oldest(Lane::Live, popped);
        assert_eq!(tail.taken_bytes(), first - each());
        assert_eq!(tail.read(Lane::Live, 115, 10).map(|r| r.2), Some(second));
        assert_eq!(tail.untaken(Lane::Live), 0);
        assert_eq!(
            tail.drop_committed(Lane::Live, 120),
            (first - each() + second, first - each() + second)
        );
        assert_eq!((tail.bytes(), tail.taken_bytes()), (0, 0));
    }

    #[test]
    fn the_tier_spills_for_what_waits_and_for_everything_only_at_twice_its_allowance() {
        // (held, taken, allowed) → must spill, spilled enough
        let table = [
            ((100, 0, 100), (false, false)),
            ((101, 0, 100), (true, false)),
            ((75, 0, 100), (false, true)),
            // What readers took waits for its commit: up to a second allowance.
            ((180, 90, 100), (false, false)),
            ((200, 150, 100), (false, false)),
            ((201, 150, 100), (true, false)),
            ((150, 100, 100), (false, true)),
            ((151, 100, 100), (false, false)),
            ((190, 80, 100), (true, false)),
            // Counters read apart may cross for a moment.
            ((10, 20, 100), (false, true)),
        ];
        for ((held, taken, allowed), (spill, enough)) in table {
            assert_eq!(
                (
                    must_spill(held, taken, allowed),
                    spilled_enough(held, taken, allowed)
                ),
                (spill, enough),
                "held {held}, taken {taken}, allowed {allowed}"
            );
        }
    }
}
