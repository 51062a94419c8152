//! The group member's partitions each fetched into a queue of their own and taken in runs
//! (`rd_kafka_consume_batch_queue`), where one `poll` per message read the clock and took
//! librdkafka's queue lock for every record.
//!
//! The consumer queue stays the member's: rebalances, group errors, and the messages of any
//! partition whose queue could not be split. A partition's queue is split in the rebalance
//! callback before the partition is assigned (`SplitQueue`: split later, messages already on
//! their way to the consumer queue could arrive after later ones were taken here), and let go
//! when the partition is revoked. Each round takes the partitions' queues after the consumer
//! queue, in turn from a starting partition that moves each round. Rebalances run only in the
//! consumer queue's `poll`, so what a partition's queue holds was fetched under the assignment
//! its runtime has while the round takes it (librdkafka drops what an earlier assignment
//! fetched: its version is outdated).
//!
//! The batch call moves the position one past an error's offset (librdkafka issue 4844): an
//! error taken here is handed on with the offset it names (`Polled::from_error`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::LiveContext;
use super::poll::LiveRound;
use crate::engine::{PartitionId, Shared};
use crate::fetch::Polled;
use crate::kafka::queue_batch::{SplitQueue, Taken};
use crate::kafka::wakeup::Wakeup;

/// The split queues of the partitions assigned to the group member.
pub(super) struct MemberQueues {
    split: Mutex<Split>,
    /// What a queue calls when something arrives while it is empty.
    wakeup: Wakeup,
}

#[derive(Default)]
struct Split {
    queues: BTreeMap<PartitionId, SplitQueue>,
    /// The consumer is about to go: nothing is split any more (dropping the consumer closes
    /// it, and a rebalance it serves then must not make a queue that would outlive it).
    closed: bool,
    /// Where the next round starts taking (a partition of many waiting is not always last).
    next_start: usize,
}

impl MemberQueues {
    /// No queue split yet; each split queue raises `wakeup`.
    pub fn new(wakeup: Wakeup) -> Self {
        Self {
            split: Mutex::new(Split::default()),
            wakeup,
        }
    }

    fn split(&self) -> MutexGuard<'_, Split> {
        self.split
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Splits the queues of the partitions in `tpl`, which are about to be assigned. A
    /// partition librdkafka has no queue for keeps its messages on the consumer queue.
    pub fn split_assigned(&self, consumer: &BaseConsumer<LiveContext>, tpl: &TopicPartitionList) {
        let mut split = self.split();
        if split.closed {
            return;
        }
        for element in tpl.elements() {
            let key = (element.topic().to_owned(), element.partition());
            // The old handle goes first: the callback belongs to the queue (librdkafka has
            // one per partition), and dropping the old handle would switch the new one's off.
            split.queues.remove(&key);
            // SAFETY: the consumer is alive; every queue is dropped before it (`close`, called
            // before the live thread drops the consumer, after which nothing is split).
            let queue = unsafe {
                SplitQueue::split(
                    consumer.client().native_ptr(),
                    &key.0,
                    key.1,
                    self.wakeup.callback(),
                )
            };
            match queue {
                Some(queue) => {
                    split.queues.insert(key, queue);
                }
                None => tracing::debug!(
                    topic = key.0,
                    partition = key.1,
                    "no partition queue: its messages stay on the consumer queue"
                ),
            }
        }
    }

    /// Lets go of the queues of the revoked partitions in `tpl`.
    pub fn let_go(&self, tpl: &TopicPartitionList) {
        let mut split = self.split();
        for element in tpl.elements() {
            split
                .queues
                .remove(&(element.topic().to_owned(), element.partition()));
        }
    }

    /// Lets go of every queue when an eager protocol unassigns everything.
    pub fn let_go_all(&self) {
        self.split().queues.clear();
    }

    /// Lets go of every queue and splits none from now on: before the consumer is dropped.
    pub fn close(&self) {
        let mut split = self.split();
        split.closed = true;
        split.queues.clear();
    }

    /// Whether any split queue holds something (its callback fired when it arrived: a wait
    /// would not be ended by it).
    pub fn any_waiting(&self) -> bool {
        self.split().queues.values().any(|queue| queue.len() > 0)
    }

    /// Takes up to `most` entries from the split queues into `round`, each partition's in
    /// runs under the generation of its runtime (`u64::MAX` without one: no lane takes them).
    /// An error ends its partition's turn; what came before it stays in front of it.
    pub fn take_into(&self, shared: &Shared, most: usize, round: &mut LiveRound) {
        let mut split = self.split();
        let count = split.queues.len();
        if count == 0 || most == 0 {
            return;
        }
        let start = split.next_start % count;
        split.next_start = split.next_start.wrapping_add(1);
        let generations: Vec<u64> = {
            let runtimes = shared.partitions();
            split
                .queues
                .keys()
                .map(|key| {
                    runtimes
                        .get(key)
                        .map_or(u64::MAX, |runtime| runtime.generation)
                })
                .collect()
        };
        let queues: Vec<_> = split.queues.iter().zip(generations).collect();
        let (front, back) = queues.split_at(start);
        let mut left = most;
        for ((key, queue), generation) in back.iter().chain(front) {
            if left == 0 {
                break;
            }
            let run_key = (PartitionId::clone(key), *generation);
            let mut records = Vec::new();
            let mut ended = false;
            while left > 0 && !ended {
                let taken = queue.take(left, |taken| match taken {
                    Taken::Record(record) => records.push(record),
                    // An error ends the queue's turn; what came before it stays in front of
                    // it, and what this run took after it, after it.
                    Taken::Error { error, at } => {
                        if !records.is_empty() {
                            round.polled.push(
                                Some(run_key.clone()),
                                Polled::Messages(std::mem::take(&mut records)),
                            );
                        }
                        round.push_error(shared, Some(&run_key), &error, Some(at));
                        ended = true;
                    }
                });
                if taken == 0 {
                    break;
                }
                left = left.saturating_sub(taken);
            }
            if !records.is_empty() {
                round.polled.push(Some(run_key), Polled::Messages(records));
            }
        }
    }
}
