//! The writes that carry out reconciliation decisions, in the order they must reach Kafka and
//! the buffer (`docs/design.md`, "Assigning partitions"): the main log first, then the side
//! log, then the local buffer. The decisions of one assignment go out as one commit cycle
//! ([`CommitCycle`](super::CommitCycle)): every main-log write in one request, then the
//! side-log writes of the partitions whose main-log write went through, then the local step
//! of each partition whose every write happened. A partition whose write failed waits for the
//! next reconciliation, which reads what it left safely, as it reads a crash between any two
//! writes (DESIGN §5): a token without its side entry is stale (reprocess from the group's
//! offset), a side entry without its token is stale, local records are checked against both.
//! The member's shell and the simulation both execute these writes so.

use super::{CommitWrites, Committed, Decision, LocalAction, SplitToken};
use crate::store::PartitionLayout;

/// Whether an assigned partition waits, unreconciled (paused at the log end and reconciled
/// again from the live loop), rather than being decided from what could be read of Kafka.
/// `offset_metadata`: the metadata of the group's offset (`None`: no offset); a partition
/// whose offset carries a split token needs its side entry, which holds its live lane's
/// progress — deciding without it would take the entry for missing and reprocess everything
/// the live lane had processed — so it waits while the side log cannot be read
/// (`side_log_read`); the others are decided without it (an entry without its token is stale
/// anyway). A partition whose records may be of an earlier incarnation of the topic and could
/// not be dropped (`stale_records_kept`) waits too: they must not be reused. (Without the
/// group's offsets nothing can be decided: every partition waits.) A partition decided
/// without the side log may still wait for it: see [`Decision::waits_for_side_log`].
pub fn waits_unreconciled(
    offset_metadata: Option<&str>,
    side_log_read: bool,
    stale_records_kept: bool,
) -> bool {
    let split = offset_metadata.is_some_and(|metadata| SplitToken::decode(metadata).is_some());
    (split && !side_log_read) || stale_records_kept
}

/// What a decision does to the local buffer, once its writes to Kafka happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalStep<'a> {
    /// Keep the buffered records, their committed cursors moved up to what Kafka holds.
    Reuse {
        /// New `committed_next` of the catch-up lane.
        catchup_committed: i64,
        /// New `committed_next` of the live lane.
        live_committed: i64,
    },
    /// Drop the buffered records and lay the partition out afresh.
    Reset {
        /// The layout.
        layout: &'a PartitionLayout,
        /// Why the buffered records cannot be used (`None`: there were none).
        reason: Option<&'a str>,
    },
}

impl Decision {
    /// Whether this decision, made without the side log (`side_log_read` false), waits
    /// unreconciled like [`waits_unreconciled`]'s partitions: it writes to the side log (a new
    /// split's entry, or a tombstone), whose entry for the partition it could not see.
    pub fn waits_for_side_log(&self, side_log_read: bool) -> bool {
        !side_log_read && !matches!(self.side, super::SideWrite::Keep)
    }

    /// The decision's writes to Kafka, for a commit cycle: the main-log commit (a new
    /// split's token), then the side entry written or tombstoned. A side entry to write
    /// without the token of its split would be a bug of `reconcile`: refused.
    pub fn writes(&self) -> Result<CommitWrites, String> {
        if matches!(self.side, super::SideWrite::Write(_)) && self.token.is_none() {
            return Err("a side entry to write without a split token".into());
        }
        Ok(CommitWrites {
            main: self.main_log.clone(),
            side: self.side.clone(),
        })
    }

