//! The buffer's byte budget and free-space floor, applied by each fetcher to its own
//! consumer: the decisions come from [`PausePolicy`] and the disk guard; this only pauses,
//! resumes and reports.
//!
//! A catch-up lane is also held to a read-ahead: what it fetched and the reader has not taken
//! yet stays within an eighth of its share, or one fetch of the partition where that is more,
//! at most half the share (`fetch::read_ahead_share`). The buffer's memory tier spills a
//! lane's oldest records first (sled must hold each lane's prefix), so a catch-up lane
//! fetched far ahead of a slower reader wrote to sled exactly the records the reader was to
//! take next, and the reader read them back. Held, the lane's next records wait in librdkafka's queue instead —
//! the fetcher leaves the partition's queue unpolled, and librdkafka stops fetching once it is
//! full (it is not paused: a pause drops what librdkafka prefetched, and a resume waits for
//! a new fetch; a first version that paused made `catchup run` at 1 KiB 30 % slower). Not
//! held, a queue is polled up to what the lane may still read ahead
//! (`fetch::read_ahead_room`), at least one message. That needs a queue of the partition's
//! own: past eight partitions they share the catch-up consumer's fetch queues
//! (`kafka::fetch_queues`), and a held partition whose queue another shares is paused instead.
//!
//! A live lane the reader can take now (not split, `Concurrent`, or its backlog handed out) is
//! held to the same read-ahead. The group member's hold predates its partitions' own queues
//! (`kafka::live::queues`) and still treats them as one: while one is held, the group member
//! takes a message at a time, a few milliseconds apart (rebalances are still served: librdkafka pauses the
//! assignment before it queues one, and skips what it prefetched; `max.poll.interval.ms` is
//! kept), and librdkafka stops fetching once its queue is full. Without the hold, `catchup
//! run` in `off` at 1 KiB, slower than its fetcher, had every lane's whole share fetched ahead,
//! spilled to sled and read back (347 MiB resident); pausing the held partitions instead
//! dropped what librdkafka had prefetched at every pause and halved the rate.
//!
//! The price is the one of any consumer with one queue: while a lane is held, the other
//! partitions' next records wait behind what librdkafka prefetched, until the reader has
//! taken half the held lane's read-ahead (a quiet partition's fresh record came after 5,420
//! records of 1 KiB of a busy one in `tests/read_ahead.rs`). Holding only once every
//! partition was held kept them apart, but a reader rarely has every partition ahead at once,
//! and `catchup run` in `off` spilled again (106k records/s at 255 MiB). Leaving a held
//! partition's own queue untaken alone, as the catch-up fetcher does with a queue that is the
//! partition's alone, while the others were taken at full speed, was built and measured:
//! `catchup run` in `off` at 1 KiB read 439k records/s at 2.85 µs of CPU per record against
//! 548k at 2.15 µs with this hold, side by side
//! (329k against 532k with each queue also taken only up to its read-ahead): the member ran
//! more, smaller rounds, and the quiet partition's fresh record came no sooner (after 200 of
//! the busy one's records either way in `tests/read_ahead.rs`).
//! A live lane behind its backlog in `Ordered` is never held to its read-ahead: those records
//! wait, and sled is where they wait. Below the free-space floor it is paused instead
//! (`Shared::held_below_floor`): its backlog needs the room.

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::types::Event;
use crate::engine::{PartitionId, Shared};
use crate::fetch::{PausePolicy, PausedHolds, WriteStops, read_ahead_room, read_ahead_share};
use crate::store::Lane;

/// One fetcher's side of the byte budget.
pub(crate) struct Budget {
    fetcher: &'static str,
    lane: Lane,
    limit: u64,
    /// The most one fetch brings of a partition: a lane's read-ahead is never less.
    fetch_bytes: u64,
    policy: PausePolicy<PartitionId>,
    /// The lane's read-ahead: the partitions held, decided on the bytes fetched and not
    /// handed out (not on those unacknowledged: an application that acknowledges a batch once
    /// it has all of it would wait for good).
    read_ahead: PausePolicy<PartitionId>,
    /// Each partition's bytes fetched and not taken, as of the last `apply` (a round takes a
    /// catch-up queue of one partition up to its read-ahead, not a fixed count past it).
    ahead: BTreeMap<PartitionId, u64>,
    /// A partition's read-ahead as of the last `apply` (`None` before the first).
    read_ahead_share: Option<u64>,
    /// The partitions paused because the buffer may not take their records: all of them
    /// while it may not be written (disk below its floor, or a failed write), and live lanes
    /// held below the floor while their backlog waits (`Shared::held_below_floor`).
    stops: WriteStops<PartitionId>,
    /// The partitions held to their read-ahead and paused for it, as of the last `apply`:
    /// those whose queue another partition shares, where what waits for them cannot be left
    /// untaken while the other's is taken.
    paused_holds: PausedHolds<PartitionId>,
}

impl Budget {
    /// The budget of `fetcher`, whose consumer fetches `lane`: `limit` bytes over every
    /// lane, and at most `fetch_bytes` of a partition per fetch
    /// (`kafka::prefetch::partition_fetch_bytes`), which the read-ahead never goes below.
    pub fn new(fetcher: &'static str, lane: Lane, limit: u64, fetch_bytes: u64) -> Self {
        Self {
            fetcher,
            lane,
            limit,
            fetch_bytes,
            policy: PausePolicy::new(),
            read_ahead: PausePolicy::new(),
            ahead: BTreeMap::new(),
            read_ahead_share: None,
            stops: WriteStops::new(),
            paused_holds: PausedHolds::new(),
        }
    }

