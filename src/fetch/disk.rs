//! The free-space floor: when the buffer's filesystem runs low, both fetchers stop writing.
//!
//! sled does not survive a full disk gracefully: after a failed write it returns the same
//! error for every later write until it is reopened, and its flush (also run when it is
//! dropped) can block for good. So the buffer never writes into the last stretch of the
//! disk: below the floor the fetchers pause every partition and refuse appends (the records
//! stay in Kafka and are fetched again), and they resume once the free space is back above
//! the floor plus a margin, so that they do not flap around it.
//!
//! sled hands space back to the filesystem only when its file's tail is free, so a buffer
//! that itself pushed the disk below the floor may hold that space after draining, as space
//! it reuses. Waiting for the filesystem would then wait forever. So once nothing the buffer
//! holds is left to hand out — but live records of `Ordered` waiting behind a backlog that
//! must be written first ([`nothing_deliverable`]) — writing resumes even below the floor,
//! and stops again one margin lower; it never resumes below half the floor — the hard limit.
//! Below the floor those waiting live lanes stay paused ([`held_below_floor`]): the room goes
//! to their backlog.

pub use crate::store::DiskSpace;

/// The configured floor: the larger of a byte count and a share of the filesystem.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
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

    /// A floor of at least `min_free_bytes` and at least `min_free_percent` of the
    /// filesystem (0 to 100), whichever is larger.
    ///
    /// ```
    /// let floor = catchup::DiskFloor::new(1 << 30, 10.0);
    /// assert_eq!(floor.bytes(100 << 30), 10 << 30);
    /// ```
    pub fn new(min_free_bytes: u64, min_free_percent: f64) -> Self {
        Self {
            min_free_bytes,
            min_free_percent,
        }
    }

    /// The floor in bytes on a filesystem of `total` bytes.
    ///
    /// ```
    /// let floor = catchup::DiskFloor::default(); // the larger of 256 MiB and 5 %
    /// assert_eq!(floor.bytes(1 << 30), 256 << 20);
    /// assert_eq!(floor.bytes(100 << 30), 5 << 30);
    /// assert_eq!(catchup::DiskFloor::DISABLED.bytes(100 << 30), 0);
    /// ```
    pub fn bytes(&self, total: u64) -> u64 {
        let percent = self.min_free_percent.clamp(0.0, 100.0);
        let share = (total as f64 * percent / 100.0) as u64;
        self.min_free_bytes.max(share)
    }
}

/// A change of the low-space state, to apply and report once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskChange {
    /// `true`: below the floor, writing stops; `false`: writing resumes.
    pub low: bool,
    /// Free bytes when the change was decided.
    pub available: u64,
    /// The floor in bytes.
    pub floor: u64,
    /// Writing resumes below the floor because the buffer is drained (see the module docs).
    pub reusing: bool,
    /// A step of a drained buffer going on below the floor: writing resumed there before
    /// since the space was last back above the floor plus its margin, and (a stop) a drained
    /// buffer may still resume from here. The first stop and the first resume below the floor
    /// are worth an operator's attention, and so is a stop at the hard limit, where writing
    /// waits for space; the steps between them (one every margin written) are not.
    pub repeated: bool,
}

/// Tracks whether the buffer is below its floor, with hysteresis.
#[derive(Debug, Clone, Default)]
pub struct DiskGuard {
    low: bool,
    /// Writing stops below this; `None`: the floor. Lower after a resume on a drained buffer.
    stop_below: Option<u64>,
    /// Writing resumed below the floor since the space was last back above its margin.
    resumed_below: bool,
}

impl DiskGuard {
    /// Whether writing is stopped.
    pub fn is_low(&self) -> bool {
        self.low
    }

    /// Whether writing goes on below the floor (into the space a drained buffer holds), after
    /// `observe` saw `space`.
    pub fn writes_below_floor(&self, floor: &DiskFloor, space: DiskSpace) -> bool {
        !self.low && space.available < floor.bytes(space.total)
    }

    /// The hysteresis margin: a tenth of the floor, at least 1 MiB (none without a floor).
    pub fn margin(floor: u64) -> u64 {
        if floor == 0 {
            0
        } else {
            (floor / 10).max(1 << 20)
        }
    }

    /// The free space to get back before writing resumes on a buffer that still holds
    /// unprocessed records: the floor plus the margin.
    pub fn resume_at(floor: u64) -> u64 {
        floor.saturating_add(Self::margin(floor))
    }

