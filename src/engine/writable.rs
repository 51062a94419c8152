//! Whether the fetchers may write to the buffer: not while its filesystem is below the
//! free-space floor, and never again after a write failed (sled keeps failing, and can block
//! in its flush, until it is reopened in a new process).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::fetch::{DiskChange, DiskFloor, DiskGuard, DiskSpace};

/// How often the free space is measured (a `statvfs` call, no I/O) while far from the
/// floor; within twice the floor it is measured at every call, since the fetchers can write
/// tens of MiB in one interval.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// The buffer's writability, shared by both fetchers and the reader.
pub(crate) struct Writability {
    floor: DiskFloor,
    /// The guard, when it last measured, and whether that measurement was near the floor.
    guard: Mutex<(DiskGuard, Option<Instant>, bool)>,
    low: AtomicBool,
    /// Writing goes on below the floor (`DiskGuard::writes_below_floor`), as last measured.
    below_floor: AtomicBool,
    failure: OnceLock<String>,
    unreadable_reported: AtomicBool,
}

/// What a measurement changed, for the caller to report.
pub(crate) enum Measured {
    /// Nothing new.
    Unchanged,
    /// The low-space state changed.
    Changed(DiskChange),
    /// The free space could not be read (reported once; the last state stays).
    Unreadable(String),
}

impl Writability {
    pub fn new(floor: DiskFloor) -> Self {
        Self {
            floor,
            guard: Mutex::new((DiskGuard::default(), None, true)),
            low: AtomicBool::new(false),
            below_floor: AtomicBool::new(false),
            failure: OnceLock::new(),
            unreadable_reported: AtomicBool::new(false),
        }
    }

    /// Whether the disk is below its floor (as last measured).
    pub fn disk_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// Whether writing goes on below the floor, into the space the buffer holds (as last
    /// measured).
    pub fn below_floor(&self) -> bool {
        self.below_floor.load(Ordering::Relaxed)
    }

    /// The write failure that stopped the buffer, if any.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Records the first write failure; `true` if this call recorded it.
    pub fn fail(&self, reason: String) -> bool {
        self.failure.set(reason).is_ok()
    }

    /// Whether `space` lies within twice the floor, where every call measures (the fetchers
    /// can write tens of MiB in one interval).
    fn near(&self, space: &DiskSpace) -> bool {
        space.available / 2 < self.floor.bytes(space.total)
    }

    /// Measures the free space with `probe` if the last measurement is old enough, was
    /// near the floor, or `due` (the buffer spent its write allowance, or it closes).
    /// `probe(false)` reads the filesystem and what the buffer handed sled that it may not
    /// show yet, which then counts as taken; `probe(true)` first waits for sled's writes.
    /// It waits only where that matters: when a spill was held back, or when the disk as it
    /// shows and as guessed would decide differently whether writing stops (a flush holds
    /// back every other write to sled, and a buffer that reached its floor stays near it).
    /// Returns what changed, and the disk bytes the buffer may write from now on when it
    /// measured (no limit when the free space cannot be read: the floor cannot be enforced).
    pub fn check(
        &self,
        due: bool,
        mut probe: impl FnMut(bool) -> Result<Probe, String>,
        drained: impl FnOnce() -> bool,
    ) -> (Measured, Option<u64>) {
        if self.floor == DiskFloor::DISABLED {
            return (Measured::Unchanged, None);
        }
        let mut guard = self
            .guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (disk, checked_at, near) = &mut *guard;
        if !*near && !due && checked_at.is_some_and(|at| at.elapsed() < CHECK_EVERY) {
            return (Measured::Unchanged, None);
        }
        *checked_at = Some(Instant::now());
        // Only a stopped buffer asks whether it is drained.
        let drained = disk.is_low() && drained();
        let seen = probe(false).and_then(|seen| {
            let guessed = seen.guessed();
            let undecided = {
                let (mut as_shown, mut as_guessed) = (disk.clone(), disk.clone());
                as_shown.observe(&self.floor, seen.space, drained);
                as_guessed.observe(&self.floor, guessed, drained);
                as_shown.is_low() != as_guessed.is_low()
            };
            if seen.unwritten > 0 && (due || undecided) {
                // What the other fetcher hands sled meanwhile may show in the filesystem
                // already, or not: one spill at most, within its allowance.
                probe(true).map(|exact| exact.space)
            } else {
                Ok(guessed)
            }
        });
        match seen {
            Ok(space) => {
                *near = self.near(&space);
                let measured = match disk.observe(&self.floor, space, drained) {
                    Some(change) => {
                        self.low.store(change.low, Ordering::Relaxed);
                        Measured::Changed(change)
                    }
                    None => Measured::Unchanged,
                };
                let below = disk.writes_below_floor(&self.floor, space);
                self.below_floor.store(below, Ordering::Relaxed);
                (measured, Some(disk.write_allowance(&self.floor, space)))
            }
            Err(_) if self.unreadable_reported.swap(true, Ordering::Relaxed) => {
                (Measured::Unchanged, Some(u64::MAX))
            }
            Err(reason) => (Measured::Unreadable(reason), Some(u64::MAX)),
        }
    }
}

