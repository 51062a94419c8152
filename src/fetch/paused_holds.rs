//! Which partitions held to their read-ahead a fetcher pauses: those whose queue another
//! partition shares. A partition alone in its queue is held by leaving the queue untaken, and
//! librdkafka stops fetching it once the queue is full; what waits in a shared queue for a held
//! partition cannot be left while the other partitions' is taken, so the partition is paused
//! (librdkafka drops what it prefetched of it, and fetches again from its position when it
//! resumes). A pause for a hold ranks with the fetcher's other pauses ([`WriteStops`],
//! [`PausePolicy`]): a partition resumes only once none of them pauses it.
//!
//! [`WriteStops`]: super::WriteStops
//! [`PausePolicy`]: super::PausePolicy

use std::collections::BTreeSet;

/// The partitions a fetcher paused for their read-ahead, as of its last round.
#[derive(Debug, Clone)]
pub struct PausedHolds<K> {
    paused: BTreeSet<K>,
}

impl<K: Ord + Clone> Default for PausedHolds<K> {
    fn default() -> Self {
        Self {
            paused: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone> PausedHolds<K> {
    /// None paused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `key` is paused for its read-ahead.
    pub fn contains(&self, key: &K) -> bool {
        self.paused.contains(key)
    }

    /// One round. `wanted`: the partitions fetched that are held to their read-ahead in a
    /// queue another partition shares; `fetching`: whether a partition is still fetched;
    /// `paused_otherwise`: whether another pause keeps it paused. Returns the pauses (`true`)
    /// and resumes (`false`) to apply: a partition that starts being wanted is paused, one
    /// that stops is resumed, each unless another pause already holds it, and one no longer
    /// fetched is forgotten (it is unassigned; it is set again when it comes back).
    pub fn round(
        &mut self,
        wanted: BTreeSet<K>,
        fetching: impl Fn(&K) -> bool,
        paused_otherwise: impl Fn(&K) -> bool,
    ) -> Vec<(K, bool)> {
        let changes = wanted
            .symmetric_difference(&self.paused)
            .filter(|key| fetching(key) && !paused_otherwise(key))
            .map(|key| (key.clone(), wanted.contains(key)))
            .collect();
        self.paused = wanted;
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(keys: &[i32]) -> BTreeSet<i32> {
        keys.iter().copied().collect()
    }

    #[test]
    fn holds_in_shared_queues_pause_and_resume_where_no_other_pause_holds() {
        // (paused before, wanted, fetched, paused otherwise) → changes, paused after
        type Case = (
            &'static [i32],
            &'static [i32],
            &'static [i32],
            &'static [i32],
            &'static [(i32, bool)],
        );
        let cases: &[Case] = &[
            // A hold begins: paused.
            (&[], &[1], &[1, 2], &[], &[(1, true)]),
            // It goes on: nothing to do.
            (&[1], &[1], &[1, 2], &[], &[]),
            // It ends: resumed.
            (&[1], &[], &[1, 2], &[], &[(1, false)]),
            // It ends while the budget (or a stop) pauses the partition: stays paused.
            (&[1], &[], &[1, 2], &[1], &[]),
            // It begins while another pause holds the partition: already paused.
            (&[], &[1], &[1, 2], &[1], &[]),
            // No longer fetched: forgotten, neither resumed nor paused.
            (&[1], &[], &[2], &[], &[]),
            // Several at once, in key order.
            (&[1, 3], &[2, 3], &[1, 2, 3], &[], &[(1, false), (2, true)]),
        ];
        for (before, wanted, fetched, others, expected) in cases {
            let mut holds = PausedHolds::new();
            holds.round(set(before), |_| true, |_| false);
            let fetched = set(fetched);
            let others = set(others);
            let changes = holds.round(
                set(wanted),
                |key| fetched.contains(key),
                |key| others.contains(key),
            );
            assert_eq!(
                changes,
                expected.to_vec(),
                "before {before:?}, wanted {wanted:?}, fetched {fetched:?}, others {others:?}"
            );
            for key in [1, 2, 3] {
                assert_eq!(holds.contains(&key), wanted.contains(&key), "{key}");
            }
        }
    }
}
