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
            failure: OnceLock::new(),
            unreadable_reported: AtomicBool::new(false),
        }
    }

    /// Whether the disk is below its floor (as last measured).
    pub fn disk_low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
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

    /// Measures the free space with `measure` if the last measurement is old enough, was
    /// near the floor, or `due` (the buffer spent its write allowance). `measure(exact)`
    /// returns the free space less what the buffer wrote and the filesystem does not show
    /// yet; `exact` asks it to wait for those writes first (near the floor, where a guess
    /// would stop writing too early). Returns what changed, and the disk bytes the buffer
    /// may write from now on when it measured.
    pub fn check(
        &self,
        due: bool,
        mut measure: impl FnMut(bool) -> Result<DiskSpace, String>,
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
        let exact = *near || due;
        let mut measured = measure(exact);
        // A guess that lands near the floor is measured again exactly: the guess counts what
        // sled has not written out as taken, which would stop writing early, and a write
        // allowance from it would resume writing on the next, exact measurement.
        if !exact && measured.as_ref().is_ok_and(|space| self.near(space)) {
            measured = measure(true);
        }
        match measured {
            Ok(space) => {
                *near = self.near(&space);
                // Only a stopped buffer asks whether it is drained.
                let drained = disk.is_low() && drained();
                let measured = match disk.observe(&self.floor, space, drained) {
                    Some(change) => {
                        self.low.store(change.low, Ordering::Relaxed);
                        Measured::Changed(change)
                    }
                    None => Measured::Unchanged,
                };
                (measured, Some(disk.write_allowance(&self.floor, space)))
            }
            Err(_) if self.unreadable_reported.swap(true, Ordering::Relaxed) => {
                (Measured::Unchanged, None)
            }
            Err(reason) => (Measured::Unreadable(reason), None),
        }
    }
}
