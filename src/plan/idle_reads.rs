//! Which of a partition's reads the reader may leave out of a fill: one that reached the end
//! of what the buffer proved finds nothing again until what it reads is appended to (its
//! lane, or either lane for the one order of `Ordered` and `Off`: [`ReadSlot`]).
//!
//! A fill visits every assigned partition. With many partitions and the reader at the tail,
//! nearly all of them hold nothing new, and a fill cost a read of each (a lookup, the
//! shard's lock, the state, the partitions' lock) to hand out the few records of the one
//! that was appended: with 64 partitions the reader spent more than the group member's
//! thread. The fetchers report every append the buffer took (with records or not) under the
//! partitions' lock, and the buffer says whether a read reached the end it proved
//! (`ReadBatch::exhausted`, seen under the lock appends take), so a read that reached it
//! before the last report finds nothing again.
//!
//! What changes a partition's buffer other than an append (a new layout, a discard) gives it
//! a new runtime, whose reads start afresh. As a safety net a read left out for
//! [`SWEEP_EVERY`] is made again: a change that came without a report costs a delay, never
//! a stall.

use std::time::{Duration, Instant};

use crate::store::Lane;

/// How long a read is left out at most (an hour with the `strict-reads` feature, for the
/// tests: a missing report then stalls them).
pub const SWEEP_EVERY: Duration = if cfg!(feature = "strict-reads") {
    Duration::from_secs(3600)
} else {
    Duration::from_millis(100)
};

/// The appends reported for one partition, per lane (catch-up, live): what a read started
/// at some moment is answered with.
pub type AppendCounts = [u64; 2];

/// What one read of a partition follows: the one order across both lanes (`Ordered`,
/// `Off`), or one lane (`Concurrent`, `Latest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSlot {
    /// The catch-up lane, then the live lane: found more after an append to either.
    Ordered,
    /// One lane on its own: found more only after an append to it.
    Lane(Lane),
}

impl ReadSlot {
    /// Where the slot's last read is kept.
    fn index(self) -> usize {
        match self {
            ReadSlot::Ordered | ReadSlot::Lane(Lane::Catchup) => 0,
            ReadSlot::Lane(Lane::Live) => 1,
        }
    }

    /// The appends of `counts` the slot waits for.
    fn count(self, counts: AppendCounts) -> u64 {
        match self {
            ReadSlot::Ordered => counts[0].wrapping_add(counts[1]),
            ReadSlot::Lane(_) => counts[self.index()],
        }
    }
}

/// One partition's appends seen by the reader and the reads that reached the buffer's end.
///
/// Appends are counted per lane: in `Concurrent` and `Latest` a lane's read waits only for
/// its own lane's appends (with one count, each live append made a drained catch-up lane be
/// read again), while the one order of the other modes waits for either lane's.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IdleReads {
    /// Appends reported per lane (records or not).
    appends: AppendCounts,
    /// Per read slot ([`ReadSlot::index`]): the slot's append count and the time at which a
    /// read of it reached the end.
    idle: [Option<(u64, Instant)>; 2],
}

impl IdleReads {
    /// An append to `lane` was reported.
    pub fn appended(&mut self, lane: Lane) {
        let count = &mut self.appends[ReadSlot::Lane(lane).index()];
        *count = count.wrapping_add(1);
    }

    /// The appends reported so far: a read started now is answered with them.
    pub fn appends(&self) -> AppendCounts {
        self.appends
    }

    /// Whether `slot` may find something at `now`: not known at the end since the last
    /// append it waits for, or left out for [`SWEEP_EVERY`] already.
    pub fn worth_reading(&self, slot: ReadSlot, now: Instant) -> bool {
        match self.idle[slot.index()] {
            Some((appends, since)) if appends == slot.count(self.appends) => {
                now.saturating_duration_since(since) >= SWEEP_EVERY
            }
            _ => true,
        }
    }

    /// A read of `slot`, started when `appends_at_start` appends were reported, came back at
    /// `now`, `exhausted` as the buffer said ([`crate::store::ReadBatch::exhausted`]).
    pub fn read(
        &mut self,
        slot: ReadSlot,
        appends_at_start: AppendCounts,
        exhausted: bool,
        now: Instant,
    ) {
        self.idle[slot.index()] = exhausted.then_some((slot.count(appends_at_start), now));
    }

