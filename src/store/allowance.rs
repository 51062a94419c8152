//! How much the memory tier may write to sled before the buffer's filesystem reaches its
//! free-space floor, and how much sled was handed that the filesystem does not show yet.
//!
//! The free-space floor is measured before each fetcher's append, but one append can make
//! the tier spill a quarter of its allowance and more (about three times that on disk), and
//! sled writes from buffers of its own, so what it was handed shows in the filesystem's free
//! space only once it wrote them out. Measured before each append, a buffer with a 16 MiB
//! floor still wrote 7-9 MiB below it. So whoever measures the free space also sets an
//! allowance here (disk bytes the tier may still write); a spill stops where it is spent,
//! leaving the rest in memory until the next measurement, and what sled was handed but did
//! not write out yet counts as written.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Disk bytes sled writes for a byte of appends the tier holds (their memory cost, see
/// `tail::append_cost`), about: a spill of 1.02 MiB of 400-byte records took 3.0 MiB of a
/// tmpfs (the chunk, the state, and the tree pages over them). The allowance is half the
/// free space above the floor, which covers a misjudged cost up to twice this.
const DISK_BYTES_PER_HELD_BYTE: u64 = 3;

/// The tier's write allowance and sled's unwritten bytes.
#[derive(Debug)]
pub(super) struct WriteAllowance {
    /// Disk bytes the tier may still write; `u64::MAX`: no limit (none was set).
    left: AtomicU64,
    /// Disk bytes of writes under way: taken from the allowance and not yet handed to sled.
    /// A measurement does not see them, so an allowance set from it is less by them.
    in_flight: AtomicU64,
    /// Disk bytes handed to sled so far, and of them those sled wrote out when the buffer
    /// last waited for its writes (two counters that only grow: waits that overlap cannot
    /// take the same bytes off twice).
    handed: AtomicU64,
    written: AtomicU64,
    /// A spill stopped at the allowance since it was last set.
    held_back: AtomicBool,
}

impl Default for WriteAllowance {
    fn default() -> Self {
        Self {
            left: AtomicU64::new(u64::MAX),
            in_flight: AtomicU64::new(0),
            handed: AtomicU64::new(0),
            written: AtomicU64::new(0),
            held_back: AtomicBool::new(false),
        }
    }
}

impl WriteAllowance {
    /// Sets the disk bytes the tier may write from now on, less what writes under way will
    /// take (the measurement the allowance comes from did not see them).
    pub fn set(&self, disk_bytes: u64) {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        self.left
            .store(disk_bytes.saturating_sub(in_flight), Ordering::Relaxed);
        self.held_back.store(false, Ordering::Relaxed);
    }

