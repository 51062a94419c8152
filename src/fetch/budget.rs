//! The byte budget as a pause policy: which partitions a fetcher pauses and resumes.

use std::collections::{BTreeMap, BTreeSet};

/// A pause or resume the fetcher must apply to its consumer (and report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseChange<K> {
    /// The partition.
    pub partition: K,
    /// `true`: pause it; `false`: resume it.
    pub paused: bool,
    /// The partition's unacknowledged bytes in this fetcher's lane.
    pub buffered_bytes: u64,
    /// The share of the budget the partition was measured against.
    pub share: u64,
}

/// Keeps the buffer within its byte budget, one partition at a time.
///
/// The budget is divided evenly over the *slots* — the lanes being fetched, over all
/// partitions and both fetchers — so the buffer as a whole stays within it. A fetcher pauses a
/// partition whose bytes in its lane exceed one share and resumes it at half a share. A
/// partition is paused only for its own bytes: in `Ordered` mode a split partition whose live
/// records cannot be delivered before its backlog pauses its own live lane, never the
/// others'.
#[derive(Debug, Clone, Default)]
pub struct PausePolicy<K> {
    paused: BTreeSet<K>,
}

impl<K: Ord + Clone> PausePolicy<K> {
    /// Nothing paused.
    pub fn new() -> Self {
        Self {
            paused: BTreeSet::new(),
        }
    }

    /// Whether `partition` is paused.
    pub fn is_paused(&self, partition: &K) -> bool {
        self.paused.contains(partition)
    }

    /// Whether any partition is paused.
    pub fn any_paused(&self) -> bool {
        !self.paused.is_empty()
    }

    /// Decides the changes for this round. `usage` holds every partition the fetcher fetches
    /// with its unacknowledged bytes; a partition no longer in it is forgotten (its consumer
    /// assignment is gone, and so is the pause).
    pub fn decide(
        &mut self,
        limit: u64,
        slots: usize,
        usage: &BTreeMap<K, u64>,
    ) -> Vec<PauseChange<K>> {
        self.paused
            .retain(|partition| usage.contains_key(partition));
        let share = limit / slots.max(1) as u64;
        let mut changes = Vec::new();
        for (partition, &bytes) in usage {
            let paused = self.paused.contains(partition);
            let change = if !paused && bytes > share {
                Some(true)
            } else if paused && bytes <= share / 2 {
                Some(false)
            } else {
                None
            };
            if let Some(pause) = change {
                if pause {
                    self.paused.insert(partition.clone());
                } else {
                    self.paused.remove(partition);
                }
                changes.push(PauseChange {
                    partition: partition.clone(),
                    paused: pause,
                    buffered_bytes: bytes,
                    share,
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_above_a_share_and_resumes_below_half() {
        let mut policy = PausePolicy::new();
        let usage = |a, b| BTreeMap::from([("a", a), ("b", b)]);
        // 1000 bytes over 4 slots: 250 each.
        assert_eq!(policy.decide(1000, 4, &usage(100, 200)), vec![]);
        let changes = policy.decide(1000, 4, &usage(251, 200));
        assert_eq!(changes.len(), 1);
        assert_eq!((changes[0].partition, changes[0].paused), ("a", true));
        assert!(policy.is_paused(&"a"));
        assert!(policy.any_paused());
        // Still above half a share: stays paused; the other partition is not affected.
        assert_eq!(policy.decide(1000, 4, &usage(200, 240)), vec![]);
        let changes = policy.decide(1000, 4, &usage(125, 240));
        assert_eq!((changes[0].partition, changes[0].paused), ("a", false));
        assert!(!policy.any_paused());
    }

    #[test]
    fn a_partition_that_leaves_is_forgotten() {
        let mut policy = PausePolicy::new();
        policy.decide(100, 1, &BTreeMap::from([("a", 500)]));
        assert!(policy.is_paused(&"a"));
        assert_eq!(policy.decide(100, 1, &BTreeMap::new()), vec![]);
        assert!(!policy.is_paused(&"a"));
    }
}