    /// The decision's step in the local buffer, taken once its writes to Kafka happened.
    pub fn local_step(&self) -> LocalStep<'_> {
        match &self.local {
            LocalAction::Reuse {
                catchup_committed,
                live_committed,
            } => LocalStep::Reuse {
                catchup_committed: *catchup_committed,
                live_committed: *live_committed,
            },
            LocalAction::Reset { reason } => LocalStep::Reset {
                layout: &self.layout,
                reason: reason.as_deref(),
            },
        }
    }

    /// The offset the main log holds once the steps are done: what this decision commits,
    /// else the group's offset (never below the log start `low`), else — no commit at all —
    /// where the live lane starts.
    pub fn main_committed(&self, committed: Option<&Committed>, low: i64) -> i64 {
        match (&self.main_log, committed) {
            (Some(commit), _) => commit.offset,
            (None, Some(committed)) => committed.offset.max(low),
            (None, None) => self.layout.live_from,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{
        CommitCycle, Inputs, MainLogCommit, OffsetReset, SideWrite, SplitSecret, reconcile,
    };

    fn decide(committed: Option<i64>, high: i64) -> Decision {
        let committed = committed.map(|offset| Committed {
            offset,
            metadata: String::new(),
        });
        reconcile(&Inputs {
            committed: committed.as_ref(),
            side: None,
            low: 0,
            high,
            min_lag: Some(100),
            reset: OffsetReset::Earliest,
            local: None,
            fresh_secret: SplitSecret::from_bytes([7; 16]),
        })
    }

    #[test]
    fn a_split_commits_its_token_then_writes_its_side_entry_then_lays_out() {
        // Committed 70, log end 1,070: a backlog of 1,000, over min_lag.
        let decision = decide(Some(70), 1_070);
        let writes = decision.writes().expect("writes");
        let token = decision.token.as_ref().expect("a split's token");
        assert_eq!(
            writes.main,
            Some(MainLogCommit {
                offset: 70,
                metadata: token.encode()
            })
        );
        assert!(matches!(writes.side, SideWrite::Write(_)), "{writes:?}");
        assert!(
            matches!(decision.local_step(), LocalStep::Reset { reason: None, .. }),
            "{:?}",
            decision.local_step()
        );
        assert_eq!(decision.main_committed(None, 0), 70);
    }

    #[test]
    fn a_plain_partition_only_lays_out() {
        let decision = decide(Some(70), 100);
        let writes = decision.writes().expect("writes");
        assert_eq!((writes.main, writes.side), (None, SideWrite::Keep));
        assert!(matches!(
            decision.local_step(),
            LocalStep::Reset { reason: None, .. }
        ));
        let committed = Committed {
            offset: 70,
            metadata: String::new(),
        };
        assert_eq!(decision.main_committed(Some(&committed), 0), 70);
        // Retention passed the group's offset.
        assert_eq!(decision.main_committed(Some(&committed), 90), 90);
    }

    #[test]
    fn only_what_cannot_be_decided_from_what_was_read_waits() {
        let token = decide(Some(70), 1_070).token.expect("a split").encode();
        // (offset metadata, side log read, stale records kept) → waits
        let table = [
            (None, true, false, false),
            (None, false, false, false),
            (Some(""), false, false, false),
            (Some("an application's own metadata"), false, false, false),
            (Some(token.as_str()), true, false, false),
            (Some(token.as_str()), false, false, true),
            (None, true, true, true),
            (Some(token.as_str()), true, true, true),
        ];
        for (metadata, side_log_read, stale_kept, waits) in table {
            assert_eq!(
                waits_unreconciled(metadata, side_log_read, stale_kept),
                waits,
                "{metadata:?}, side log read {side_log_read}, stale records kept {stale_kept}"
            );
        }
    }

    #[test]
    fn a_decision_that_writes_to_an_unread_side_log_waits() {
        let split = decide(Some(70), 1_070);
        let plain = decide(Some(70), 100);
        assert!(split.waits_for_side_log(false));
        assert!(!split.waits_for_side_log(true));
        assert!(!plain.waits_for_side_log(false));
        assert!(!plain.waits_for_side_log(true));
    }

    #[test]
    fn a_side_entry_without_its_token_is_refused() {
        let mut decision = decide(Some(70), 1_070);
        decision.token = None;
        assert!(decision.writes().is_err());
    }

    /// An assignment's decisions as one cycle: a split whose main-log write is refused writes
    /// no side entry and takes no local step; the others go on.
    #[test]
    fn an_assignment_is_one_cycle_and_a_refused_split_stops_before_its_side_entry() {
        let decisions = [
            (0, decide(Some(70), 1_070)),
            (1, decide(Some(70), 100)),
            (2, decide(Some(5), 2_000)),
        ];
        let cycle = CommitCycle::new(
            decisions
                .iter()
                .map(|(key, decision)| Ok((*key, decision.writes()?)))
                .collect::<Result<Vec<_>, String>>()
                .expect("writes"),
        );
        let mains: Vec<i32> = cycle.mains().iter().map(|(key, _)| **key).collect();
        assert_eq!(mains, vec![0, 2], "one request for both splits");
        let sides: Vec<i32> = cycle.sides(&[2]).iter().map(|(_, key, _)| **key).collect();
        assert_eq!(sides, vec![0]);
        assert_eq!(cycle.applied(&[2], &[]), vec![0, 1]);
        assert_eq!(cycle.applied(&[], &[0]), vec![1, 2]);
    }
}
