//! The group member's partitions fetched into a few queues of catchup's own and taken in runs
//! (`rd_kafka_consume_batch_queue`), where one `poll` per message read the clock and took
//! librdkafka's queue lock for every record.
//!
//! There are at most [`MEMBER_QUEUES`] of them, each assigned partition forwarded to the one
//! with the fewest: librdkafka bounds a partition's prefetch by what its queue holds, so a
//! queue per partition let the prefetch grow with the partition count (`FetchQueue`). A stop
//! of a partition's fetch removes its forward, so each round forwards every assigned
//! partition again first (`ForwardedPartition`).
//!
//! The consumer queue stays the member's: rebalances, group errors, and the messages of any
//! partition whose queue could not be forwarded. A partition's queue is forwarded in the
//! rebalance callback before the partition is assigned (forwarded later, messages already on
//! their way to the consumer queue could arrive after later ones were taken here). Each round
//! takes the fetch queues after the consumer queue, in turn from a starting queue that moves
//! each round, and splits what it takes into runs of one partition. Rebalances run only in the
//! consumer queue's `poll`, so what a fetch queue holds was fetched under the assignment its
//! partition's runtime has while the round takes it (librdkafka drops what an earlier
//! assignment fetched: its version is outdated — a revoked partition's leftovers included).
//!
//! The batch call moves the position one past an error's offset (librdkafka issue 4844): an
//! error taken here is handed on with the offset it names (`Polled::from_error`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::LiveContext;
use super::poll::{LiveRound, run_key};
use crate::engine::{PartitionId, Shared};
use crate::fetch::Polled;
use crate::kafka::prefetch::MEMBER_QUEUES;
use crate::kafka::queue_batch::{FetchQueue, ForwardedPartition, Taken};
use crate::kafka::wakeup::Wakeup;

/// The fetch queues of the group member and which assigned partition fetches into which.
pub(super) struct MemberQueues {
    split: Mutex<Split>,
    /// What a queue calls when something arrives while it is empty.
    wakeup: Wakeup,
}

#[derive(Default)]
struct Split {
    /// Made as partitions are assigned, up to [`MEMBER_QUEUES`]; kept until the consumer
    /// goes (what a revoked partition left in one is outdated, and dropped when taken).
    queues: Vec<FetchQueue>,
    /// Where each assigned partition fetches into.
    routes: BTreeMap<PartitionId, Route>,
    /// The consumer is about to go: nothing is forwarded any more (dropping the consumer
    /// closes it, and a rebalance it serves then must not make a queue that would outlive it).
    closed: bool,
    /// Where the next round starts taking (a queue of many waiting is not always last).
    next_start: usize,
}

/// An assigned partition's way into a fetch queue.
struct Route {
    /// The index of the fetch queue.
    queue: usize,
    /// The partition's own queue, forwarded there.
    partition: ForwardedPartition,
}

impl Split {
    /// The queue a newly assigned partition fetches into (see [`queue_for`]).
    fn least_used(
        &mut self,
        consumer: &BaseConsumer<LiveContext>,
        wakeup: &Wakeup,
    ) -> Option<usize> {
        match queue_for(
            self.queues.len(),
            self.routes.values().map(|route| route.queue),
        ) {
            QueueChoice::New => {
                // SAFETY: the consumer is alive; every queue is dropped before it (`close`,
                // called before the live thread drops the consumer, after which nothing is
                // made).
                let made =
                    unsafe { FetchQueue::new(consumer.client().native_ptr(), wakeup.callback()) };
                match made {
                    Some(queue) => {
                        self.queues.push(queue);
                        Some(self.queues.len() - 1)
                    }
                    // librdkafka could not make one: a queue that exists serves.
                    None => least_routed(
                        self.queues.len(),
                        self.routes.values().map(|route| route.queue),
                    ),
                }
            }
            QueueChoice::Existing(index) => Some(index),
        }
    }
}

/// Where a newly assigned partition fetches.
#[derive(Debug, PartialEq, Eq)]
enum QueueChoice {
    /// Into a queue made for it.
    New,
    /// Into the queue of this index.
    Existing(usize),
}

/// Where a newly assigned partition fetches, given how many queues were `made` and the queue
/// each assigned partition fetches into (`routes`): a new queue while there are fewer than
/// [`MEMBER_QUEUES`], else the one fewest partitions fetch into (the first of those).
fn queue_for(made: usize, routes: impl Iterator<Item = usize>) -> QueueChoice {
    if made < MEMBER_QUEUES {
        return QueueChoice::New;
    }
    least_routed(made, routes).map_or(QueueChoice::New, QueueChoice::Existing)
}

/// The queue of `made` that the fewest of `routes` lead to; `None` when none was made.
fn least_routed(made: usize, routes: impl Iterator<Item = usize>) -> Option<usize> {
    let mut users = vec![0usize; made];
    for index in routes {
        if let Some(count) = users.get_mut(index) {
            *count += 1;
        }
    }
    (0..made).min_by_key(|&index| users[index])
}

impl MemberQueues {
    /// No fetch queue yet; each fetch queue raises `wakeup`.
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

