//! The free-space floor: when the buffer's filesystem runs low, both fetchers stop writing.
//!
//! sled does not survive a full disk gracefully: after a failed write it returns the same
//! error for every later write until it is reopened, and its flush (also run when it is
//! dropped) can block for good. So the buffer never writes into the last stretch of the
//! disk: below the floor the fetchers pause every partition and refuse appends (the records
//! stay in Kafka and are fetched again), and they resume once the free space is back above
//! the floor plus a margin, so that they do not flap around it.

/// The configured floor: the larger of a byte count and a share of the filesystem.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskFloor {
    /// Always keep at least this many bytes free.
    pub min_free_bytes: u64,
    /// Always keep at least this percentage of the filesystem free (0 to 100).
    pub min_free_percent: f64,
}

impl Default for DiskFloor {
    /// The larger of 256 MiB and 5 %.
    fn default() -> Self {
        Self {
            min_free_bytes: 256 << 20,
            min_free_percent: 5.0,
        }
    }
}

impl DiskFloor {
    /// No floor: write until the disk is full (a write that fails then is fatal).
    pub const DISABLED: Self = Self {
        min_free_bytes: 0,
        min_free_percent: 0.0,
    };

    /// The floor in bytes on a filesystem of `total` bytes.
    pub fn bytes(&self, total: u64) -> u64 {
        let percent = self.min_free_percent.clamp(0.0, 100.0);
        let share = (total as f64 * percent / 100.0) as u64;
        self.min_free_bytes.max(share)
    }
}

/// What the filesystem holding the buffer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpace {
    /// Bytes an unprivileged writer may still use.
    pub available: u64,
    /// Size of the filesystem.
    pub total: u64,
}

/// A change of the low-space state, to apply and report once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskChange {
    /// `true`: below the floor, writing stops; `false`: space is back.
    pub low: bool,
    /// Free bytes when the change was decided.
    pub available: u64,
    /// The floor in bytes.
    pub floor: u64,
}

/// Tracks whether the buffer is below its floor, with hysteresis.
#[derive(Debug, Clone, Default)]
pub struct DiskGuard {
    low: bool,
}

impl DiskGuard {
    /// Whether writing is stopped.
    pub fn is_low(&self) -> bool {
        self.low
    }

    /// The free space to get back before writing resumes: the floor plus a tenth of it, at
    /// least 1 MiB more (a floor of 0 never stops writing).
    pub fn resume_at(floor: u64) -> u64 {
        if floor == 0 {
            0
        } else {
            floor.saturating_add((floor / 10).max(1 << 20))
        }
    }

    /// Feeds one measurement; returns the change to apply, if any.
    pub fn observe(&mut self, floor: &DiskFloor, space: DiskSpace) -> Option<DiskChange> {
        let floor = floor.bytes(space.total);
        let low = if self.low {
            space.available < Self::resume_at(floor)
        } else {
            space.available < floor
        };
        (low != self.low).then(|| {
            self.low = low;
            DiskChange {
                low,
                available: space.available,
                floor,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn the_floor_is_the_larger_of_bytes_and_share() {
        let floor = DiskFloor::default();
        assert_eq!(floor.bytes(GIB), 256 * MIB, "5 % of 1 GiB is less");
        assert_eq!(floor.bytes(100 * GIB), 5 * GIB, "5 % of 100 GiB is more");
        assert_eq!(DiskFloor::DISABLED.bytes(100 * GIB), 0);
        let odd = DiskFloor {
            min_free_bytes: 0,
            min_free_percent: 250.0,
        };
        assert_eq!(odd.bytes(GIB), GIB, "a share above 100 % is the whole disk");
    }

    #[test]
    fn writing_stops_below_the_floor_and_resumes_above_the_margin() {
        let floor = DiskFloor {
            min_free_bytes: 100 * MIB,
            min_free_percent: 0.0,
        };
        let space = |available| DiskSpace {
            available,
            total: 10 * GIB,
        };
        let mut guard = DiskGuard::default();
        let change = |low, available| {
            Some(DiskChange {
                low,
                available,
                floor: 100 * MIB,
            })
        };
        // (free space, the change it causes, low afterwards)
        let table = [
            (500 * MIB, None, false),
            (100 * MIB, None, false),
            (100 * MIB - 1, change(true, 100 * MIB - 1), true),
            (50 * MIB, None, true),
            (100 * MIB, None, true),
            (110 * MIB - 1, None, true),
            (110 * MIB, change(false, 110 * MIB), false),
            (105 * MIB, None, false),
        ];
        for (available, expected, low) in table {
            assert_eq!(
                guard.observe(&floor, space(available)),
                expected,
                "{available}"
            );
            assert_eq!(guard.is_low(), low, "{available}");
        }
    }

    #[test]
    fn a_disabled_floor_never_stops_writing() {
        let mut guard = DiskGuard::default();
        for available in [0, 1, MIB] {
            let space = DiskSpace {
                available,
                total: GIB,
            };
            assert_eq!(guard.observe(&DiskFloor::DISABLED, space), None);
        }
        assert_eq!(DiskGuard::resume_at(0), 0);
        assert_eq!(DiskGuard::resume_at(10 * MIB), 11 * MIB);
        assert_eq!(DiskGuard::resume_at(GIB), GIB + GIB / 10);
    }
}