    /// Whether `key` must stay paused: by the budget, because the buffer may not be written,
    /// (a live lane) held below the floor while its backlog waits, or held to its read-ahead
    /// in a queue it shares.
    pub fn is_paused(&self, key: &PartitionId) -> bool {
        self.stops.stops(key) || self.policy.is_paused(key) || self.paused_holds.contains(key)
    }

    /// Whether `key` is held to its read-ahead: its reader has not taken what the lane read
    /// ahead (the catch-up fetcher leaves its queue untaken, or, where the queue is shared,
    /// `apply` pauses it).
    pub fn holds(&self, key: &PartitionId) -> bool {
        self.read_ahead.is_paused(key)
    }

    /// Whether any partition is held to its read-ahead.
    pub fn holds_any(&self) -> bool {
        self.read_ahead.any_paused()
    }

    /// Bytes `key` may poll this round if it is not held ([`read_ahead_room`]; a partition
    /// the last `apply` did not see has nothing ahead).
    pub fn read_ahead_room(&self, key: &PartitionId) -> u64 {
        read_ahead_room(
            self.read_ahead_share,
            self.ahead.get(key).copied().unwrap_or(0),
        )
    }

    /// Forgets `key`, paused by its fetcher out of band: when its runtime comes back it is
    /// set like a newly assigned partition (resumed, unless a stop or the budget pauses it).
    pub fn forget(&mut self, key: &PartitionId) {
        self.stops.forget(key);
    }

    /// Pauses and resumes the partitions of `consumer` that `fetching` says it fetches,
    /// by their bytes in this fetcher's lane, all of them while the buffer may not be
    /// written, (the live lanes) those held below the floor, and those held to their
    /// read-ahead that `shares_queue` says fetch into a queue another partition fetches into.
    pub fn apply<C: ConsumerContext>(
        &mut self,
        shared: &Shared,
        consumer: &BaseConsumer<C>,
        fetching: impl Fn(&PartitionId) -> bool,
        shares_queue: impl Fn(&PartitionId) -> bool,
    ) {
        // Measured here too: with every partition paused no append asks any more.
        let stopped = !shared.may_write();
        let held = match self.lane {
            Lane::Live if !stopped => shared.held_below_floor(),
            _ => BTreeSet::new(),
        };
        let mut usage = shared.buffered_by_partition(self.lane);
        usage.retain(|key, _| fetching(key));
        let (policy, paused_holds) = (&self.policy, &self.paused_holds);
        let changes = self
            .stops
            .round(usage.keys().cloned(), stopped, held, |key| {
                policy.is_paused(key) || paused_holds.contains(key)
            });
        for (key, paused) in changes {
            self.set_paused(shared, consumer, &key, paused);
        }
        let slots = shared.budget_slots();
        let mut ahead = shared.undelivered_by_partition(self.lane);
        ahead.retain(|key, _| fetching(key));
        let read_ahead = read_ahead_share(self.limit, slots, self.fetch_bytes);
        self.read_ahead_share = Some(read_ahead);
        for change in self.read_ahead.decide_share(read_ahead, &ahead) {
            tracing::trace!(
                fetcher = self.fetcher,
                topic = change.partition.0,
                partition = change.partition.1,
                held = change.paused,
                ahead = change.buffered_bytes,
                read_ahead,
                "read-ahead"
            );
        }
        self.ahead = ahead;
        self.pause_shared_holds(shared, consumer, shares_queue);
        let changes = self.policy.decide(self.limit, slots, &usage);
        for change in changes {
            let (topic, partition) = &change.partition;
            // While writes are stopped everything stays paused (a live lane held below the
            // floor, that lane), and so does a hold paused; the budget's own state moves on
            // and applies when they end.
            if !self.stops.stops(&change.partition)
                && !self.paused_holds.contains(&change.partition)
            {
                self.set_paused(shared, consumer, &change.partition, change.paused);
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

    /// Pauses the partitions held to their read-ahead whose queue another partition shares,
    /// and resumes those no longer held (or whose queue is theirs alone again) unless a stop
    /// or the budget pauses them ([`PausedHolds`]).
    fn pause_shared_holds<C: ConsumerContext>(
        &mut self,
        shared: &Shared,
        consumer: &BaseConsumer<C>,
        shares_queue: impl Fn(&PartitionId) -> bool,
    ) {
        let wanted: BTreeSet<PartitionId> = self
            .ahead
            .keys()
            .filter(|key| self.read_ahead.is_paused(key) && shares_queue(key))
            .cloned()
            .collect();
        let (ahead, stops, policy) = (&self.ahead, &self.stops, &self.policy);
        let changes = self.paused_holds.round(
            wanted,
            |key| ahead.contains_key(key),
            |key| stops.stops(key) || policy.is_paused(key),
        );
        for (key, paused) in changes {
            tracing::trace!(
                fetcher = self.fetcher,
                topic = key.0,
                partition = key.1,
                paused,
                "read-ahead in a shared queue"
            );
            self.set_paused(shared, consumer, &key, paused);
        }
    }

    fn set_paused<C: ConsumerContext>(
        &self,
        shared: &Shared,
        consumer: &BaseConsumer<C>,
        (topic, partition): &PartitionId,
        paused: bool,
    ) {
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, *partition);
        let result = if paused {
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
    }
}
