//! Records of a partition this member does not own: kept while a reassignment could still
//! reuse them, discarded once the group's commit shows they never can.
//!
//! A revoke keeps a partition's records (an eager rebalance or a rolling restart hands most
//! partitions straight back), and so does a crash (the partitions a restarted member held
//! before may go elsewhere). Reconciliation decides about reuse only at the next assignment;
//! this decides, from what Kafka shows meanwhile, when waiting for one is pointless: the
//! same rule [`local_action`](super::local_action) applies at assignment, where it can be
//! told without the side log and the watermarks, and nothing else.

use super::{Committed, SplitToken};
use crate::store::PartitionState;

/// What to do with the buffered records of a partition that is not assigned here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnownedAction {
    /// A reassignment may reuse them.
    Keep,
    /// They can never be reused: discard them (the reason goes into the event).
    Discard {
        /// Why they can never be reused.
        reason: String,
    },
}

/// Decides about the records of a partition not assigned here, from its buffered state,
/// the group's committed offset and metadata (`None`: nothing committed, or unreadable),
/// and whether its topic is still subscribed.
pub fn unowned_action(
    local: &PartitionState,
    committed: Option<&Committed>,
    subscribed: bool,
) -> UnownedAction {
    let discard = |reason: String| UnownedAction::Discard { reason };
    if !subscribed {
        return discard("its topic is no longer subscribed".into());
    }
    let Some(committed) = committed else {
        return UnownedAction::Keep;
    };
    let local_epoch = local.layout.epoch;
    match SplitToken::decode(&committed.metadata) {
        Some(token) if token.epoch != local_epoch => discard(format!(
            "the group is in split epoch {}, the buffer holds epoch {local_epoch}",
            token.epoch
        )),
        // The same split, continued by another member: its live progress is in the side
        // log; the records stay until the split ends or a reassignment decides.
        Some(_) => UnownedAction::Keep,
        None if SplitToken::is_any_version(&committed.metadata) => {
            discard("the group's split token is of an earlier version".into())
        }
        None if local_epoch != 0 => discard(format!(
            "the group is not split any more, the buffer holds split epoch {local_epoch}"
        )),
        None if committed.offset >= local.live.fetched_next => discard(format!(
            "the group committed {}, past everything buffered (up to {})",
            committed.offset, local.live.fetched_next
        )),
        None if committed.offset < local.live.committed_next => discard(format!(
            "the group committed {}, before the buffer's processed position {}",
            committed.offset, local.live.committed_next
        )),
        None => UnownedAction::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SplitSecret;
    use crate::store::PartitionLayout;

    fn plain(committed_next: i64, fetched_next: i64) -> PartitionState {
        let mut state = PartitionState::new(PartitionLayout::plain(0));
        state.live.retained_from = committed_next;
        state.live.committed_next = committed_next;
        state.live.fetched_next = fetched_next;
        state
    }

    fn split(epoch: u64) -> PartitionState {
        PartitionState::new(PartitionLayout::split(epoch, 0, 100))
    }

    fn commit(offset: i64, metadata: String) -> Committed {
        Committed { offset, metadata }
    }

    fn token(epoch: u64) -> String {
        SplitToken {
            epoch,
            from: 0,
            boundary: 100,
            secret: SplitSecret::from_hex(&"07".repeat(16)).expect("32 hex digits"),
        }
        .encode()
    }

    #[test]
    fn decisions() {
        let keep = UnownedAction::Keep;
        let cases: Vec<(&str, PartitionState, Option<Committed>, bool, bool)> = vec![
            // (case, local, committed, subscribed, discard?)
            ("unsubscribed", plain(10, 50), None, false, true),
            ("nothing committed", plain(10, 50), None, true, false),
            (
                "plain, inside",
                plain(10, 50),
                Some(commit(30, String::new())),
                true,
                false,
            ),
            (
                "plain, at processed",
                plain(10, 50),
                Some(commit(10, String::new())),
                true,
                false,
            ),
            (
                "plain, at fetched",
                plain(10, 50),
                Some(commit(50, String::new())),
                true,
                true,
            ),
            (
                "plain, past",
                plain(10, 50),
                Some(commit(70, String::new())),
                true,
                true,
            ),
            (
                "plain, moved back",
                plain(10, 50),
                Some(commit(5, String::new())),
                true,
                true,
            ),
            (
                "plain local, split group",
                plain(10, 50),
                Some(commit(10, token(3))),
                true,
                true,
            ),
            (
                "same split",
                split(3),
                Some(commit(10, token(3))),
                true,
                false,
            ),
            (
                "other split",
                split(3),
                Some(commit(10, token(4))),
                true,
                true,
            ),
            (
                "split ended",
                split(3),
                Some(commit(120, String::new())),
                true,
                true,
            ),
            (
                "old token",
                plain(10, 50),
                Some(commit(10, "catchup/1 e=1 f=0 b=100".into())),
                true,
                true,
            ),
        ];
        for (case, local, committed, subscribed, discard) in cases {
            let action = unowned_action(&local, committed.as_ref(), subscribed);
            assert_eq!(action != keep, discard, "{case}: {action:?}");
        }
    }
}
