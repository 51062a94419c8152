//! `Mode::Latest` in the runtime: the fetchers note the keys they append, the rebuild
//! notes the keys of what earlier processes may have delivered, and the reader asks the
//! partition's [`KeyIndex`] about each record it hands out (see `reader`).

use std::ops::Range;

use super::*;

/// Keys and offsets of records, noted into a partition's index.
pub(crate) type KeyNotes = Vec<(Box<[u8]>, i64)>;

/// A partition whose key index waits for the rebuild: its assignment and the offsets left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RebuildWanted {
    pub partition: PartitionId,
    pub generation: u64,
    pub left: Range<i64>,
}

impl Shared {
    /// Whether appends to `key` are noted in a key index (a split partition in
    /// `Mode::Latest`): only then are their keys copied out before the append.
    pub fn indexes_keys(&self, key: &PartitionId) -> bool {
        self.config.mode == Mode::Latest
            && self
                .partitions()
                .get(key)
                .is_some_and(|runtime| runtime.latest.is_some())
    }

    /// The offset after the last live record this process handed out of `key`, if any.
    pub fn live_handed_next(&self, key: &PartitionId) -> Option<i64> {
        self.live_handed().get(key).copied()
    }

    /// Records that the live lane of `key` handed out records below `next`.
    pub(super) fn live_handed_to(&self, key: &PartitionId, next: i64) {
        let mut handed = self.live_handed();
        match handed.get_mut(key) {
            Some(handed_next) => *handed_next = (*handed_next).max(next),
            None => {
                handed.insert(key.clone(), next);
            }
        }
    }

    fn live_handed(&self) -> MutexGuard<'_, HashMap<PartitionId, i64>> {
        self.live_handed_next
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes records appended to `key`'s buffer (the append succeeded: the records are the
    /// current layout's and will be handed out or skipped in their lane's order).
    pub fn note_keys(&self, key: &PartitionId, notes: KeyNotes) {
        if let Some(index) = self
            .partitions()
            .get_mut(key)
            .and_then(|runtime| runtime.latest.as_mut())
        {
            for (noted, offset) in notes {
                index.note(Some(&noted), offset);
            }
        }
    }

    /// The partitions whose key index waits for records to be read again from Kafka.
    pub fn rebuilds_wanted(&self) -> Vec<RebuildWanted> {
        self.partitions()
            .iter()
            .filter_map(|(partition, runtime)| {
                let left = runtime.latest.as_ref()?.rebuild_left()?;
                Some(RebuildWanted {
                    partition: partition.clone(),
                    generation: runtime.generation,
                    left,
                })
            })
            .collect()
    }

    /// The rebuild read `notes` and everything else below `next` of assignment `generation`
    /// of `key`; wakes the reader once the catch-up lane may deliver. Whether the
    /// partition's rebuild is complete (or no longer wanted).
    pub fn rebuild_noted(
        &self,
        key: &PartitionId,
        generation: u64,
        notes: KeyNotes,
        next: i64,
    ) -> bool {
        let mut partitions = self.partitions();
        let Some(index) = partitions
            .get_mut(key)
            .filter(|runtime| runtime.generation == generation)
            .and_then(|runtime| runtime.latest.as_mut())
        else {
            return true;
        };
        for (noted, offset) in notes {
            index.note(Some(&noted), offset);
        }
        index.rebuilt_to(next);
        let done = index.catchup_may_deliver();
        if done {
            tracing::info!(
                topic = key.0,
                partition = key.1,
                keys = index.keys(),
                index_bytes = index.cost_bytes(),
                "key index rebuilt: the catch-up lane delivers again"
            );
            drop(partitions);
            self.notify.notify_waiters();
        }
        done
    }
}

/// The keys and offsets of `records` that have a key.
pub(crate) fn key_notes(records: &[crate::store::Record]) -> KeyNotes {
    records
        .iter()
        .filter_map(|record| Some((record.key.as_deref()?.into(), record.offset)))
        .collect()
}
