//! The buffer's byte budget, applied by each fetcher to its own consumer: the decisions come
//! from [`PausePolicy`]; this only pauses, resumes and reports.

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use std::collections::BTreeSet;

use crate::engine::types::Event;
use crate::engine::{PartitionId, Shared};
use crate::fetch::PausePolicy;
use crate::store::Lane;

/// One fetcher's side of the byte budget.
pub(crate) struct Budget {
    fetcher: &'static str,
    lane: Lane,
    limit: u64,
    policy: PausePolicy<PartitionId>,
    /// The partitions seen last round: one that appears (again) is resumed once, because
    /// librdkafka keeps an application pause across a revoke and a new assignment.
    known: BTreeSet<PartitionId>,
}

impl Budget {
    pub fn new(fetcher: &'static str, lane: Lane, limit: u64) -> Self {
        Self {
            fetcher,
            lane,
            limit,
            policy: PausePolicy::new(),
            known: BTreeSet::new(),
        }
    }

    /// Whether the budget holds `key` paused.
    pub fn is_paused(&self, key: &PartitionId) -> bool {
        self.policy.is_paused(key)
    }

    /// Pauses and resumes the partitions of `consumer` that `fetching` says it fetches,
    /// by their bytes in this fetcher's lane.
    pub fn apply<C: ConsumerContext>(
        &mut self,
        shared: &Shared,
        consumer: &BaseConsumer<C>,
        fetching: impl Fn(&PartitionId) -> bool,
    ) {
        let mut usage = shared.buffered_by_partition(self.lane);
        usage.retain(|key, _| fetching(key));
        for (topic, partition) in usage.keys().filter(|key| !self.known.contains(*key)) {
            let mut list = TopicPartitionList::new();
            list.add_partition(topic, *partition);
            let _ = consumer.resume(&list);
        }
        self.known = usage.keys().cloned().collect();
        let changes = self
            .policy
            .decide(self.limit, shared.budget_slots(), &usage);
        for change in changes {
            let (topic, partition) = &change.partition;
            let mut list = TopicPartitionList::new();
            list.add_partition(topic, *partition);
            let result = if change.paused {
                consumer.pause(&list)
            } else {
                consumer.resume(&list)
            };
            if let Err(err) = result {
                shared.emit(Event::Error {
                    message: format!(
                        "{} fetcher: pausing or resuming {topic}/{partition}: {err}",
                        self.fetcher
                    ),
                });
            }
            tracing::debug!(
                fetcher = self.fetcher,
                topic,
                partition,
                paused = change.paused,
                buffered = change.buffered_bytes,
                share = change.share,
                "byte budget"
            );
            shared.emit(Event::Backpressure {
                fetcher: self.fetcher.into(),
                topic: topic.clone(),
                partition: *partition,
                paused: change.paused,
                buffered_bytes: change.buffered_bytes,
                share: change.share,
            });
        }
    }
}
