//! One commit cycle over several partitions, as data (`docs/design.md`, "The commit cycle"):
//! which writes go out, and which partitions count as committed given how the writes before
//! went. The group member's commit and the simulation both run it.
//!
//! The main-log writes of every partition go in one request, which may fail as a whole or
//! for some partitions; a partition whose main-log write failed writes nothing after it (a
//! member the group fenced off must not claim live progress in the side log). The side-log
//! writes of the others go out together; a partition whose side-log write failed is not
//! recorded as committed in the buffer, so that the buffer never runs ahead of Kafka.

use super::commit::CommitWrites;
use super::reconcile::{MainLogCommit, SideWrite};

/// The writes of one cycle, one entry per partition.
#[derive(Debug, Clone)]
pub struct CommitCycle<K> {
    partitions: Vec<(K, CommitWrites)>,
}

impl<K: PartialEq> CommitCycle<K> {
    /// A cycle over `partitions` and the writes their plans ask for.
    pub fn new(partitions: Vec<(K, CommitWrites)>) -> Self {
        Self { partitions }
    }

    /// The main-log writes, for one request.
    pub fn mains(&self) -> Vec<(&K, &MainLogCommit)> {
        self.partitions
            .iter()
            .filter_map(|(key, writes)| Some((key, writes.main.as_ref()?)))
            .collect()
    }

    /// Whether the partition at `index` has no main-log write, or its write was not refused.
    fn main_done(&self, index: usize, refused: &[K]) -> bool {
        let (key, writes) = &self.partitions[index];
        writes.main.is_none() || !refused.contains(key)
    }

    /// The side-log writes to send once the main-log request answered, `refused` naming the
    /// partitions whose main-log write failed: `(index, key, write)` of every partition whose
    /// main-log write is done and whose side entry changes.
    pub fn sides(&self, refused: &[K]) -> Vec<(usize, &K, &SideWrite)> {
        self.partitions
            .iter()
            .enumerate()
            .filter(|(index, (_, writes))| {
                writes.side != SideWrite::Keep && self.main_done(*index, refused)
            })
            .map(|(index, (key, writes))| (index, key, &writes.side))
            .collect()
    }

    /// The indices of the partitions whose every write happened, to record as committed:
    /// `refused` their main-log write, `side_failed` (indices) their side-log write.
    pub fn applied(&self, refused: &[K], side_failed: &[usize]) -> Vec<usize> {
        (0..self.partitions.len())
            .filter(|index| self.main_done(*index, refused) && !side_failed.contains(index))
            .collect()
    }

    /// The indices of the partitions with a write that did not happen, the complement of
    /// [`applied`](Self::applied): an assignment defers them (reconciled again later).
    pub fn unapplied(&self, refused: &[K], side_failed: &[usize]) -> Vec<usize> {
        let applied = self.applied(refused, side_failed);
        (0..self.partitions.len())
            .filter(|index| !applied.contains(index))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SideEntry;

    fn main(offset: i64) -> Option<MainLogCommit> {
        Some(MainLogCommit {
            offset,
            metadata: String::new(),
        })
    }

    fn entry() -> SideEntry {
        SideEntry {
            epoch: 1,
            boundary: 10,
            ranges: Vec::new(),
            live_next: 12,
        }
    }

    /// Partition 0: plain; 1: a split that writes both logs; 2: a split with only live
    /// progress (a side write, no main write); 3: a merge.
    fn cycle() -> CommitCycle<i32> {
        CommitCycle::new(vec![
            (
                0,
                CommitWrites {
                    main: main(5),
                    side: SideWrite::Keep,
                },
            ),
            (
                1,
                CommitWrites {
                    main: main(7),
                    side: SideWrite::Write(entry()),
                },
            ),
            (
                2,
                CommitWrites {
                    main: None,
                    side: SideWrite::Write(entry()),
                },
            ),
            (
                3,
                CommitWrites {
                    main: main(9),
                    side: SideWrite::Tombstone,
                },
            ),
        ])
    }

    #[test]
    fn main_log_writes_go_in_one_request() {
        let keys: Vec<i32> = cycle().mains().iter().map(|(key, _)| **key).collect();
        assert_eq!(keys, vec![0, 1, 3]);
    }

    #[test]
    fn the_writes_and_what_counts_committed_by_how_the_others_went() {
        type Case = (
            &'static [i32],
            &'static [usize],
            &'static [i32],
            &'static [usize],
        );
        // (main-log writes refused, side-log writes failed (indices)) ->
        // (side writes sent, partitions recorded committed)
        let cases: &[Case] = &[
            (&[], &[], &[1, 2, 3], &[0, 1, 2, 3]),
            // A refused main-log write: no side write, nothing recorded for it.
            (&[1], &[], &[2, 3], &[0, 2, 3]),
            (&[0, 1, 3], &[], &[2], &[2]),
            // A failed side write: its main write stands in Kafka, but the buffer does not
            // record the cycle for it.
            (&[], &[1], &[1, 2, 3], &[0, 2, 3]),
            (&[3], &[2], &[1, 2], &[0, 1]),
        ];
        let cycle = cycle();
        for (refused, side_failed, sides, applied) in cases {
            let sent: Vec<i32> = cycle
                .sides(refused)
                .iter()
                .map(|(_, key, _)| **key)
                .collect();
            assert_eq!(&sent, sides, "refused {refused:?}");
            assert_eq!(
                &cycle.applied(refused, side_failed),
                applied,
                "refused {refused:?}, side failed {side_failed:?}"
            );
            // Every partition is either applied or not, never both, never neither.
            let unapplied = cycle.unapplied(refused, side_failed);
            let mut all: Vec<usize> = applied.iter().chain(&unapplied).copied().collect();
            all.sort_unstable();
            assert_eq!(
                all,
                vec![0, 1, 2, 3],
                "refused {refused:?}, side failed {side_failed:?}"
            );
        }
    }

    #[test]
    fn a_refusal_of_a_partition_without_a_main_write_changes_nothing_for_it() {
        // Partition 2 writes only its side entry: a refusal naming it cannot have happened
        // to it, and its side write goes out.
        let cycle = cycle();
        let sent: Vec<usize> = cycle.sides(&[2]).iter().map(|(i, _, _)| *i).collect();
        assert!(sent.contains(&2));
        assert!(cycle.applied(&[2], &[]).contains(&2));
    }
}
