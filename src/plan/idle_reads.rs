//! Which of a partition's reads the reader may leave out of a fill: one that reached the end
//! of what the buffer proved finds nothing again until the partition is appended to.
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

/// How long a read is left out at most (an hour with the `strict-reads` feature, for the
/// tests: a missing report then stalls them).
pub const SWEEP_EVERY: Duration = if cfg!(feature = "strict-reads") {
    Duration::from_secs(3600)
} else {
    Duration::from_millis(100)
};

/// One partition's appends seen by the reader and the reads that reached the buffer's end. A
/// read slot is a lane in `Concurrent` and `Latest` (catch-up 0, live 1), and slot 0 in the
/// modes that read one order across both lanes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IdleReads {
    /// Appends reported for the partition (either lane, records or not).
    appends: u64,
    /// Per read slot: the append count and the time at which a read of it reached the end.
    idle: [Option<(u64, Instant)>; 2],
}

impl IdleReads {
    /// An append to either lane of the partition was reported.
    pub fn appended(&mut self) {
        self.appends = self.appends.wrapping_add(1);
    }

    /// The appends reported so far: a read started now is answered with it.
    pub fn appends(&self) -> u64 {
        self.appends
    }

    /// Whether read slot `slot` may find something at `now`: not known at the end since the
    /// last append, or left out for [`SWEEP_EVERY`] already.
    pub fn worth_reading(&self, slot: usize, now: Instant) -> bool {
        match self.idle[slot] {
            Some((appends, since)) if appends == self.appends => {
                now.saturating_duration_since(since) >= SWEEP_EVERY
            }
            _ => true,
        }
    }

    /// A read of `slot`, started when `appends_at_start` appends were reported, came back at
    /// `now`, `exhausted` as the buffer said ([`crate::store::ReadBatch::exhausted`]).
    pub fn read(&mut self, slot: usize, appends_at_start: u64, exhausted: bool, now: Instant) {
        self.idle[slot] = exhausted.then_some((appends_at_start, now));
    }

    /// Whether a read of `slot` that found something was made only because it was left out
    /// long enough: the buffer changed without a report (worth a log line; the records were
    /// taken all the same).
    pub fn missed(&self, slot: usize, appends_at_start: u64) -> bool {
        appends_at_start == self.appends
            && self.idle[slot].is_some_and(|(appends, _)| appends == appends_at_start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_partition_is_read() {
        let idle = IdleReads::default();
        let now = Instant::now();
        assert!(idle.worth_reading(0, now));
        assert!(idle.worth_reading(1, now));
    }

    #[test]
    fn a_read_at_the_end_is_not_made_again_until_an_append() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        idle.read(0, idle.appends(), true, now);
        assert!(!idle.worth_reading(0, now));
        assert!(idle.worth_reading(1, now), "slots are apart");
        idle.appended();
        assert!(idle.worth_reading(0, now));
    }

    #[test]
    fn a_read_left_out_long_enough_is_made_again() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        idle.read(0, idle.appends(), true, now);
        assert!(!idle.worth_reading(0, now + SWEEP_EVERY / 2));
        assert!(idle.worth_reading(0, now + SWEEP_EVERY));
        assert!(
            idle.missed(0, idle.appends()),
            "what it finds came unreported"
        );
        // Found at the end again: left out for another while.
        idle.read(0, idle.appends(), true, now + SWEEP_EVERY);
        assert!(!idle.worth_reading(0, now + SWEEP_EVERY * 3 / 2));
    }

    #[test]
    fn an_append_during_the_read_keeps_the_partition_read() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        let at = idle.appends();
        idle.appended(); // between the read and its answer
        idle.read(0, at, true, now);
        assert!(idle.worth_reading(0, now));
        assert!(!idle.missed(0, at), "the records it finds were reported");
    }

    #[test]
    fn a_read_short_of_the_end_is_made_again() {
        let mut idle = IdleReads::default();
        let now = Instant::now();
        idle.read(1, idle.appends(), true, now);
        idle.read(1, idle.appends(), false, now);
        assert!(idle.worth_reading(1, now));
        assert!(!idle.missed(1, idle.appends()));
    }
}