    /// Whether a read of `slot` that found something was made only because it was left out
    /// long enough: the buffer changed without a report (worth a log line; the records were
    /// taken all the same).
    pub fn missed(&self, slot: ReadSlot, appends_at_start: AppendCounts) -> bool {
        let count = slot.count(appends_at_start);
        count == slot.count(self.appends)
            && self.idle[slot.index()].is_some_and(|(appends, _)| appends == count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATCHUP: ReadSlot = ReadSlot::Lane(Lane::Catchup);
    const LIVE: ReadSlot = ReadSlot::Lane(Lane::Live);

    #[test]
    fn a_new_partition_is_read() {
        let idle = IdleReads::default();
        let now = Instant::now();
        for slot in [ReadSlot::Ordered, CATCHUP, LIVE] {
            assert!(idle.worth_reading(slot, now));
        }
    }

    #[test]
    fn a_read_at_the_end_is_not_made_again_until_an_append() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        idle.read(CATCHUP, idle.appends(), true, now);
        assert!(!idle.worth_reading(CATCHUP, now));
        assert!(idle.worth_reading(LIVE, now), "slots are apart");
        idle.appended(Lane::Catchup);
        assert!(idle.worth_reading(CATCHUP, now));
    }

    /// Which appends make a slot that reached the end worth reading again: (slot, lane
    /// appended, read again).
    #[test]
    fn a_slot_waits_for_the_appends_of_what_it_reads() {
        let cases = [
            // Concurrent, Latest: each lane's read waits for its own lane only.
            (CATCHUP, Lane::Catchup, true),
            (CATCHUP, Lane::Live, false),
            (LIVE, Lane::Live, true),
            (LIVE, Lane::Catchup, false),
            // Ordered, Off: the one order reads on from the catch-up lane into the live one.
            (ReadSlot::Ordered, Lane::Catchup, true),
            (ReadSlot::Ordered, Lane::Live, true),
        ];
        for (slot, lane, read_again) in cases {
            let mut idle = IdleReads::default();
            let now = Instant::now();
            idle.read(slot, idle.appends(), true, now);
            idle.appended(lane);
            assert_eq!(
                idle.worth_reading(slot, now),
                read_again,
                "{slot:?} after an append to {lane:?}"
            );
        }
    }

    #[test]
    fn a_read_left_out_long_enough_is_made_again() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        let slot = ReadSlot::Ordered;
        idle.read(slot, idle.appends(), true, now);
        assert!(!idle.worth_reading(slot, now + SWEEP_EVERY / 2));
        assert!(idle.worth_reading(slot, now + SWEEP_EVERY));
        assert!(
            idle.missed(slot, idle.appends()),
            "what it finds came unreported"
        );
        // Found at the end again: left out for another while.
        idle.read(slot, idle.appends(), true, now + SWEEP_EVERY);
        assert!(!idle.worth_reading(slot, now + SWEEP_EVERY * 3 / 2));
    }

    #[test]
    fn an_append_during_the_read_keeps_the_partition_read() {
        for slot in [ReadSlot::Ordered, LIVE] {
            let mut idle = IdleReads::default();
            let now = Instant::now();
            let at = idle.appends();
            idle.appended(Lane::Live); // between the read and its answer
            idle.read(slot, at, true, now);
            assert!(idle.worth_reading(slot, now), "{slot:?}");
            assert!(!idle.missed(slot, at), "the records it finds were reported");
        }
    }

    #[test]
    fn an_append_to_the_other_lane_during_the_read_leaves_it_out() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        let at = idle.appends();
        idle.appended(Lane::Live);
        idle.read(CATCHUP, at, true, now);
        assert!(!idle.worth_reading(CATCHUP, now));
        assert!(
            idle.missed(CATCHUP, at),
            "what it finds later came unreported"
        );
    }

    #[test]
    fn a_read_short_of_the_end_is_made_again() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        idle.read(LIVE, idle.appends(), true, now);
        idle.read(LIVE, idle.appends(), false, now);
        assert!(idle.worth_reading(LIVE, now));
        assert!(!idle.missed(LIVE, idle.appends()));
    }
}
