//! A consumer's partitions fetched into a few queues of catchup's own, and which partition
//! fetches into which: the group member's and the catch-up consumer's.
//!
//! librdkafka bounds what a partition prefetches by what the queue it fetches into holds
//! (`queued.max.messages.kbytes`, `queued.min.messages`, fixed when the consumer is created),
//! and a fetch hands a partition at least one whole record batch whatever those limits say.
//! With a queue per partition, the prefetch grew with the partition count: at 64 partitions
//! the group member's `off` peaked at 438–589 MiB, and the catch-up consumer kept a batch or
//! more of every partition queued — each message a 1 KiB librdkafka object beside its bytes
//! (`ordered` at 100 B: 245–263 MiB, `concurrent` at 128 partitions 353 MiB). Partitions
//! forwarded several to a queue share its limits, and a fixed number of queues bounds the
//! whole prefetch.
//!
//! Up to the limit each partition gets a queue of its own; after it, each new one fetches
//! into the queue the fewest fetch into ([`queue_for`]). A stop of a partition's fetch removes
//! its forward, so each round forwards every routed partition again first
//! ([`FetchQueues::forward_again`]).

use std::collections::BTreeMap;

use rdkafka::bindings as rd;

use super::queue_batch::{FetchQueue, ForwardedPartition};
use super::wakeup::Wakeup;
use crate::engine::PartitionId;

/// A consumer's fetch queues and where each routed partition fetches.
pub(crate) struct FetchQueues {
    /// The most queues made.
    limit: usize,
    /// Made as partitions are routed, up to `limit`; kept until the consumer goes (what a
    /// partition let go of left in one is outdated, and dropped when taken: see `let_go`).
    queues: Vec<FetchQueue>,
    /// Where each routed partition fetches into.
    routes: BTreeMap<PartitionId, Route>,
    /// The consumer is about to go: nothing is routed any more (a queue made now would
    /// outlive it).
    closed: bool,
    /// Where the next round starts taking (a queue of many waiting is not always last).
    next_start: usize,
}

/// A routed partition's way into a fetch queue.
struct Route {
    /// The index of the fetch queue.
    queue: usize,
    /// The partition's own queue, forwarded there.
    partition: ForwardedPartition,
}

