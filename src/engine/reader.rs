//! The reader's side of the runtime: refilling deliveries from the buffer in the mode's
//! order, handing them out, acknowledging them, and partitions found damaged on a read.

use super::*;
use crate::plan::{AppendCounts, ReadSlot};

/// Where a fill reads one partition: its key, the assignment it was read for, the appends
/// reported when the read started ([`crate::plan::IdleReads`]), and per lane the offset the
/// read starts at.
type ReadStarts = (PartitionId, u64, AppendCounts, Vec<(Lane, i64)>);

impl Shared {
    /// Whether some partition's backlog is not all handed out yet (a split whose catch-up
    /// lane is not drained).
    pub fn backlog_pending(&self) -> bool {
        self.partitions().values().any(|runtime| !runtime.drained)
    }

    /// Reads up to about `max` deliverable records from the buffer. `Ordered` and `Off` fill
    /// `queues[0]` in delivery order; `Concurrent` fills `queues[0]` with catch-up records
    /// and `queues[1]` with live ones, reading only `lanes`.
    ///
    /// The partitions' lock is held to decide where each read starts and to hand the records
    /// out, not while the buffer is read: the fetchers need it after every append. A read
    /// whose partition was assigned again meanwhile is dropped (its new runtime reads anew).
    /// A read that reached the end of what the buffer proved is not made again until the
    /// next append to what it reads (its lane, or either lane in `Ordered` and `Off`), or for
    /// [`crate::plan::SWEEP_EVERY`] ([`crate::plan::IdleReads`]).
    pub fn fill(
        &self,
        queues: &mut [VecDeque<Delivery>; 2],
        max: usize,
        lanes: &[Lane],
    ) -> Result<(), StoreError> {
        self.fill_at(queues, max, lanes, std::time::Instant::now())
    }