/// What a probe of the buffer's disk sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    /// The filesystem's free space, as it shows.
    pub space: DiskSpace,
    /// Bytes the buffer handed sled that the filesystem may not show yet.
    pub unwritten: u64,
}

impl Probe {
    /// The free space once sled wrote out what it was handed (at most).
    fn guessed(&self) -> DiskSpace {
        DiskSpace {
            available: self.space.available.saturating_sub(self.unwritten),
            ..self.space
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn probe(available_mib: u64, unwritten_mib: u64) -> Probe {
        Probe {
            space: DiskSpace {
                available: available_mib * MIB,
                total: 1024 * MIB,
            },
            unwritten: unwritten_mib * MIB,
        }
    }

    /// Checks once: what the probe saw without waiting and after waiting for sled's writes;
    /// returns whether it waited, whether writing is stopped, and the allowance in MiB.
    fn check(
        writability: &Writability,
        due: bool,
        guess: Probe,
        exact: Probe,
    ) -> (bool, bool, Option<u64>) {
        let mut waited = false;
        let (_, allowance) = writability.check(
            due,
            |wait| {
                waited |= wait;
                Ok(if wait { exact } else { guess })
            },
            || false,
        );
        (waited, writability.disk_low(), allowance.map(|a| a / MIB))
    }

    #[test]
    fn it_waits_for_sleds_writes_only_where_the_guess_could_decide_wrongly() {
        let floor = DiskFloor::new(100 * MIB, 0.0);
        // Far: the guess counts the unwritten bytes as taken; the next check waits 200 ms.
        let far = Writability::new(floor);
        assert_eq!(
            check(&far, false, probe(500, 40), probe(470, 0)),
            (false, false, Some(180))
        );
        assert_eq!(
            check(&far, false, probe(100, 40), probe(60, 0)),
            (false, false, None)
        );
        let writability = Writability::new(floor);
        // (due, as shown / unwritten, after the wait / unwritten) → (waited, low, allowance)
        let table = [
            // Near, both views above the floor: the guess serves (and every check measures).
            (
                (false, probe(150, 10), probe(145, 0)),
                (false, false, Some(20)),
            ),
            // The guess says stop, the disk as shown says go on: wait and see.
            (
                (false, probe(105, 10), probe(102, 0)),
                (true, false, Some(1)),
            ),
            ((false, probe(102, 10), probe(99, 0)), (true, true, Some(0))),
            // Stopped; the guess and the disk agree it stays stopped.
            ((false, probe(99, 10), probe(99, 0)), (false, true, Some(0))),
            // Resumes only above the floor and its margin, as it shows after the wait.
            (
                (false, probe(115, 10), probe(111, 0)),
                (true, false, Some(5)),
            ),
            // A spill was held back: wait, unless nothing is unwritten.
            (
                (true, probe(130, 4), probe(128, 0)),
                (true, false, Some(14)),
            ),
            ((true, probe(130, 0), probe(0, 0)), (false, false, Some(15))),
        ];
        for ((due, guess, exact), expected) in table {
            assert_eq!(
                check(&writability, due, guess, exact),
                expected,
                "due={due} {guess:?}"
            );
        }
    }

    #[test]
    fn unreadable_free_space_lifts_the_allowance() {
        let writability = Writability::new(DiskFloor::new(100 * MIB, 0.0));
        let (measured, allowance) = writability.check(true, |_| Err("gone".into()), || false);
        assert!(matches!(measured, Measured::Unreadable(_)));
        assert_eq!(allowance, Some(u64::MAX), "the floor cannot be enforced");
        let (measured, allowance) = writability.check(true, |_| Err("gone".into()), || false);
        assert!(matches!(measured, Measured::Unchanged), "said once");
        assert_eq!(allowance, Some(u64::MAX));
        let disabled = Writability::new(DiskFloor::DISABLED);
        assert_eq!(
            disabled.check(true, |_| Ok(probe(1, 0)), || false).1,
            None,
            "no floor: never measured, never limited"
        );
    }
}