    /// Feeds one measurement; `drained` says nothing the buffer holds can be processed before
    /// more is written ([`nothing_deliverable`]). Returns the change to apply, if any.
    pub fn observe(
        &mut self,
        floor: &DiskFloor,
        space: DiskSpace,
        drained: bool,
    ) -> Option<DiskChange> {
        let floor = floor.bytes(space.total);
        let margin = Self::margin(floor);
        // The least free space a drained buffer resumes at: the hard limit.
        let lowest_resume = (floor / 2).saturating_add(margin);
        let repeated = self.resumed_below && space.available >= lowest_resume;
        let change = |low, reusing| DiskChange {
            low,
            available: space.available,
            floor,
            reusing,
            repeated,
        };
        if space.available >= Self::resume_at(floor) {
            // The space is back: the floor is the floor again.
            self.stop_below = None;
            self.resumed_below = false;
        }
        if !self.low {
            let stop_below = self.stop_below.unwrap_or(floor).min(floor);
            if space.available < stop_below {
                self.low = true;
                self.stop_below = None;
                return Some(change(true, false));
            }
            return None;
        }
        if space.available >= Self::resume_at(floor) {
            self.low = false;
            return Some(DiskChange {
                repeated: false,
                ..change(false, false)
            });
        }
        if drained && space.available >= lowest_resume {
            self.low = false;
            self.stop_below = Some(space.available - margin);
            self.resumed_below = true;
            return Some(change(false, true));
        }
        None
    }

    /// The disk bytes the buffer may write until the next measurement, after `observe` saw
    /// `space`: half of what lies above the point where writing stops (the other half covers
    /// a misjudged cost of sled's writes), none while writing is stopped. The buffer may
    /// overdraw it by one append, so that it gets there however large its appends are.
    pub fn write_allowance(&self, floor: &DiskFloor, space: DiskSpace) -> u64 {
        if self.low {
            return 0;
        }
        let floor = floor.bytes(space.total);
        let stop_below = self.stop_below.unwrap_or(floor).min(floor);
        space.available.saturating_sub(stop_below) / 2
    }
}

/// What one partition holds that the application has not been handed yet, for
/// [`nothing_deliverable`] and [`held_below_floor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unprocessed {
    /// Bytes of the catch-up lane fetched and not handed out yet.
    pub catchup_bytes: u64,
    /// Bytes of the live lane fetched and not handed out yet.
    pub live_bytes: u64,
    /// Its live records wait until the backlog is delivered ([`live_waits_for_backlog`]).
    pub live_waits_for_backlog: bool,
}

/// Whether a partition's live records wait until its backlog is delivered: in `Ordered`
/// (`ordered`), while it is split and its backlog is not all delivered.
pub fn live_waits_for_backlog(ordered: bool, split: bool, backlog_delivered: bool) -> bool {
    ordered && split && !backlog_delivered
}

/// Whether nothing the buffer holds can be delivered before more is written: what
/// [`DiskGuard::observe`] takes as drained. Every lane is handed out, except live records
/// waiting behind a backlog not yet delivered: they can be delivered only once the backlog
/// is, which needs the space. Counting them kept a split partition in `Ordered` below the
/// floor for good, its backlog unwritten and its live records waiting for it. Records handed
/// out and not acknowledged do not count either: an application that acknowledges a batch
/// once it has all of it would wait for good.
pub fn nothing_deliverable(partitions: impl IntoIterator<Item = Unprocessed>) -> bool {
    partitions.into_iter().all(|partition| {
        partition.catchup_bytes == 0
            && (partition.live_bytes == 0 || partition.live_waits_for_backlog)
    })
}

/// The partitions whose live lane may not be written while writing goes on below the floor
/// ([`DiskGuard::writes_below_floor`], `below_floor`): those whose live records wait for their
/// backlog. Their records could not be processed before the backlog, which needs that room
/// (their live lanes took it once already). None above the floor; the other partitions' live
/// lanes go on.
pub fn held_below_floor<K: Ord>(
    below_floor: bool,
    partitions: impl IntoIterator<Item = (K, Unprocessed)>,
) -> std::collections::BTreeSet<K> {
    if !below_floor {
        return std::collections::BTreeSet::new();
    }
    partitions
        .into_iter()
        .filter(|(_, partition)| partition.live_waits_for_backlog)
        .map(|(key, _)| key)
        .collect()
}

/// What the buffer may come to occupy on disk with a byte budget of `budget_bytes` of
/// unprocessed payload and a compaction allowance of `allowance_bytes`: sled stores payload
/// at up to three times its size, and a compaction copies what is left (the sizing rule in
/// the operations notes).
pub fn room_for_budget(budget_bytes: u64, allowance_bytes: u64) -> u64 {
    budget_bytes
        .saturating_mul(3)
        .saturating_add(allowance_bytes)
        .saturating_add(16 << 20)
}

