//! Which partitions a fetcher keeps paused because the buffer may not take their records: all
//! of them while it may not be written at all (the disk below its floor, a failed write), and
//! the live lanes held below the floor while their backlog waits
//! ([`held_below_floor`](super::held_below_floor)). The byte budget's own pauses
//! ([`PausePolicy`](super::PausePolicy)) apply only where no stop does; the fetcher tells its
//! consumer what [`WriteStops::round`] returns.

use std::collections::BTreeSet;

/// The stops a fetcher applied, as of its last round.
#[derive(Debug, Clone)]
pub struct WriteStops<K> {
    /// The partitions fetched last round: one that appears (again) is set once, because
    /// librdkafka keeps an application pause across a revoke and a new assignment.
    known: BTreeSet<K>,
    /// Every partition is paused: the buffer may not be written.
    stopped: bool,
    /// These partitions are paused: held below the floor.
    held: BTreeSet<K>,
}

impl<K: Ord + Clone> Default for WriteStops<K> {
    fn default() -> Self {
        Self {
            known: BTreeSet::new(),
            stopped: false,
            held: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone> WriteStops<K> {
    /// No stop, no partition seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a stop keeps `key` paused (the budget's own pauses apart).
    pub fn stops(&self, key: &K) -> bool {
        self.stopped || self.held.contains(key)
    }

    /// Forgets `key`, paused out of band: the next round sets it like a new partition.
    pub fn forget(&mut self, key: &K) {
        self.known.remove(key);
    }

    /// One round: the partitions the fetcher fetches, whether the buffer may not be written
    /// (`stopped`), the partitions held below the floor (none while stopped), and whether the
    /// budget pauses a partition. Returns the pauses (`true`) and resumes (`false`) to apply,
    /// one at most per partition: a partition whose stop changed, or seen for the first time
    /// (again), gets its stop's state, or the budget's where no stop holds it.
    pub fn round(
        &mut self,
        fetching: impl IntoIterator<Item = K>,
        stopped: bool,
        held: BTreeSet<K>,
        budget_pauses: impl Fn(&K) -> bool,
    ) -> Vec<(K, bool)> {
        let fetching: BTreeSet<K> = fetching.into_iter().collect();
        let held = if stopped { BTreeSet::new() } else { held };
        let changes = fetching
            .iter()
            .filter(|key| {
                stopped != self.stopped
                    || held.contains(*key) != self.held.contains(*key)
                    || !self.known.contains(*key)
            })
            .map(|key| {
                let stop = stopped || held.contains(key);
                (key.clone(), stop || budget_pauses(key))
            })
            .collect();
        self.known = fetching;
        self.stopped = stopped;
        self.held = held;
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(keys: &[u8]) -> BTreeSet<u8> {
        keys.iter().copied().collect()
    }

    /// Whether writes are stopped, the partitions held, and the changes a round applies.
    type Expected = (bool, &'static [u8], &'static [(u8, bool)]);

    /// Rounds of partitions 1 and 2 (the budget pausing 2), with what each round applies.
    #[test]
    fn stops_pause_and_release_to_the_budget() {
        let mut stops = WriteStops::new();
        let budget_pauses = |key: &u8| *key == 2;
        // (stopped, held, the changes applied)
        let table: [Expected; 8] = [
            // New partitions are set once (librdkafka keeps an old pause): the budget's state.
            (false, &[], &[(1, false), (2, true)]),
            (false, &[], &[]),
            // The buffer may not be written: everything pauses.
            (true, &[], &[(1, true), (2, true)]),
            (true, &[1], &[]),
            // Writing again, 1 held below the floor: 2 goes back to the budget's pause.
            (false, &[1], &[(1, true), (2, true)]),
            (false, &[1], &[]),
            // The hold ends: 1 resumes.
            (false, &[], &[(1, false)]),
            // 2 held: only the stop that changed is applied.
            (false, &[2], &[(2, true)]),
        ];
        for (round, (stopped, held, expected)) in table.into_iter().enumerate() {
            let changes = stops.round([1, 2], stopped, set(held), budget_pauses);
            assert_eq!(changes, expected, "round {round}");
            for key in [1, 2] {
                assert_eq!(
                    stops.stops(&key),
                    stopped || held.contains(&key),
                    "round {round}, partition {key}"
                );
            }
        }
    }

    #[test]
    fn a_partition_that_comes_back_gets_its_stop_once() {
        let mut stops = WriteStops::new();
        let no_budget = |_: &u8| false;
        assert_eq!(stops.round([1], true, set(&[]), no_budget), [(1, true)]);
        // 2 appears while writes are stopped: paused at once; 1 leaves.
        assert_eq!(stops.round([2], true, set(&[]), no_budget), [(2, true)]);
        // 1 comes back held: paused; writing resumes for 2.
        assert_eq!(
            stops.round([1, 2], false, set(&[1]), no_budget),
            [(1, true), (2, false)]
        );
        // A partition paused out of band is set again.
        stops.forget(&2);
        assert_eq!(
            stops.round([1, 2], false, set(&[1]), no_budget),
            [(2, false)]
        );
    }

    /// A partition set again after it was paused out of band (its damaged lane refetched)
    /// gets the budget's state, as a partition whose stop changed does. (In the fetchers its
    /// new runtime counts no bytes, and the budget resumes it in the same round.)
    #[test]
    fn a_partition_set_again_keeps_the_budget_s_pause() {
        let mut stops = WriteStops::new();
        let budget_pauses = |key: &u8| *key == 2;
        assert_eq!(
            stops.round([1, 2], false, set(&[]), budget_pauses),
            [(1, false), (2, true)]
        );
        stops.forget(&2);
        assert_eq!(
            stops.round([1, 2], false, set(&[]), budget_pauses),
            [(2, true)]
        );
        // While writes are stopped the stop decides: a partition set again is paused, the
        // others are left as they are.
        assert_eq!(
            stops.round([1, 2], true, set(&[]), |_: &u8| false),
            [(1, true), (2, true)]
        );
        stops.forget(&1);
        assert_eq!(
            stops.round([1, 2], true, set(&[]), |_: &u8| false),
            [(1, true)]
        );
    }
}
