//! Pure decisions, no I/O: the split token and side-entry formats, reconciliation on
//! assignment, what becomes of records of partitions not owned, and the tracking of acknowledged offsets. The Kafka adapters gather inputs,
//! call these functions and apply what they return; the table tests and model tests drive
//! them directly.

mod acks;
mod assign;
mod client_outage;
mod commit;
mod cycle;
mod hold_notice;
mod idle_reads;
mod incarnation;
mod lag;
mod lane_account;
mod latest;
mod progress;
mod reachability;
mod reconcile;
mod refusal;
mod secret;
mod side_entry;
mod subscription;
mod token;
mod unowned;

pub use acks::{AckTracker, COMMIT_WAIT_FLOOR, may_read, reader_waits_for_commits};
pub use assign::{LocalStep, waits_unreconciled};
pub use client_outage::{ClientOutage, OWN_PROBE_EVERY, REBOOTSTRAP_AFTER};
pub use commit::{CommitPlan, CommitWrites, Progress, plan_commit};
pub use cycle::CommitCycle;
pub use hold_notice::{HOLD_WARN_AFTER, HoldLog, HoldNotice};
pub use idle_reads::{AppendCounts, IdleReads, ReadSlot, SWEEP_EVERY};
pub use incarnation::incarnation_unknown;
pub use lag::{SideStatus, TrueLag, true_lag};
pub use lane_account::{LaneAccount, commit_landed, commit_planned};
pub use latest::{ENTRY_OVERHEAD_BYTES, KeyIndex, Verdict};
pub use progress::{BacklogRate, RATE_WINDOW, backlog_left, live_lag, live_lag_seconds};
pub use reachability::{Announce, CONFIRM_AFTER, Reachability};
pub use reconcile::{
    Committed, Decision, Inputs, LocalAction, MainLogCommit, OffsetReset, PlanEvent, SideValue,
    SideWrite, clip_ranges, local_action, reconcile, trusted_side_entry,
};
pub use refusal::{REFUSAL_GRACE, Refusal};
pub use secret::SplitSecret;
pub use side_entry::{
    SIDE_PARTITIONS, SealedSideEntry, SideEntry, parse_side_key, side_key, side_partition,
};
pub use subscription::check_subscription;
pub use token::{MAX_METADATA_BYTES, SplitToken};
pub use unowned::{UnownedAction, unowned_action};

#[cfg(test)]
mod reconcile_tests;
