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
            if let Some(last) = self.lanes[index(lane)].pending.back() {
                state.lane_mut(lane).fetched_next = last.fetched_next;
            }
        }
        state
    }

    /// Bytes held in memory, both lanes.
    pub fn bytes(&self) -> u64 {
        self.lanes.iter().map(|lane| lane.bytes).sum()
    }

    /// Keeps an append in memory.
    pub fn push(&mut self, lane: Lane, pending: Pending) {
        let lane = &mut self.lanes[index(lane)];
        lane.bytes += pending.bytes;
        lane.pending.push_back(pending);
    }

    /// Takes `lane`'s oldest append out of memory (to be spilled).
    pub fn pop_oldest(&mut self, lane: Lane) -> Option<Pending> {
        let lane = &mut self.lanes[index(lane)];
        let pending = lane.pending.pop_front()?;
        lane.bytes -= pending.bytes;
        Some(pending)
    }

    /// Takes `lane`'s newest append back out (an append whose write-through failed).
    pub fn pop_newest(&mut self, lane: Lane) -> Option<Pending> {
        let lane = &mut self.lanes[index(lane)];
        let pending = lane.pending.pop_back()?;
        lane.bytes -= pending.bytes;
        Some(pending)
    }

    /// Puts appends taken by [`pop_oldest`](Self::pop_oldest) back, oldest first (their
    /// spill failed).
    pub fn restore_oldest(&mut self, lane: Lane, taken: Vec<Pending>) {
        let lane = &mut self.lanes[index(lane)];
        for pending in taken.into_iter().rev() {
            lane.bytes += pending.bytes;
            lane.pending.push_front(pending);
        }
    }

    /// Drops what of `lane` lies below `committed` (normalized, at most the lane's logical
    /// `fetched_next`): Kafka holds those offsets, so they are never written. Whole appends
    /// go; one that `committed` cuts keeps its records from `committed` on and starts there
    /// (what it proved of the offsets above still holds). Returns the bytes dropped. Sled's
    /// state then moves its `fetched_next` up to `committed` if it was below: it holds
    /// nothing anyone will read down there, and memory chains on from `committed`.
    pub fn drop_committed(&mut self, lane: Lane, committed: i64) -> u64 {
        let tail = &mut self.lanes[index(lane)];
        let mut dropped = 0;
        while let Some(front) = tail.pending.front_mut() {
            if front.fetched_next <= committed {
                dropped += front.bytes;
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
            }
            break;
        }
        tail.bytes -= dropped;
        dropped
    }

    /// `lane`'s records in memory from offset `from` on (normalized, at or past sled's end),
    /// whole appends at a time, until at least `max_records`; with the position the next read
    /// continues from. `None` when memory does not hold `from` (a spill moved it to sled
    /// meanwhile: read sled again).
    pub fn read(&self, lane: Lane, from: i64, max_records: usize) -> Option<(Vec<Record>, i64)> {
        let mut records = Vec::new();
        let mut next = from;
        for pending in &self.lanes[index(lane)].pending {
            if pending.fetched_next <= next {
                continue;
            }
            if pending.first > next {
                // Appends chain from sled's end: a gap means `from` is not in memory.
                return (next > from).then_some((records, next));
            }
            let skip = pending.records.partition_point(|r| r.offset < from);
            records.extend(pending.records[skip..].iter().cloned());
            next = pending.fetched_next;
            if records.len() >= max_records {
                break;
            }
        }
        Some((records, next))
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
        let offsets = |read: Option<(Vec<Record>, i64)>| {
            read.map(|(records, next)| (records.iter().map(|r| r.offset).collect::<Vec<_>>(), next))
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
        assert_eq!(tail.drop_committed(Lane::Live, 110), 0);
        // 111 cuts the first append: 110 goes, 112 stays, and it starts at 111.
        assert_eq!(tail.drop_committed(Lane::Live, 111), each());
        let front = &tail.lanes[1].pending[0];
        assert_eq!(
            (front.first, front.records.len(), front.bytes),
            (111, 1, each() + overhead())
        );
        assert_eq!(tail.drop_committed(Lane::Live, 117), each() + overhead());
        assert_eq!(tail.counts(Lane::Live), (1, each() + overhead()));
        assert_eq!(tail.lanes[1].pending[0].first, 117);
        assert_eq!(tail.drop_committed(Lane::Live, 120), each() + overhead());
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
}
