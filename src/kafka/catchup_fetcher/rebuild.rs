//! `Role::Rebuild`: the catch-up fetcher's machinery reading again, for their keys, the
//! records of a split partition that the application may have seen before this assignment
//! (`plan::KeyIndex`). Its partitions are those whose index waits, each from where its
//! index got; a partition revoked or assigned again leaves (a new assignment has an index
//! of its own). What a lane proves read goes into the index, never into the buffer.

use super::*;
use crate::engine::RebuildWanted;

/// How often an idle rebuild thread looks for partitions waiting for it.
pub(super) const IDLE: Duration = Duration::from_millis(100);

/// What the rebuild's consumer may prefetch, in KiB (it keeps the keys only).
pub(super) const QUEUE_KIB: &str = "16384";

/// A partition being read for its keys: for which assignment, and up to where.
pub(super) struct Rebuilding {
    generation: u64,
    end: i64,
}

impl Fetcher {
    /// Makes the tracked partitions those whose key index waits for the rebuild.
    pub(super) fn follow_rebuilds(&mut self) {
        let wanted = self.shared.rebuilds_wanted();
        let gone: Vec<PartitionId> = self
            .rebuilding
            .iter()
            .filter(|(key, rebuilding)| {
                !wanted
                    .iter()
                    .any(|want| &want.partition == *key && want.generation == rebuilding.generation)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            self.stop_rebuilding(&key);
        }
        for RebuildWanted {
            partition,
            generation,
            layout,
            left,
        } in wanted
        {
            if self.rebuilding.contains_key(&partition) {
                continue;
            }
            tracing::info!(
                topic = partition.0,
                partition = partition.1,
                from = left.start,
                to = left.end,
                "reading again the keys the application may have seen; the backlog waits for them"
            );
            let range = OffsetRange::new(left.start, left.end);
            self.add(
                partition.clone(),
                Tracked {
                    lane: LanePartition::catchup(layout, left.start, vec![range]),
                },
            );
            // Only what is tracked (`add` leaves out a range already read).
            if self.tracked.contains_key(&partition) {
                self.rebuilding.insert(
                    partition,
                    Rebuilding {
                        generation,
                        end: left.end,
                    },
                );
            }
        }
    }

    /// The keys of what the lane proved read go into the index, and the lane stands at the
    /// proven position (within what it reads).
    pub(super) fn note_keys(&mut self, key: &PartitionId, append: PendingAppend) {
        let Some(rebuilding) = self.rebuilding.get(key) else {
            return self.stop_rebuilding(key);
        };
        let end = rebuilding.end;
        let next = append.next.min(end);
        let within = append.records.partition_point(|record| record.offset < end);
        let notes = key_notes(&append.records[..within]);
        if !self
            .shared
            .rebuild_noted(key, rebuilding.generation, notes, next)
        {
            return self.stop_rebuilding(key);
        }
        self.appended(key, AppendResult::Stored { fetched_next: next });
    }

    /// Leaves `key`: rebuilt, or no longer waited for.
    pub(super) fn stop_rebuilding(&mut self, key: &PartitionId) {
        self.rebuilding.remove(key);
        self.leave(key);
    }
}