/// A buffer's filesystem too small for its budget, as [`room_short`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomShort {
    /// Bytes the buffer may occupy before the floor: what it holds plus what is free above
    /// the floor.
    pub room: u64,
    /// What the budget may take ([`room_for_budget`]).
    pub needed: u64,
}

/// Whether the buffer's filesystem leaves it less room than its budget may take, with
/// `space` measured now and `held` bytes the buffer already occupies (space it reuses).
/// Once the room is full nothing is written until the buffer is processed; in `Ordered`, a
/// split partition whose live records fill the room has its backlog go on only into the
/// space the buffer frees, down to half the floor ([`held_below_floor`]). Without a floor
/// (`DiskFloor::DISABLED`) nothing is short: the disk's end is the limit the user chose.
pub fn room_short(
    floor: &DiskFloor,
    space: DiskSpace,
    held: u64,
    budget_bytes: u64,
    allowance_bytes: u64,
) -> Option<RoomShort> {
    let floor = floor.bytes(space.total);
    if floor == 0 {
        return None;
    }
    let room = space.available.saturating_sub(floor).saturating_add(held);
    let needed = room_for_budget(budget_bytes, allowance_bytes);
    (room < needed).then_some(RoomShort { room, needed })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const FLOOR_100_MIB: DiskFloor = DiskFloor {
        min_free_bytes: 100 * MIB,
        min_free_percent: 0.0,
    };

    /// `available` bytes free on a 10 GiB filesystem.
    fn space(available: u64) -> DiskSpace {
        DiskSpace {
            available,
            total: 10 * GIB,
        }
    }

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
        let floor = FLOOR_100_MIB;
        let mut guard = DiskGuard::default();
        let change = |low, available| {
            Some(DiskChange {
                low,
                available,
                floor: 100 * MIB,
                reusing: false,
                repeated: false,
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
                guard.observe(&floor, space(available), false),
                expected,
                "{available}"
            );
            assert_eq!(guard.is_low(), low, "{available}");
        }
    }

    #[test]
    fn the_buffer_may_write_half_of_what_lies_above_where_writing_stops() {
        let floor = FLOOR_100_MIB;
        let mut guard = DiskGuard::default();
        // (free space, drained, disk bytes it may write then)
        let table = [
            (500 * MIB, false, 200 * MIB),
            (101 * MIB, false, MIB / 2),
            (100 * MIB, false, 0),
            // Stopped: nothing, also back at the floor (it resumes one margin above).
            (99 * MIB, false, 0),
            (105 * MIB, false, 0),
            // Drained below the floor: it stops one margin lower, at 80 MiB.
            (90 * MIB, true, 5 * MIB),
            (84 * MIB, false, 2 * MIB),
            // The space is back: the floor is the floor again.
            (110 * MIB, false, 5 * MIB),
        ];
        for (available, drained, allowance) in table {
            guard.observe(&floor, space(available), drained);
            assert_eq!(
                guard.write_allowance(&floor, space(available)),
                allowance,
                "{available} drained={drained}"
            );
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
            assert_eq!(guard.observe(&DiskFloor::DISABLED, space, false), None);
        }
        assert_eq!(DiskGuard::resume_at(0), 0);
        assert_eq!(DiskGuard::resume_at(10 * MIB), 11 * MIB);
        assert_eq!(DiskGuard::resume_at(GIB), GIB + GIB / 10);
    }

    #[test]
    fn a_drained_buffer_resumes_below_the_floor_but_never_below_half() {
        let floor = FLOOR_100_MIB;
        let mut guard = DiskGuard::default();
        let mut observe = |available, drained| {
            let change = guard.observe(&floor, space(available), drained);
            let below = guard.writes_below_floor(&floor, space(available));
            (
                change.map(|c| (c.low, c.reusing, c.repeated)),
                guard.is_low(),
                below,
            )
        };
        // (free space, drained, the change it causes as (low, reusing, repeated), low
        // afterwards, writing below the floor afterwards)
        let table = [
            (90 * MIB, false, Some((true, false, false)), true, false),
            (90 * MIB, false, None, true, false),
            // Drained, still below the floor: sled reuses what it holds; stop 10 MiB lower.
            (90 * MIB, true, Some((false, true, false)), false, true),
            (85 * MIB, false, None, false, true),
            // The space comes back while writing goes on: the floor is the floor again.
            (115 * MIB, false, None, false, false),
            (
                100 * MIB - 1,
                false,
                Some((true, false, false)),
                true,
                false,
            ),
            (90 * MIB, true, Some((false, true, false)), false, true),
            // Further steps down are repeats.
            (80 * MIB - 1, false, Some((true, false, true)), true, false),
            (70 * MIB, true, Some((false, true, true)), false, true),
            // A stop at the hard limit is not a step: writing waits for space.
            (60 * MIB - 1, false, Some((true, false, false)), true, false),
            // Half the floor plus the margin is the lowest a drained buffer resumes at.
            (60 * MIB - 1, true, None, true, false),
            (59 * MIB, true, None, true, false),
            // Space comes back: the ordinary rule, and the floor is the floor again.
            (110 * MIB, false, Some((false, false, false)), false, false),
            (100 * MIB, false, None, false, false),
            (
                100 * MIB - 1,
                false,
                Some((true, false, false)),
                true,
                false,
            ),
        ];
        for (available, drained, expected, low, below) in table {
            assert_eq!(
                observe(available, drained),
                (expected, low, below),
                "{available} drained={drained}"
            );
        }
    }

    #[test]
    fn the_room_above_the_floor_against_what_the_budget_may_take() {
        let needed = |budget| room_for_budget(budget, 64 * MIB);
        assert_eq!(needed(256 * MIB), 768 * MIB + 64 * MIB + 16 * MIB);
        assert_eq!(room_for_budget(u64::MAX, 0), u64::MAX);
        // (available, held, budget) on a 10 GiB filesystem with a 100 MiB floor.
        let table: [(u64, u64, u64, Option<RoomShort>); 5] = [
            // Room for the default budget.
            (2 * GIB, 0, 256 * MIB, None),
            // 900 MiB above the floor, 848 MiB needed.
            (1000 * MIB, 0, 256 * MIB, None),
            // 500 MiB above the floor: short.
            (
                600 * MIB,
                0,
                256 * MIB,
                Some(RoomShort {
                    room: 500 * MIB,
                    needed: needed(256 * MIB),
                }),
            ),
            // What the buffer holds already counts: it reuses it.
            (600 * MIB, 400 * MIB, 256 * MIB, None),
            // Below the floor already, with nothing held: no room at all.
            (
                50 * MIB,
                0,
                MIB,
                Some(RoomShort {
                    room: 0,
                    needed: needed(MIB),
                }),
            ),
        ];
        for (available, held, budget, expected) in table {
            assert_eq!(
                room_short(&FLOOR_100_MIB, space(available), held, budget, 64 * MIB),
                expected,
                "available {available}, held {held}, budget {budget}"
            );
        }
        // No floor: the user chose the disk's end as the limit.
        assert_eq!(
            room_short(&DiskFloor::DISABLED, space(MIB), 0, GIB, 0),
            None
        );
    }

    #[test]
    fn live_records_behind_a_backlog_do_not_keep_the_buffer_from_draining() {
        let part = |catchup_bytes, live_bytes, live_waits_for_backlog| Unprocessed {
            catchup_bytes,
            live_bytes,
            live_waits_for_backlog,
        };
        let table: [(&[Unprocessed], bool); 7] = [
            (&[], true),
            (&[part(0, 0, false)], true),
            // Records that can be processed.
            (&[part(10, 0, false)], false),
            (&[part(0, 10, false)], false),
            // Live records behind a backlog still to be written: they wait for the space.
            (&[part(0, 10, true)], true),
            // Backlog records still to process come first.
            (&[part(10, 10, true)], false),
            // Every partition counts.
            (&[part(0, 10, true), part(0, 5, false)], false),
        ];
        for (partitions, expected) in table {
            assert_eq!(
                nothing_deliverable(partitions.iter().copied()),
                expected,
                "{partitions:?}"
            );
        }
    }

    #[test]
    fn below_the_floor_only_live_lanes_behind_their_backlog_are_held() {
        // (ordered, split, backlog delivered) → live waits for the backlog
        let waits = [
            ((true, true, false), true),
            ((true, true, true), false),
            ((true, false, false), false),
            ((false, true, false), false),
        ];
        for ((ordered, split, delivered), expected) in waits {
            assert_eq!(
                live_waits_for_backlog(ordered, split, delivered),
                expected,
                "ordered={ordered} split={split} delivered={delivered}"
            );
        }
        let part = |live_waits_for_backlog| Unprocessed {
            catchup_bytes: 0,
            live_bytes: 10,
            live_waits_for_backlog,
        };
        let partitions = [("a", part(true)), ("b", part(false)), ("c", part(true))];
        assert_eq!(
            held_below_floor(true, partitions),
            ["a", "c"].into_iter().collect()
        );
        assert!(held_below_floor(false, partitions).is_empty());
    }
}
