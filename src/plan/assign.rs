//! The writes that carry out a reconciliation decision, in the order they must reach Kafka and
//! the buffer (`docs/design.md`, "Assigning a partition"): the main log first, then the side
//! log, then the local buffer. A crash between any two leaves a state the next reconciliation
//! reads safely (DESIGN §5): a token without its side entry is stale (reprocess from the
//! group's offset), a side entry without its token is stale, local records are checked
//! against both. The member's shell and the simulation both execute these steps in order.

use super::{Committed, Decision, LocalAction, MainLogCommit, SideEntry, SideWrite, SplitToken};
use crate::store::PartitionLayout;

/// One write of an assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignStep<'a> {
    /// Commit to the main log.
    CommitMain(&'a MainLogCommit),
    /// Write the side entry, sealed under the split's secret.
    WriteSide(&'a SideEntry, &'a SplitToken),
    /// Delete the side entry.
    TombstoneSide,
    /// Keep the buffered records, their committed cursors moved up to what Kafka holds.
    ReuseLocal {
        /// New `committed_next` of the catch-up lane.
        catchup_committed: i64,
        /// New `committed_next` of the live lane.
        live_committed: i64,
    },
    /// Drop the buffered records and lay the partition out afresh.
    ResetLocal {
        /// The layout.
        layout: &'a PartitionLayout,
        /// Why the buffered records cannot be used (`None`: there were none).
        reason: Option<&'a str>,
    },
}

impl Decision {
    /// The writes of this decision, in order. A side entry to write without the token of its
    /// split would be a bug of `reconcile`: refused.
    pub fn steps(&self) -> Result<Vec<AssignStep<'_>>, String> {
        let mut steps = Vec::with_capacity(3);
        if let Some(commit) = &self.main_log {
            steps.push(AssignStep::CommitMain(commit));
        }
        match &self.side {
            SideWrite::Keep => {}
            SideWrite::Write(entry) => {
                let token = self
                    .token
                    .as_ref()
                    .ok_or("a side entry to write without a split token")?;
                steps.push(AssignStep::WriteSide(entry, token));
            }
            SideWrite::Tombstone => steps.push(AssignStep::TombstoneSide),
        }
        steps.push(match &self.local {
            LocalAction::Reuse {
                catchup_committed,
                live_committed,
            } => AssignStep::ReuseLocal {
                catchup_committed: *catchup_committed,
                live_committed: *live_committed,
            },
            LocalAction::Reset { reason } => AssignStep::ResetLocal {
                layout: &self.layout,
                reason: reason.as_deref(),
            },
        });
        Ok(steps)
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
    use crate::plan::{Inputs, OffsetReset, SplitSecret, reconcile};

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
        let steps = decision.steps().expect("steps");
        assert!(
            matches!(
                steps.as_slice(),
                [
                    AssignStep::CommitMain(_),
                    AssignStep::WriteSide(_, _),
                    AssignStep::ResetLocal { .. }
                ]
            ),
            "{steps:?}"
        );
        assert_eq!(decision.main_committed(None, 0), 70);
    }

    #[test]
    fn a_plain_partition_only_lays_out() {
        let decision = decide(Some(70), 100);
        let steps = decision.steps().expect("steps");
        assert!(
            matches!(
                steps.as_slice(),
                [AssignStep::ResetLocal { reason: None, .. }]
            ),
            "{steps:?}"
        );
        let committed = Committed {
            offset: 70,
            metadata: String::new(),
        };
        assert_eq!(decision.main_committed(Some(&committed), 0), 70);
        // Retention passed the group's offset.
        assert_eq!(decision.main_committed(Some(&committed), 90), 90);
    }

    #[test]
    fn a_side_entry_without_its_token_is_refused() {
        let mut decision = decide(Some(70), 1_070);
        decision.token = None;
        assert!(decision.steps().is_err());
    }
}