    /// [`fill`](Self::fill) at `now`.
    pub(crate) fn fill_at(
        &self,
        queues: &mut [VecDeque<Delivery>; 2],
        max: usize,
        lanes: &[Lane],
        now: std::time::Instant,
    ) -> Result<(), StoreError> {
        let starts: Vec<ReadStarts> = {
            let mut partitions = self.partitions();
            let count = partitions.len();
            if count == 0 {
                return Ok(());
            }
            // What acknowledgements settle, for every partition (those not read too).
            for (key, runtime) in partitions.iter_mut() {
                self.settle(key, runtime);
            }
            let awaiting = self.awaiting_commits(&partitions);
            let budget = self.config.buffer_budget_bytes;
            let first = self.next_start.fetch_add(1, Ordering::Relaxed) as usize % count;
            partitions
                .iter()
                .cycle()
                .skip(first)
                .take(count)
                .filter(|(_, runtime)| may_read(runtime.awaiting_commit(), awaiting, count, budget))
                .filter_map(|(key, runtime)| {
                    let reads = self.read_starts(runtime, lanes, now);
                    (!reads.is_empty()).then(|| {
                        (
                            key.clone(),
                            runtime.generation,
                            runtime.idle.appends(),
                            reads,
                        )
                    })
                })
                .collect()
        };
        if starts.is_empty() {
            return Ok(()); // every partition waits for its commits, or has nothing new
        }
        let per_partition = (max / starts.len()).max(MIN_READ);
        let mut filled = 0;
        let mut delivered = [0u64; 2];
        let mut catchup_taken = false;
        let mut failure = None;
        'partitions: for (key, generation, appends, reads) in starts {
            let mut batches = Vec::with_capacity(reads.len());
            let mut damaged = None;
            for (lane, from) in reads {
                let read = if self.config.mode.fresh_first() {
                    self.buffer.read(lane, &key.0, key.1, from, per_partition)
                } else {
                    self.buffer.read_ordered(&key.0, key.1, from, per_partition)
                };
                match read {
                    Ok(batch) => batches.push((lane, from, batch)),
                    Err(StoreError::Damaged { reason, .. }) => {
                        damaged = Some(reason);
                        break;
                    }
                    Err(err) => {
                        // What this fill queued before stays queued, and is counted.
                        failure = Some(err);
                        break 'partitions;
                    }
                }
            }
            let mut partitions = self.partitions();
            let Some(runtime) = partitions
                .get_mut(&key)
                .filter(|runtime| runtime.generation == generation)
            else {
                continue;
            };
            if let Some(reason) = damaged {
                partitions.remove(&key);
                drop(partitions);
                self.damaged_on_read(&key, reason);
                continue;
            }
            for (lane, from, batch) in batches {
                let (queue, slot, next) = if self.config.mode.fresh_first() {
                    let next = &mut runtime.lane_next[lane_index(lane)];
                    (lane_index(lane), ReadSlot::Lane(lane), next)
                } else {
                    (0, ReadSlot::Ordered, &mut runtime.ordered_next)
                };
                if *next != from {
                    continue; // read again meanwhile (cannot happen: one reader at a time)
                }
                let found = !batch.records.is_empty() || batch.next != from;
                if found && runtime.idle.missed(slot, appends) {
                    tracing::debug!(
                        topic = key.0,
                        partition = key.1,
                        "a read left out since it reached the buffer's end found more with no append reported"
                    );
                }
                runtime.idle.read(slot, appends, batch.exhausted, now);
                *next = batch.next;
                catchup_taken |= batch.lane == Lane::Catchup && !batch.records.is_empty();
                let queued = self.deliver(
                    &key,
                    runtime,
                    batch.lane,
                    batch.records,
                    batch.next,
                    &mut queues[queue],
                );
                filled += queued;
                delivered[lane_index(batch.lane)] += queued as u64;
            }
            self.settle(&key, runtime);
            if filled >= max {
                break;
            }
        }
        if catchup_taken {
            self.catchup_taken.taken();
        }
        for lane in Lane::ALL {
            if delivered[lane_index(lane)] > 0 {
                telemetry::records_delivered(
                    &self.group,
                    lane.as_str(),
                    delivered[lane_index(lane)],
                );
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// What a partition's hand-outs and acknowledgements settle: `Latest`'s key index is let
    /// go once the backlog is committed, and the backlog is drained once all handed out.
    fn settle(&self, key: &PartitionId, runtime: &mut PartitionRuntime) {
        if runtime.latest.is_some()
            && KeyIndex::done(runtime.layout.catchup_end(), runtime.acks(0).committable())
        {
            runtime.latest = None;
        }
        if !runtime.drained
            && runtime.acks(0).delivered_next() >= runtime.layout.catchup_end().unwrap_or(0)
        {
            runtime.drained = true;
            self.emit(Event::CatchupDrained {
                topic: key.0.clone(),
                partition: key.1,
            });
        }
    }

    /// What the application acknowledged of `partitions` and waits for a commit; whether the
    /// reader holds back for it (`plan::reader_waits_for_commits`) is noted for the live
    /// thread, which commits sooner meanwhile, and logged once the hold lasts
    /// (`plan::HoldLog`). Looked at by every fill and wherever a commit clears what waited (a
    /// reader that stopped asking must not keep the live thread committing sooner); the
    /// callers hold the partitions' lock.
    pub(super) fn awaiting_commits(
        &self,
        partitions: &BTreeMap<PartitionId, PartitionRuntime>,
    ) -> u64 {
        let awaiting: u64 = partitions
            .values()
            .map(PartitionRuntime::awaiting_commit)
            .sum();
        let waits = reader_waits_for_commits(awaiting, self.config.buffer_budget_bytes);
        let was_waiting = self.waiting_for_commits.swap(waits, Ordering::Relaxed);
        if waits && !was_waiting {
            self.live_wake.wake(); // a commit is due sooner: let it look at its schedule now
        }
        if waits || was_waiting {
            let notice = self
                .hold_log
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .look(waits, std::time::Instant::now());
            match notice {
                HoldNotice::Quiet if waits != was_waiting => {
                    tracing::debug!(
                        awaiting_bytes = awaiting,
                        waits,
                        "reader's hold for commits"
                    );
                }
                HoldNotice::Quiet => {}
                HoldNotice::Warn { held } => tracing::warn!(
                    awaiting_bytes = awaiting,
                    held_ms = held.as_millis() as u64,
                    "records acknowledged wait for commits that have not landed: partitions \
                     with records waiting are not read until theirs land (the buffer keeps \
                     those records until then)"
                ),
                HoldNotice::Ended { held } => tracing::info!(
                    held_ms = held.as_millis() as u64,
                    "commits landed: every partition is read again"
                ),
            }
        }
        awaiting
    }

    /// Whether the reader holds back for commits that have not landed (as of its last look).
    pub fn reader_waits_for_commits(&self) -> bool {
        self.waiting_for_commits.load(Ordering::Relaxed)
    }

    /// Where `runtime`'s reads start: one position in `Ordered` and `Off`, one per lane of
    /// `lanes` in `Concurrent` and `Latest` — where the catch-up lane waits while its key
    /// index is rebuilt. A read that reached the buffer's end since the last append to what
    /// it reads is left out (for [`crate::plan::SWEEP_EVERY`] at most: `now`).
    fn read_starts(
        &self,
        runtime: &PartitionRuntime,
        lanes: &[Lane],
        now: std::time::Instant,
    ) -> Vec<(Lane, i64)> {
        if !self.config.mode.fresh_first() {
            if !runtime.idle.worth_reading(ReadSlot::Ordered, now) {
                return Vec::new();
            }
            return vec![(Lane::Catchup, runtime.ordered_next)];
        }
        let waits = |lane: Lane| {
            lane == Lane::Catchup
                && runtime
                    .latest
                    .as_ref()
                    .is_some_and(|index| !index.catchup_may_deliver())
        };
        lanes
            .iter()
            .filter(|&&lane| !waits(lane) && runtime.idle.worth_reading(ReadSlot::Lane(lane), now))
            .map(|&lane| (lane, runtime.lane_next[lane_index(lane)]))
            .collect()
    }

    /// Takes a partition whose buffered records failed verification off the reader: its
    /// queued deliveries are dropped, its acknowledgements ignored, and the live thread
    /// discards its records and reconciles it again from Kafka's committed offsets.
    pub(super) fn damaged_on_read(&self, key: &PartitionId, reason: String) {
        tracing::warn!(
            topic = key.0,
            partition = key.1,
            "buffered records failed verification ({reason}); discarding them and refetching from the committed offset"
        );
        self.damaged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key.clone());
        self.revocations.fetch_add(1, Ordering::Relaxed);
        self.emit(Event::LocalDiscarded {
            topic: key.0.clone(),
            partition: key.1,
            reason: format!("damaged: {reason}"),
        });
    }

    /// Drops `partitions` from those waiting to be refetched as damaged (revoked meanwhile).
    pub fn forget_damaged(&self, partitions: &[PartitionId]) {
        let mut damaged = self
            .damaged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for key in partitions {
            damaged.remove(key);
        }
    }

    /// The partitions taken off the reader as damaged since the last call.
    pub fn take_damaged(&self) -> BTreeSet<PartitionId> {
        std::mem::take(
            &mut *self
                .damaged
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// Hands `records` (read up to `next`) out onto `queue`; how many it queued.
    pub(super) fn deliver(
        &self,
        key: &PartitionId,
        runtime: &mut PartitionRuntime,
        lane: Lane,
        records: Vec<crate::store::Record>,
        next: i64,
        queue: &mut VecDeque<Delivery>,
    ) -> usize {
        let delivery_lane = runtime.delivery_lane(lane);
        if lane == Lane::Live && !records.is_empty() {
            if let Some(since) = runtime.awaiting_fresh_since.take() {
                telemetry::time_to_first_fresh(&self.group, since.elapsed().as_secs_f64());
            }
        }
        if lane == Lane::Live {
            let newest = records
                .iter()
                .rev()
                .find_map(|record| match record.timestamp {
                    crate::store::Timestamp::CreateTime(ms)
                    | crate::store::Timestamp::LogAppendTime(ms) => Some(ms),
                    crate::store::Timestamp::NotAvailable => None,
                });
            if newest.is_some() {
                runtime.newest_live_ms = newest;
            }
        }
        let index = lane_index(lane);
        let queued_before = queue.len();
        queue.reserve(records.len());
        let mut superseded = 0;
        let mut freed = 0;
        for record in records {
            runtime.hand_out(index, record.offset, record.payload_bytes());
            let verdict = runtime.latest.as_mut().map_or(Verdict::Deliver, |keys| {
                keys.verdict(record.key.as_deref(), record.offset)
            });
            if verdict == Verdict::Skip {
                // Processed as far as commits go: a newer record of its key is seen.
                freed += runtime.acknowledge(index, record.offset);
                superseded += 1;
                continue;
            }
            queue.push_back(Delivery {
                topic: runtime.topic.clone(),
                partition: key.1,
                offset: record.offset,
                key: record.key,
                payload: record.payload,
                headers: types::DeliveryHeaders::stored(record.headers),
                timestamp: types::Timestamp::stored(record.timestamp),
                lane: delivery_lane,
                generation: runtime.generation,
            });
        }
        runtime.lanes_mut()[index].read_through(next);
        let queued = queue.len() - queued_before;
        let newest = queue.back().filter(|_| queued > 0);
        if let (Lane::Live, Some(last), Mode::Latest) = (lane, newest, self.config.mode) {
            self.live_handed_to(key, last.offset + 1);
        }
        if superseded > 0 {
            telemetry::records_superseded(&self.group, lane.as_str(), superseded);
            self.add_processed(freed);
        }
        queued
    }

    /// Whether `delivery` belongs to a current assignment of its partition.
    pub fn is_current(&self, delivery: &Delivery) -> bool {
        let partitions = self.partitions();
        partitions
            .get(&(delivery.topic.to_string(), delivery.partition))
            .is_some_and(|runtime| runtime.generation == delivery.generation)
    }

    /// Marks a delivery processed: queued, and applied by whoever takes the partitions'
    /// lock next (see [`partitions`](Shared::partitions)).
    pub fn ack(&self, token: AckToken) {
        self.queue_ack(token);
    }

    /// Applies acknowledgements to their partitions, under the partitions' lock. The
    /// assignment names the partition; an ack of an earlier assignment of it (the partition
    /// was revoked since) finds another generation there and is ignored.
    pub(super) fn apply_acks(
        &self,
        partitions: &mut BTreeMap<PartitionId, PartitionRuntime>,
        acks: &[AckToken],
    ) {
        let generations = self.generations();
        let mut freed_total = 0;
        let mut last: Option<(u64, &PartitionId)> = None;
        for token in acks {
            // Acks come in runs of one assignment: look it up once per run.
            let key = match last {
                Some((generation, key)) if generation == token.generation => key,
                _ => match generations.get(&token.generation) {
                    Some(key) => {
                        last = Some((token.generation, key));
                        key
                    }
                    None => continue,
                },
            };
            let Some(runtime) = partitions.get_mut(key) else {
                continue;
            };
            if runtime.generation != token.generation || key.1 != token.partition {
                continue;
            }
            let lane = lane_index(store_lane(token.lane));
            freed_total += runtime.acknowledge(lane, token.offset);
        }
        self.add_processed(freed_total);
    }
}

pub(super) fn store_lane(lane: DeliveryLane) -> Lane {
    match lane {
        DeliveryLane::Catchup => Lane::Catchup,
        DeliveryLane::Live | DeliveryLane::Plain => Lane::Live,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Fetched, Record, Timestamp};
    use std::time::Instant;

    const TOPIC: &str = "orders";

    fn key() -> PartitionId {
        (TOPIC.to_owned(), 0)
    }

    /// An `Ordered` consumer holding partition 0 split at 10 (backlog 0..10).
    fn split_consumer(dir: &std::path::Path) -> Shared {
        let shared = Shared::for_tests(dir);
        shared
            .buffer
            .reset_partition(TOPIC, 0, PartitionLayout::split(1, 0, 10))
            .expect("lay out");
        let (state, layout) = laid_out(&shared);
        let generation = shared.next_generation(&key());
        let token = SplitToken {
            epoch: 1,
            from: 0,
            boundary: 10,
            secret: crate::plan::SplitSecret::from_bytes([42; 16]),
        };
        let runtime =
            PartitionRuntime::new(TOPIC, generation, &state, layout, Some(token), None, 0);
        shared.partitions().insert(key(), runtime);
        shared
    }

    /// The partition's state and layout as the buffer holds them.
    fn laid_out(shared: &Shared) -> (PartitionState, LayoutId) {
        let state = shared.buffer.partition_state(TOPIC, 0).expect("state");
        let layout = shared.buffer.layout_id(TOPIC, 0).expect("layout");
        let (Some(state), Some(layout)) = (state, layout) else {
            panic!("the partition is laid out");
        };
        (state, layout)
    }

    /// Appends `offsets` to `lane` (proven up to `next`), reported to the reader or not.
    fn append(shared: &Shared, lane: Lane, offsets: std::ops::Range<i64>, next: i64, report: bool) {
        let (state, layout) = laid_out(shared);
        let records: Vec<Record> = offsets
            .map(|offset| Record {
                offset,
                timestamp: Timestamp::CreateTime(offset),
                key: None,
                payload: Some(vec![1; 10].into()),
                headers: Vec::new(),
            })
            .collect();
        let fetched = Fetched {
            layout,
            continues_from: state.lane(lane).fetched_next,
            records: &records,
            next,
        };
        let outcome = shared
            .buffer
            .append(lane, TOPIC, 0, fetched)
            .expect("append");
        if report {
            shared.add_buffered(
                &key(),
                lane,
                layout,
                outcome.fetched_next,
                outcome.stored_bytes,
            );
        }
    }

    /// The offsets one fill at `now` queues.
    fn fill(shared: &Shared, now: Instant) -> Vec<i64> {
        let mut queues = [VecDeque::new(), VecDeque::new()];
        shared
            .fill_at(&mut queues, 256, &[Lane::Live, Lane::Catchup], now)
            .expect("fill");
        queues
            .iter()
            .flatten()
            .map(|delivery| delivery.offset)
            .collect()
    }

    #[test]
    fn a_fill_reads_again_only_partitions_appended_since_a_read_reached_their_end() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = split_consumer(dir.path());
        let now = Instant::now();
        append(&shared, Lane::Catchup, 0..5, 5, true);
        assert_eq!(fill(&shared, now), vec![0, 1, 2, 3, 4]);
        assert_eq!(
            fill(&shared, now),
            Vec::<i64>::new(),
            "read to its end: left out"
        );
        // The live lane waits behind the backlog; its append is reported.
        append(&shared, Lane::Live, 10..13, 13, true);
        assert_eq!(
            fill(&shared, now),
            Vec::<i64>::new(),
            "the backlog is not fetched through"
        );
        // The catch-up fetcher proves 5..10 empty (no record), and does not say so yet.
        append(&shared, Lane::Catchup, 5..5, 10, false);
        assert_eq!(
            fill(&shared, now),
            Vec::<i64>::new(),
            "left out: nothing reported"
        );
        let (_, layout) = laid_out(&shared);
        shared.add_buffered(&key(), Lane::Catchup, layout, 10, 0);
        assert_eq!(
            fill(&shared, now),
            Vec::<i64>::new(),
            "read through the gap"
        );
        assert_eq!(
            fill(&shared, now),
            vec![10, 11, 12],
            "then on into the live lane"
        );
    }

    #[test]
    fn damage_found_past_what_was_acknowledged_is_discarded_once() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = split_consumer(dir.path());
        let mut events = shared.subscribe_events();
        let now = Instant::now();
        append(&shared, Lane::Catchup, 0..5, 5, true);
        let mut queues = [VecDeque::new(), VecDeque::new()];
        shared
            .fill_at(&mut queues, 256, &[Lane::Live, Lane::Catchup], now)
            .expect("fill");
        for delivery in queues.iter().flatten() {
            shared.ack(delivery.ack_token());
        }
        // More of the backlog is fetched, not read yet, and its chunk is lost on disk: the
        // commit cycle's look past what was acknowledged (for offsets that hold no record)
        // is the first read to get there.
        append(&shared, Lane::Catchup, 5..8, 8, false);
        shared.buffer.lose_chunk(Lane::Catchup, TOPIC, 0, 5);
        // A commit of other partitions (a revoke's) plans nothing for this one: it stays.
        assert!(shared.pending_commits(Some(&[][..])).is_empty());
        assert!(
            shared.partitions().contains_key(&key()),
            "left for a full cycle"
        );
        let pending = shared.pending_commits(None);
        assert!(
            matches!(
                pending.as_slice(),
                [PendingCommit {
                    plan: CommitPlan::Split { main: Some(5), .. },
                    ..
                }]
            ),
            "what was acknowledged is committed: {pending:?}"
        );
        for cycle in 1..3 {
            let pending = shared.pending_commits(None);
            assert!(pending.is_empty(), "cycle {cycle}: {pending:?}");
        }
        assert!(
            !shared.partitions().contains_key(&key()),
            "taken off the reader, as a read's damage takes it"
        );
        assert_eq!(shared.take_damaged(), BTreeSet::from([key()]));
        let reported: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
        assert!(
            matches!(reported.as_slice(), [Event::LocalDiscarded { reason, .. }] if reason.contains("missing")),
            "reported once, as a discard: {reported:?}"
        );
    }

    #[test]
    fn a_read_left_out_long_enough_finds_what_was_never_reported() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = split_consumer(dir.path());
        let now = Instant::now();
        append(&shared, Lane::Catchup, 0..3, 3, true);
        assert_eq!(fill(&shared, now), vec![0, 1, 2]);
        assert_eq!(fill(&shared, now), Vec::<i64>::new());
        append(&shared, Lane::Catchup, 3..6, 6, false);
        assert_eq!(
            fill(&shared, now),
            Vec::<i64>::new(),
            "left out: nothing reported"
        );
        let later = now + crate::plan::SWEEP_EVERY;
        assert_eq!(
            fill(&shared, later),
            vec![3, 4, 5],
            "read again after a while"
        );
    }
}
