//! Which of a partition's reads the reader may leave out of a fill: one that came back empty
//! (no record, its cursor unmoved) finds nothing again until the partition's buffer changed.
//!
//! A fill visits every assigned partition. With many partitions and the reader at the tail,
//! nearly all of them hold nothing new, and a fill cost a read of each (a lookup, the
//! shard's lock, the state, the partitions' lock) to hand out the few records of the one
//! that was appended: with 64 partitions the reader spent more than the group member's
//! thread. The fetchers report every append (with records or not) under the partitions'
//! lock, so a read that found nothing after the last report would find nothing again.
//!
//! What changes a partition's buffer other than an append (a new layout, a discard) gives it
//! a new runtime, whose reads start afresh. As a safety net the reader still makes every
//! read once per [`SWEEP_EVERY`]: a change that came without a report costs a delay, never
//! a stall.

use std::time::Duration;

/// How often a fill reads every partition, skipped or not.
pub const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// One partition's appends seen by the reader and the reads that found nothing. A read slot
/// is a lane in `Concurrent` and `Latest` (catch-up 0, live 1), and slot 0 in the modes
/// that read one order across both lanes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IdleReads {
    /// Appends reported for the partition (either lane, records or not).
    appends: u64,
    /// Per read slot: the append count at which a read of it found nothing.
    idle_at: [Option<u64>; 2],
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

    /// Whether read slot `slot` may find something: not known empty since the last append,
    /// or a sweep is due.
    pub fn worth_reading(&self, slot: usize, sweep: bool) -> bool {
        sweep || self.idle_at[slot] != Some(self.appends)
    }

    /// A read of `slot` started when `appends_at_start` appends were reported came back:
    /// `found_nothing` if it had no record and did not move its cursor.
    pub fn read(&mut self, slot: usize, appends_at_start: u64, found_nothing: bool) {
        self.idle_at[slot] = found_nothing.then_some(appends_at_start);
    }

    /// Whether a read of `slot` the sweep made found something the skip would have left:
    /// an append that was never reported (worth a log line; the sweep took the records).
    pub fn missed(&self, slot: usize, appends_at_start: u64) -> bool {
        self.idle_at[slot] == Some(appends_at_start) && appends_at_start == self.appends
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_partition_is_read() {
        let idle = IdleReads::default();
        assert!(idle.worth_reading(0, false));
        assert!(idle.worth_reading(1, false));
    }

    #[test]
    fn an_empty_read_is_not_made_again_until_an_append() {
        let mut idle = IdleReads::default();
        let at = idle.appends();
        idle.read(0, at, true);
        assert!(!idle.worth_reading(0, false));
        assert!(idle.worth_reading(1, false), "slots are apart");
        assert!(idle.worth_reading(0, true), "a sweep reads it anyway");
        idle.appended();
        assert!(idle.worth_reading(0, false));
    }

    #[test]
    fn an_append_during_the_read_keeps_the_partition_read() {
        let mut idle = IdleReads::default();
        let at = idle.appends();
        idle.appended(); // between the read and its answer
        idle.read(0, at, true);
        assert!(idle.worth_reading(0, false));
    }

    #[test]
    fn a_read_that_found_something_is_made_again() {
        let mut idle = IdleReads::default();
        idle.read(1, idle.appends(), true);
        idle.read(1, idle.appends(), false);
        assert!(idle.worth_reading(1, false));
    }

    #[test]
    fn what_a_sweep_finds_behind_a_skip_is_noticed() {
        let mut idle = IdleReads::default();
        let at = idle.appends();
        idle.read(0, at, true);
        assert!(idle.missed(0, at), "skipped, and no append since");
        assert!(!idle.missed(1, at), "never found empty");
        idle.appended();
        assert!(!idle.missed(0, idle.appends()));
    }
}