    /// Takes what writing an append of `held_bytes` costs while anything is left of the
    /// allowance (so the last append may overdraw it: a spill always makes progress however
    /// large its appends); otherwise remembers that a spill was held back and returns
    /// `false`. A write taken is under way until [`landed`](Self::landed).
    pub fn take(&self, held_bytes: u64) -> bool {
        let cost = disk_cost(held_bytes);
        // Under way before it is taken: an allowance set in between is less by it.
        self.in_flight.fetch_add(cost, Ordering::Relaxed);
        let taken = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| match left {
                0 => None,
                u64::MAX => Some(left),
                left => Some(left.saturating_sub(cost)),
            })
            .is_ok();
        if !taken {
            self.in_flight.fetch_sub(cost, Ordering::Relaxed);
            self.held_back.store(true, Ordering::Relaxed);
        }
        taken
    }

    /// Takes appends of `held_bytes` written without asking (a write-through append, which
    /// must be written or refused; a durability point): from the allowance as far as it
    /// goes. Under way until [`landed`](Self::landed).
    pub fn spend(&self, held_bytes: u64) {
        let cost = disk_cost(held_bytes);
        self.in_flight.fetch_add(cost, Ordering::Relaxed);
        let _ = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                (left != u64::MAX).then(|| left.saturating_sub(cost))
            });
    }

    /// A write of appends of `held_bytes` taken or spent ended: handed to sled if `handed`,
    /// failed otherwise.
    pub fn landed(&self, held_bytes: u64, handed: bool) {
        let cost = disk_cost(held_bytes);
        // Counted as handed before it stops being under way: never in neither.
        if handed {
            self.handed.fetch_add(cost, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(cost, Ordering::Relaxed);
    }

    /// What sled was handed so far: pass it to [`written_out`](Self::written_out) once sled
    /// wrote out everything it had when this was read.
    pub fn handed_so_far(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    /// sled wrote out the `handed` bytes read before the wait for its writes.
    pub fn written_out(&self, handed: u64) {
        self.written.fetch_max(handed, Ordering::Relaxed);
    }

    /// Disk bytes handed to sled that it may not have written yet.
    pub fn unwritten(&self) -> u64 {
        let written = self.written.load(Ordering::Relaxed);
        self.handed.load(Ordering::Relaxed).saturating_sub(written)
    }

    /// Whether a spill stopped at the allowance since it was last set.
    pub fn held_back(&self) -> bool {
        self.held_back.load(Ordering::Relaxed)
    }
}

fn disk_cost(held_bytes: u64) -> u64 {
    held_bytes.saturating_mul(DISK_BYTES_PER_HELD_BYTE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowance_is_overdrawn_by_one_append_at_most_and_unset_has_no_limit() {
        let allowance = WriteAllowance::default();
        assert!(allowance.take(u64::MAX / 8), "no allowance set: no limit");
        assert!(allowance.take(u64::MAX / 8), "still none");
        allowance.landed(u64::MAX / 8, true);
        allowance.landed(u64::MAX / 8, true);
        assert!(!allowance.held_back());
        allowance.set(1000);
        assert!(allowance.take(200), "600 disk bytes of 1000");
        assert!(allowance.take(200), "600 more overdraw the 400 left");
        assert!(!allowance.take(1), "nothing is left");
        assert!(allowance.held_back());
        allowance.landed(400, true);
        allowance.set(30);
        assert!(!allowance.held_back(), "a new allowance starts afresh");
        allowance.spend(100);
        assert!(!allowance.take(1), "a write-through append spent it");
        allowance.landed(100, true);
        allowance.set(0);
        assert!(
            !allowance.take(0),
            "an allowance of nothing lets nothing through"
        );
    }

    #[test]
    fn an_allowance_set_while_writes_are_under_way_is_less_by_them() {
        let allowance = WriteAllowance::default();
        allowance.set(1000);
        assert!(allowance.take(100), "300 disk bytes under way");
        // A measurement that did not see them.
        allowance.set(1000);
        assert!(allowance.take(233), "699 of the 700 left");
        assert!(allowance.take(1), "the last 1, overdrawn");
        assert!(!allowance.take(1));
        allowance.landed(100, true);
        allowance.landed(234, false);
        allowance.set(1000);
        assert!(allowance.take(300), "900 of 1000");
        assert!(allowance.take(30), "nothing under way: 100 were left");
    }

    #[test]
    fn what_sled_wrote_out_is_no_longer_unwritten() {
        let allowance = WriteAllowance::default();
        assert!(allowance.take(100));
        allowance.landed(100, true);
        assert_eq!(allowance.unwritten(), 300);
        let first_wait = allowance.handed_so_far();
        assert!(allowance.take(50));
        allowance.landed(50, true); // during sled's flush
        let second_wait = allowance.handed_so_far();
        allowance.written_out(second_wait);
        assert_eq!(allowance.unwritten(), 0);
        allowance.written_out(first_wait);
        assert_eq!(
            allowance.unwritten(),
            0,
            "an overlapping wait that ends later takes nothing off twice"
        );
        assert!(allowance.take(50));
        allowance.landed(50, true);
        assert_eq!(allowance.unwritten(), 150, "handed after both waits");
        assert!(allowance.take(10));
        allowance.landed(10, false);
        assert_eq!(allowance.unwritten(), 150, "a failed write hands nothing");
    }
}
