//! The fetchers' decisions, free of I/O (DESIGN §7): what a polled message, an end of
//! partition, an error or a position proves, what to append, when to reposition a consumer,
//! which partitions to pause, and when the disk is too full to write. The rdkafka adapters in `kafka` feed these state machines
//! with what the client reports and carry out the actions they return; the simulation and
//! the fuzz target drive the very same code without a broker.
//!
//! The rule they implement is invariant 8: *gaps are proven, never inferred*. A fetcher's
//! [`FetchCursor`] follows one partition through one positioning of its consumer (a
//! *generation*); only what that generation polled, one message after the other, proves
//! offsets fetched. A poll error, a refused append or a repositioning ends the chain, and
//! fetching resumes exactly where the buffer stands.

mod budget;
mod cursor;
mod disk;
mod hold;
mod lane;
mod paused_holds;
mod poll_error;
mod round;
mod schedule;
mod write_stops;

pub use budget::{
    PauseChange, PausePolicy, QueueOwner, QueueTake, READ_AHEAD_DIVISOR, next_run, queue_take,
    read_ahead_bytes, read_ahead_room, read_ahead_share,
};
pub use cursor::{AppendResult, FetchCursor, PendingAppend, write_failure};
pub use disk::{
    DiskChange, DiskFloor, DiskGuard, DiskSpace, RoomShort, Unprocessed, held_below_floor,
    live_waits_for_backlog, nothing_deliverable, room_for_budget, room_short,
};
pub use hold::{HOLD_FIRST, HOLD_MAX, Hold, Standing, standing};
pub use lane::{AfterOutOfRange, LanePartition, Polled};
pub use paused_holds::PausedHolds;
pub use poll_error::{FatalKind, PollErrorKind, classify_poll_error, fatal_kind};
pub use round::Round;
pub use schedule::{Due, Facts, Schedule, TrimWatch, early_commit_bytes};
pub use write_stops::WriteStops;

/// A record at `offset` with no key or payload, for the fetch layer's tests.
#[cfg(test)]
pub(crate) fn test_record(offset: i64) -> crate::store::Record {
    crate::store::Record {
        offset,
        timestamp: crate::store::Timestamp::NotAvailable,
        key: None,
        payload: None,
        headers: Vec::new(),
    }
}
