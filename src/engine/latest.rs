//! `Mode::Latest` in the runtime: the fetchers note the keys they append, the rebuild
//! notes the keys of what earlier processes may have delivered, and the reader asks the
//! partition's [`KeyIndex`] about each record it reads (see `reader`) and again about each
//! backlog record it hands out.

use std::ops::Range;

use super::*;

/// Keys and offsets of records, noted into a partition's index.
pub(crate) type KeyNotes = Vec<(Box<[u8]>, i64)>;

/// A partition whose key index waits for the rebuild: its assignment and the offsets left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RebuildWanted {
    pub partition: PartitionId,
    pub generation: u64,
    /// The partition's layout (what the reading lane names; it appends nothing).
    pub layout: crate::store::LayoutId,
    pub left: Range<i64>,
}

impl Shared {
    /// The assignment whose key index notes appends to `key` (a split partition in
    /// `Mode::Latest`), if any: only then are their keys copied out before the append.
    pub fn indexes_keys(&self, key: &PartitionId) -> Option<u64> {
        if self.config.mode != Mode::Latest {
            return None;
        }
        self.partitions()
            .get(key)
            .filter(|runtime| runtime.latest.is_some())
            .map(|runtime| runtime.generation)
    }

    /// Notes records appended to `key`'s buffer (the append succeeded: the records are the
    /// current layout's and will be handed out or skipped in their lane's order) into the
    /// index of assignment `generation` — not a later one's (a topic recreated meanwhile
    /// has other records at those offsets).
    pub fn note_keys(&self, key: &PartitionId, generation: u64, notes: KeyNotes) {
        if let Some(index) = self
            .partitions()
            .get_mut(key)
            .filter(|runtime| runtime.generation == generation)
            .and_then(|runtime| runtime.latest.as_mut())
        {
            for (noted, offset) in notes {
                index.note(Some(&noted), offset);
            }
        }
    }

    /// `Mode::Latest`: whether the backlog record `delivery`, read into the reader's queue
    /// earlier, must not be handed out now: superseded since (a newer record of its key
    /// handed out or buffered meanwhile: it is acknowledged here), or of an assignment that
    /// ended meanwhile (its partition's next owner hands it out, or a newer record of its
    /// key, after what this one may have handed out).
    pub fn withheld_at_hand_out(&self, delivery: &Delivery) -> bool {
        let mut partitions = self.partitions();
        let Some(runtime) = partitions
            .get_mut(&(delivery.topic.to_string(), delivery.partition))
            .filter(|runtime| runtime.generation == delivery.generation)
        else {
            return true;
        };
        let superseded = runtime
            .latest
            .as_ref()
            .is_some_and(|index| index.superseded(delivery.key.as_deref(), delivery.offset));
        if superseded {
            let freed = runtime.acknowledge(lane_index(Lane::Catchup), delivery.offset);
            drop(partitions);
            self.add_processed(freed);
            // (Counted delivered when it was read: the two counters overlap by these.)
            telemetry::records_superseded(&self.group, Lane::Catchup.as_str(), 1);
        }
        superseded
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

    /// Forgets what this process handed out of `topic`'s live lanes (of `partition` only,
    /// if given): the topic was deleted and created again, or may have been, and its offsets
    /// start over (a horizon above the new log end would hold the backlog until the log
    /// grows past it).
    pub fn forget_live_handed(&self, topic: &str, partition: Option<i32>) {
        self.live_handed()
            .retain(|(handed_topic, handed_partition), _| {
                handed_topic != topic || partition.is_some_and(|p| p != *handed_partition)
            });
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
                    layout: runtime.live.cursor().layout(),
                    left,
                })
            })
            .collect()
    }

    /// The rebuild read `notes` and everything else below `next` of assignment `generation`
    /// of `key`; wakes the reader once the catch-up lane may deliver. Whether that
    /// assignment's index is still there (else the rebuild of it stops).
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
            return false;
        };
        for (noted, offset) in notes {
            index.note(Some(&noted), offset);
        }
        let waited = !index.catchup_may_deliver();
        index.rebuilt_to(next);
        if waited && index.catchup_may_deliver() {
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
        true
    }
}

/// The keys and offsets of `records` that have a key.
pub(crate) fn key_notes(records: &[crate::store::Record]) -> KeyNotes {
    records
        .iter()
        .filter_map(|record| Some((record.key.as_deref()?.into(), record.offset)))
        .collect()
}
