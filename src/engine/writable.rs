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

    /// Measures the free space with `measure` if the last measurement is old enough (or was
    /// near the floor).
    pub fn check(
        &self,
        measure: impl FnOnce() -> Result<DiskSpace, String>,
        drained: impl FnOnce() -> bool,
    ) -> Measured {
        if self.floor == DiskFloor::DISABLED {
            return Measured::Unchanged;
        }
        let mut guard = self
            .guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (disk, checked_at, near) = &mut *guard;
        if !*near && checked_at.is_some_and(|at| at.elapsed() < CHECK_EVERY) {
            return Measured::Unchanged;
        }
        *checked_at = Some(Instant::now());
        match measure() {
            Ok(space) => {
                *near = space.available / 2 < self.floor.bytes(space.total);
                // Only a stopped buffer asks whether it is drained.
                let drained = disk.is_low() && drained();
                match disk.observe(&self.floor, space, drained) {
                    Some(change) => {
                        self.low.store(change.low, Ordering::Relaxed);
                        Measured::Changed(change)
                    }
                    None => Measured::Unchanged,
                }
            }
            Err(_) if self.unreadable_reported.swap(true, Ordering::Relaxed) => Measured::Unchanged,
            Err(reason) => Measured::Unreadable(reason),
        }
    }
}