impl FetchQueues {
    /// No queue yet; at most `limit` of them.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            queues: Vec::new(),
            routes: BTreeMap::new(),
            closed: false,
            next_start: 0,
        }
    }

    /// Forwards `key`'s queue to a fetch queue, before the partition is first assigned (forwarded
    /// later, messages already on their way to the consumer queue could arrive after later ones
    /// were taken here). Whether it fetches into one now: if not (librdkafka made no queue, or the
    /// consumer is about to go), its messages stay on the consumer queue.
    ///
    /// Routed already, it keeps its queue (a fetch that goes on keeps what it fetched in
    /// front of what it fetches next) and is forwarded there again.
    ///
    /// # Safety
    /// `rk` is the live consumer handle every queue here was made on, and every queue is
    /// dropped before it ([`close`](Self::close)).
    pub unsafe fn route(
        &mut self,
        rk: *mut rd::rd_kafka_t,
        key: &PartitionId,
        wakeup: &Wakeup,
    ) -> bool {
        if self.closed {
            return false;
        }
        if let Some(route) = self.routes.get(key) {
            route.partition.forward_to(&self.queues[route.queue]);
            return true;
        }
        // SAFETY: as the caller promises.
        let Some(index) = (unsafe { self.least_used(rk, wakeup) }) else {
            tracing::debug!(
                topic = key.0,
                partition = key.1,
                "no fetch queue: its messages stay on the consumer queue"
            );
            return false;
        };
        // SAFETY: as the caller promises.
        let partition = unsafe { ForwardedPartition::new(rk, &key.0, key.1, wakeup.callback()) };
        let Some(partition) = partition else {
            tracing::debug!(
                topic = key.0,
                partition = key.1,
                "no partition queue: its messages stay on the consumer queue"
            );
            return false;
        };
        partition.forward_to(&self.queues[index]);
        self.routes.insert(
            key.clone(),
            Route {
                queue: index,
                partition,
            },
        );
        true
    }

    /// The queue a newly routed partition fetches into (see [`queue_for`]).
    ///
    /// # Safety
    /// As [`route`](Self::route).
    unsafe fn least_used(&mut self, rk: *mut rd::rd_kafka_t, wakeup: &Wakeup) -> Option<usize> {
        let routes = || self.routes.values().map(|route| route.queue);
        match queue_for(self.limit, self.queues.len(), routes()) {
            QueueChoice::New => {
                // SAFETY: as the caller promises.
                match unsafe { FetchQueue::new(rk, wakeup.callback()) } {
                    Some(queue) => {
                        self.queues.push(queue);
                        Some(self.queues.len() - 1)
                    }
                    // librdkafka could not make one: a queue that exists serves.
                    None => least_routed(self.queues.len(), routes()),
                }
            }
            QueueChoice::Existing(index) => Some(index),
        }
    }

    /// Forgets `key`, unassigned. What its fetch queue still holds of it is outdated, and
    /// dropped when taken — but for the few errors librdkafka queues with no version (an
    /// offset reset among them): if the partition is added again, such an error reaches its
    /// new lane, which reads the watermarks or moves the consumer, and loses nothing. Its
    /// handle goes first: a newer one on the partition's queue would have its callback
    /// switched off by this one's drop.
    pub fn let_go(&mut self, key: &PartitionId) {
        self.routes.remove(key);
    }

    /// Forgets every partition, all unassigned.
    pub fn let_go_all(&mut self) {
        self.routes.clear();
    }

    /// Lets go of every queue and makes none from now on: before the consumer is dropped.
    pub fn close(&mut self) {
        self.closed = true;
        self.routes.clear();
        self.queues.clear();
    }

    /// Whether `key` fetches into a fetch queue.
    #[cfg(test)]
    pub fn is_routed(&self, key: &PartitionId) -> bool {
        self.routes.contains_key(key)
    }

    /// Whether `key` fetches into a queue another partition fetches into too: what waits
    /// there for the one cannot be left while the other's is taken.
    pub fn shares_queue(&self, key: &PartitionId) -> bool {
        self.routes.get(key).is_some_and(|own| {
            self.routes
                .iter()
                .any(|(other, route)| other != key && route.queue == own.queue)
        })
    }

    /// The partition that alone fetches into queue `index`, if exactly one does.
    pub fn sole_partition(&self, index: usize) -> Option<&PartitionId> {
        let mut routed = self
            .routes
            .iter()
            .filter(|(_, route)| route.queue == index)
            .map(|(key, _)| key);
        let first = routed.next()?;
        routed.next().is_none().then_some(first)
    }

    /// Whether any fetch queue holds something (its callback fired when it arrived: a wait
    /// would not be ended by it).
    pub fn any_waiting(&self) -> bool {
        self.queues.iter().any(|queue| queue.len() > 0)
    }

    /// Forwards every routed partition again. A partition whose fetch was stopped and
    /// started again since (an assignment made again to move it) lost its forward: what it
    /// fetched since waits in its own queue, and moves to its fetch queue's end now, in order.
    pub fn forward_again(&self) {
        for route in self.routes.values() {
            route.partition.forward_to(&self.queues[route.queue]);
        }
    }

    /// The queues' indexes in this round's order, from a start that moves each round.
    pub fn turn(&mut self) -> impl Iterator<Item = usize> + use<> {
        let count = self.queues.len();
        let start = if count == 0 {
            0
        } else {
            self.next_start % count
        };
        self.next_start = self.next_start.wrapping_add(1);
        (start..count).chain(0..start)
    }

    /// Queue `index`.
    pub fn queue(&self, index: usize) -> Option<&FetchQueue> {
        self.queues.get(index)
    }
}

/// Where a newly routed partition fetches.
#[derive(Debug, PartialEq, Eq)]
enum QueueChoice {
    /// Into a queue made for it.
    New,
    /// Into the queue of this index.
    Existing(usize),
}

/// Where a newly routed partition fetches, given the most queues (`limit`), how many were
/// `made` and the queue each routed partition fetches into (`routes`): a new queue while
/// there are fewer than `limit`, else the one fewest partitions fetch into (the first of
/// those).
fn queue_for(limit: usize, made: usize, routes: impl Iterator<Item = usize>) -> QueueChoice {
    if made < limit {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_per_partition_up_to_the_limit_then_the_least_used() {
        let full = 8;
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
                queue_for(full, *made, routes.iter().copied()),
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
