//! The group member's partitions fetched into a few queues of catchup's own and taken in runs
//! (`rd_kafka_consume_batch_queue`), where one `poll` per message read the clock and took
//! librdkafka's queue lock for every record.
//!
//! There are at most [`MEMBER_QUEUES`] of them, each assigned partition forwarded to the one
//! with the fewest (`kafka::fetch_queues`, which says why). A stop of a partition's fetch
//! removes its forward, so each round forwards every assigned partition again first.
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

use std::sync::{Mutex, MutexGuard};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::LiveContext;
use super::poll::{LiveRound, run_key};
use crate::engine::Shared;
use crate::fetch::Polled;
use crate::kafka::fetch_queues::FetchQueues;
use crate::kafka::prefetch::MEMBER_QUEUES;
use crate::kafka::queue_batch::Taken;
use crate::kafka::wakeup::Wakeup;

/// The fetch queues of the group member and which assigned partition fetches into which.
pub(super) struct MemberQueues {
    split: Mutex<FetchQueues>,
    /// What a queue calls when something arrives while it is empty.
    wakeup: Wakeup,
}

impl MemberQueues {
    /// No fetch queue yet; each fetch queue raises `wakeup`.
    pub fn new(wakeup: Wakeup) -> Self {
        Self {
            split: Mutex::new(FetchQueues::new(MEMBER_QUEUES)),
            wakeup,
        }
    }

    fn split(&self) -> MutexGuard<'_, FetchQueues> {
        self.split
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forwards the queues of the partitions in `tpl`, which are about to be assigned, to
    /// fetch queues. A partition librdkafka has no queue for (it makes one for any partition
    /// of a consumer) keeps its messages on the consumer queue if it was never forwarded.
    pub fn split_assigned(&self, consumer: &BaseConsumer<LiveContext>, tpl: &TopicPartitionList) {
        let mut split = self.split();
        for element in tpl.elements() {
            let key = (element.topic().to_owned(), element.partition());
            // Assigned again while it has a route (an eager protocol's assignment after an
            // error, an assignment librdkafka refuses), it keeps its queue.
            // SAFETY: the consumer is alive; every queue is dropped before it (`close`,
            // called before the live thread drops the consumer, after which nothing is made).
            unsafe { split.route(consumer.client().native_ptr(), &key, &self.wakeup) };
        }
    }

    /// Forgets the revoked partitions in `tpl` (what their fetch queues still hold of them is
    /// outdated, and dropped when taken).
    pub fn let_go(&self, tpl: &TopicPartitionList) {
        let mut split = self.split();
        for element in tpl.elements() {
            split.let_go(&(element.topic().to_owned(), element.partition()));
        }
    }

    /// Forgets every partition when an eager protocol unassigns everything.
    pub fn let_go_all(&self) {
        self.split().let_go_all();
    }

    /// Lets go of every queue and makes none from now on: before the consumer is dropped.
    pub fn close(&self) {
        self.split().close();
    }

    /// Whether any fetch queue holds something (its callback fired when it arrived: a wait
    /// would not be ended by it).
    pub fn any_waiting(&self) -> bool {
        self.split().any_waiting()
    }

    /// Takes up to `most` entries from the fetch queues into `round`, in runs of one
    /// partition under the generation of its runtime (`u64::MAX` without one: no lane takes
    /// them). An error goes after what its partition had before it.
    pub fn take_into(&self, shared: &Shared, most: usize, round: &mut LiveRound) {
        let mut split = self.split();
        if most == 0 {
            return;
        }
        split.forward_again();
        let mut left = most;
        for index in split.turn() {
            let Some(queue) = split.queue(index) else {
                continue;
            };
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