    /// Forwards the queues of the partitions in `tpl`, which are about to be assigned, to
    /// fetch queues. A partition librdkafka has no queue for (it makes one for any partition
    /// of a consumer) keeps its messages on the consumer queue if it was never forwarded.
    pub fn split_assigned(&self, consumer: &BaseConsumer<LiveContext>, tpl: &TopicPartitionList) {
        let mut split = self.split();
        if split.closed {
            return;
        }
        for element in tpl.elements() {
            let key = (element.topic().to_owned(), element.partition());
            // Assigned again while it has a route (an eager protocol's assignment after an
            // error, an assignment librdkafka refuses): a fetch that goes on keeps its queue,
            // where what it fetched before waits in front of what it fetches next.
            if let Some(route) = split.routes.get(&key) {
                route.partition.forward_to(&split.queues[route.queue]);
                continue;
            }
            let Some(index) = split.least_used(consumer, &self.wakeup) else {
                tracing::debug!(
                    topic = key.0,
                    partition = key.1,
                    "no fetch queue: its messages stay on the consumer queue"
                );
                continue;
            };
            // SAFETY: the consumer is alive; every handle is dropped before it (`close`).
            let partition = unsafe {
                ForwardedPartition::new(
                    consumer.client().native_ptr(),
                    &key.0,
                    key.1,
                    self.wakeup.callback(),
                )
            };
            match partition {
                Some(partition) => {
                    partition.forward_to(&split.queues[index]);
                    split.routes.insert(
                        key,
                        Route {
                            queue: index,
                            partition,
                        },
                    );
                }
                None => tracing::debug!(
                    topic = key.0,
                    partition = key.1,
                    "no partition queue: its messages stay on the consumer queue"
                ),
            }
        }
    }

    /// Forgets the revoked partitions in `tpl` (what their fetch queues still hold of them is
    /// outdated, and dropped when taken).
    pub fn let_go(&self, tpl: &TopicPartitionList) {
        let mut split = self.split();
        for element in tpl.elements() {
            split
                .routes
                .remove(&(element.topic().to_owned(), element.partition()));
        }
    }

    /// Forgets every partition when an eager protocol unassigns everything.
    pub fn let_go_all(&self) {
        self.split().routes.clear();
    }

    /// Lets go of every queue and makes none from now on: before the consumer is dropped.
    pub fn close(&self) {
        let mut split = self.split();
        split.closed = true;
        split.routes.clear();
        split.queues.clear();
    }

    /// Whether any fetch queue holds something (its callback fired when it arrived: a wait
    /// would not be ended by it).
    pub fn any_waiting(&self) -> bool {
        self.split().queues.iter().any(|queue| queue.len() > 0)
    }

    /// Takes up to `most` entries from the fetch queues into `round`, in runs of one
    /// partition under the generation of its runtime (`u64::MAX` without one: no lane takes
    /// them). An error goes after what its partition had before it.
    pub fn take_into(&self, shared: &Shared, most: usize, round: &mut LiveRound) {
        let mut split = self.split();
        let count = split.queues.len();
        if count == 0 || most == 0 {
            return;
        }
        // A partition whose fetch was stopped and started again since the last round (an
        // assignment made again to move it) lost its forward: what it fetched since waits in
        // its own queue, and moves to its fetch queue's end now, in order.
        for route in split.routes.values() {
            route.partition.forward_to(&split.queues[route.queue]);
        }
        let start = split.next_start % count;
        split.next_start = split.next_start.wrapping_add(1);
        let (front, back) = split.queues.split_at(start);
        let mut left = most;
        for queue in back.iter().chain(front) {
            while left > 0 {
                let taken = queue.take(left, |origin, taken| match (origin, taken) {
                    (Some(origin), Taken::Record(record)) => round.polled.push_record(
                        record,
                        |(partition, _)| origin.is(partition),
                        // Once per run: runtimes change only in callbacks, which run in the
                        // consumer queue's `poll`, before the fetch queues are taken.
                        || run_key(shared, origin.key()),
                    ),
                    (Some(origin), Taken::Error { error, at }) => {
                        let key = run_key(shared, origin.key());
                        round.push_error(shared, Some(&key), &error, Some(at));
                    }
                    // Whichever partition it was, what its lane takes next may not follow
                    // what it took before: every chain ends here.
                    (None, taken) => {
                        if let Taken::Error { error, .. } = taken {
                            round.push_error(shared, None, &error, None);
                        }
                        round.polled.push(None, Polled::BreaksChain);
                    }
                });
                if taken == 0 {
                    break;
                }
                left = left.saturating_sub(taken);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_per_partition_up_to_the_limit_then_the_least_used() {
        let full = MEMBER_QUEUES;
        let cases: &[(usize, &[usize], QueueChoice)] = &[
            (0, &[], QueueChoice::New),
            (3, &[0, 1, 2], QueueChoice::New),
            // A queue made earlier and now unused is not reused while more may be made.
            (3, &[0, 2], QueueChoice::New),
            (full, &[0, 1, 2, 3, 4, 5, 6, 7], QueueChoice::Existing(0)),
            (
                full,
                &[0, 1, 2, 3, 4, 5, 6, 7, 0, 1],
                QueueChoice::Existing(2),
            ),
            // Revocations emptied a queue: it is the one filled again.
            (
                full,
                &[0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 6, 7, 7],
                QueueChoice::Existing(5),
            ),
        ];
        for (made, routes, expected) in cases {
            assert_eq!(
                queue_for(*made, routes.iter().copied()),
                *expected,
                "{made} made, routes {routes:?}"
            );
        }
    }

    #[test]
    fn the_least_routed_of_none_made_is_none() {
        assert_eq!(least_routed(0, [0, 1].into_iter()), None);
        assert_eq!(least_routed(2, [0, 5].into_iter()), Some(1));
    }
}
