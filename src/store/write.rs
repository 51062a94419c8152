//! The writing side of the buffer: lay out a partition, append fetched records, record
//! commits (and delete what they cover), discard a partition.

use bincode::Encode;

use std::sync::atomic::Ordering;

use super::compact::Batch;
use super::keys::{self, PartitionKey};
use super::tail::{Pending, Tail};
use super::{
    Buffer, Lane, LayoutId, PartitionLayout, PartitionState, Record, Shard, StoreError, codec,
};

/// A chunk as it is encoded: borrows the records (same bytes as [`super::record::Chunk`]).
#[derive(Encode)]
struct ChunkRef<'a> {
    next: u64,
    records: &'a [Record],
}

/// Rough encoded size of a record, to cut batches into chunks of a bounded size.
fn estimated_size(record: &Record) -> usize {
    record.payload_bytes() + 16 + 4 * record.headers.len()
}

/// A batch as a fetcher polled it, with what makes it provably continuous (invariant 8):
/// the layout it was fetched under and the lane offset it continues from.
#[derive(Debug, Clone, Copy)]
pub struct Fetched<'a> {
    /// The partition's layout when the fetcher was positioned ([`Buffer::layout_id`]).
    pub layout: LayoutId,
    /// The lane's `fetched_next` the fetcher started this batch from. Every offset between it
    /// and `next` that is not in `records` was proven absent by the fetcher.
    pub continues_from: i64,
    /// The records, in increasing offset order, none below `continues_from`.
    pub records: &'a [Record],
    /// The fetcher's proven position after the batch: past the last record, further only
    /// where the same fetch proved the offsets empty.
    pub next: i64,
}

/// A batch as a fetcher polled it, given to the buffer: [`Fetched`] with the records owned,
/// so that they move into the buffer ([`Buffer::append_owned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedBatch {
    /// The partition's layout when the fetcher was positioned.
    pub layout: LayoutId,
    /// The lane offset the batch continues from.
    pub continues_from: i64,
    /// The records, in increasing offset order.
    pub records: Vec<Record>,
    /// Proven position after the batch.
    pub next: i64,
}

/// Whether a write of the memory tier is held to the write allowance (see `allowance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowed {
    /// A spill, or a clean close's write: held to the allowance (the rest stays in memory).
    WithinAllowance,
    /// An append written through, or a durability point: written (and counted) regardless.
    Always,
}

/// Bytes the memory tier spills between two waits for sled's writes (see
/// `Buffer::relieve_memory`): two segments of the default size.
const SPILL_FLUSH_BYTES: u64 = 8 << 20;

impl FetchedBatch {
    /// The batch, borrowed.
    pub fn as_fetched(&self) -> Fetched<'_> {
        Fetched {
            layout: self.layout,
            continues_from: self.continues_from,
            records: &self.records,
            next: self.next,
        }
    }
}

/// An upper bound of what decoding `record` alone claims against [`codec::DECODE_LIMIT`]
/// (its encoded size, the record and its headers in memory).
fn decode_claim_bound(record: &Record) -> usize {
    record.payload_bytes()
        + 64
        + record.headers.len() * (32 + std::mem::size_of::<super::Header>())
        + std::mem::size_of::<Record>()
}

/// What an append stored.
#[derive(Debug)]
pub struct AppendOutcome {
    /// Records written (the batch minus what the lane already held or does not own).
    pub stored: usize,
    /// Key, payload and header bytes of the records written.
    pub stored_bytes: u64,
    /// The lane's fetch position after the append.
    pub fetched_next: i64,
    /// The memory tier's spill after the append failed. The append itself was made (its
    /// records are held in memory, readable, and the lane stands at `fetched_next`), so it is
    /// answered as made; the caller treats the error as any failed write (an I/O failure
    /// stops writing).
    pub relief_failed: Option<StoreError>,
}

#[cfg(test)]
thread_local! {
    /// Makes this thread's spills fail as a failed write would: what the tests hold an
    /// append's answer to when the memory tier cannot spill.
    pub(crate) static FAIL_SPILLS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Buffer {
    /// The failure a unit test asked this thread's spills to meet ([`FAIL_SPILLS`]).
    #[cfg(test)]
    fn injected_spill_failure(&self) -> Option<StoreError> {
        FAIL_SPILLS
            .with(std::cell::Cell::get)
            .then(|| StoreError::Io {
                dir: self.dir.clone(),
                action: "spilling (a failure the test asked for)".into(),
                error: std::io::Error::other("injected"),
            })
    }

    /// None outside the unit tests.
    #[cfg(not(test))]
    fn injected_spill_failure(&self) -> Option<StoreError> {
        None
    }

    /// Removes the chunk at `first` of `topic`/`partition`'s `lane` from sled, as a damaged
    /// disk loses it while the partition's state still counts it.
    #[cfg(test)]
    pub(crate) fn lose_chunk(&self, lane: Lane, topic: &str, partition: i32, first: u64) {
        let part = self
            .partition_key(topic, partition)
            .expect("partition key")
            .expect("a known partition");
        let removed = self
            .db()
            .expect("open")
            .remove(keys::chunk(lane, part, first))
            .expect("remove");
        assert!(removed.is_some(), "no chunk at {first} to lose");
    }
}

impl Buffer {
    /// Lays out `topic`/`partition` afresh: drops whatever the buffer held for it and
    /// records `layout` with nothing fetched and nothing committed, in one atomic batch.
    pub fn reset_partition(
        &self,
        topic: &str,
        partition: i32,
        layout: PartitionLayout,
    ) -> Result<PartitionState, StoreError> {
        layout
            .validate()
            .map_err(|reason| self.rejected(topic, partition, reason))?;
        let partition_number = self.partition_number(topic, partition)?;
        let part = PartitionKey {
            topic_id: self.topic_id_or_insert(topic)?,
            partition: partition_number,
        };
        let mut shard = self.partition_lock(part);
        let (mut batch, removed) = self.removal_batch(part)?;
        let state = PartitionState::new(layout);
        batch.insert(keys::state(part), codec::encode(&state));
        self.apply(batch)?;
        self.forget_tail(&mut shard, part);
        self.compaction.removed(removed);
        self.new_layout_id(part);
        Ok(state)
    }

    /// Appends a batch fetched for `lane` of `topic`/`partition`.
    ///
    /// The buffer proves before it stores (invariant 8): the batch must carry the partition's
    /// current [`layout`](Buffer::layout_id) and continue exactly from the lane's
    /// `fetched_next`; anything else is refused with [`StoreError::StaleLayout`] or
    /// [`StoreError::Discontinuous`] and changes nothing — the fetcher refetches from
    /// `fetched_next`. In the catch-up lane, records at or past the current range's end are
    /// dropped (the live lane owns them). With a memory tier
    /// ([`BufferOptions::memory_bytes`](super::BufferOptions)) the records are kept in memory
    /// and written to sled only if they wait beyond it; without, the records and the lane's
    /// new `fetched_next` are written in one atomic batch.
    pub fn append(
        &self,
        lane: Lane,
        topic: &str,
        partition: i32,
        fetched: Fetched<'_>,
    ) -> Result<AppendOutcome, StoreError> {
        self.append_records(lane, topic, partition, fetched, None)
    }

    /// [`append`](Self::append) of a batch the caller gives away: its records move into the
    /// buffer instead of being copied.
    pub fn append_owned(
        &self,
        lane: Lane,
        topic: &str,
        partition: i32,
        batch: FetchedBatch,
    ) -> Result<AppendOutcome, StoreError> {
        let FetchedBatch {
            layout,
            continues_from,
            records,
            next,
        } = batch;
        let fetched = Fetched {
            layout,
            continues_from,
            records: &[],
            next,
        };
        self.append_records(lane, topic, partition, fetched, Some(records))
    }

    /// The append: `owned`, when given, holds the records (`fetched.records` is then unused).
    fn append_records(
        &self,
        lane: Lane,
        topic: &str,
        partition: i32,
        fetched: Fetched<'_>,
        owned: Option<Vec<Record>>,
    ) -> Result<AppendOutcome, StoreError> {
        let Fetched {
            layout,
            continues_from,
            records: borrowed,
            next: next_offset,
        } = fetched;
        let records: &[Record] = owned.as_deref().unwrap_or(borrowed);
        let no_layout = || self.not_laid_out(topic, partition);
        let part = self
            .partition_key(topic, partition)?
            .ok_or_else(no_layout)?;
        let mut shard = self.partition_lock(part);
        // Checked before the partition's state: a writer under a layout that was discarded
        // is stale whether or not the partition is laid out again yet (its consumer may be
        // waiting to be reconciled), and must hear so to leave.
        let current = self.layout_id_of(part);
        if layout != current {
            return Err(StoreError::StaleLayout {
                dir: self.dir.clone(),
                topic: topic.to_owned(),
                partition,
                lane,
                fetched_under: layout,
                current,
            });
        }
        let tail = self.tail_in(&mut shard, part)?.ok_or_else(no_layout)?;
        let state = tail.logical();
        let expected = state.lane(lane).fetched_next;
        if continues_from != expected {
            return Err(StoreError::Discontinuous {
                dir: self.dir.clone(),
                topic: topic.to_owned(),
                partition,
                lane,
                continues_from,
                fetched_next: expected,
            });
        }
        if let Some(first) = records.first() {
            if first.offset < continues_from {
                return Err(self.rejected(
                    topic,
                    partition,
                    format!(
                        "{lane} lane: record {} lies below the offset {continues_from} the batch continues from",
                        first.offset
                    ),
                ));
            }
        }
        let plan = state
            .plan_append(lane, records, next_offset)
            .map_err(|reason| self.rejected(topic, partition, format!("{lane} lane: {reason}")))?;
        let Some(plan) = plan else {
            return Ok(AppendOutcome {
                stored: 0,
                stored_bytes: 0,
                fetched_next: expected,
                relief_failed: None,
            });
        };
        // Refused now, not when a spill finds it: a record no read could decode.
        if let Some(record) = records[plan.keep.clone()]
            .iter()
            .find(|record| decode_claim_bound(record) > codec::DECODE_LIMIT / 2)
        {
            self.check_decodable(topic, partition, lane, std::slice::from_ref(record), {
                codec::encode(&ChunkRef {
                    next: plan.next as u64,
                    records: std::slice::from_ref(record),
                })
                .len()
            })?;
        }
        let kept = match owned {
            Some(mut owned) => {
                owned.truncate(plan.keep.end);
                owned.drain(..plan.keep.start);
                owned
            }
            None => records[plan.keep.clone()].to_vec(),
        };
        let stored = kept.len();
        let stored_bytes: u64 = kept.iter().map(|r| r.payload_bytes() as u64).sum();
        let fetched_next = state.normalize(lane, plan.next);
        let held_bytes = super::tail::append_cost(&kept);
        let pending = Pending {
            first: plan.first,
            next: plan.next,
            fetched_next,
            records: kept,
            bytes: held_bytes,
            taken: false,
        };
        tail.push(lane, pending);
        let held = self.tail_bytes.fetch_add(held_bytes, Ordering::Relaxed) + held_bytes;
        let taken = self.tail_taken_bytes.load(Ordering::Relaxed);
        let allowed = self.memory_bytes.load(Ordering::Relaxed);
        if allowed == 0 {
            // No memory tier: written through, the state with it (and whatever an earlier
            // allowance left in memory before it).
            if let Err(err) = self.spill(part, tail, lane, 0, Allowed::Always) {
                // The append did not happen: its fetcher fetches it again.
                if tail.pop_newest(lane).is_some() {
                    self.tail_bytes.fetch_sub(held_bytes, Ordering::Relaxed);
                }
                return Err(err);
            }
        }
        // The append is made from here on, whatever the spill does: an error returned now
        // would tell the fetcher its lane did not move, and it would neither report the
        // append (the reader waits for the report, the byte budget counts it) nor fetch on
        // from where the lane stands.
        let relief_failed = if allowed > 0 && super::tail::must_spill(held, taken, allowed) {
            drop(shard);
            self.relieve_memory().err()
        } else {
            None
        };
        Ok(AppendOutcome {
            stored,
            stored_bytes,
            fetched_next,
            relief_failed,
        })
    }

    /// The memory tier holds more than it may: spills the largest lanes' oldest appends to
    /// sled until it holds three quarters of its allowance. The lanes that grow are those
    /// whose records wait (a live lane behind a backlog, a reader behind its fetcher). sled
    /// holds each lane's prefix, so a lane spills its oldest appends: behind a backlog, what
    /// the reader gets to last; behind a fetcher, what it reads next (from sled, then).
    ///
    /// Every [`SPILL_FLUSH_BYTES`] spilled, it then waits for sled to write what it was
    /// handed. sled copies writes into segment-sized buffers (4 MiB) in memory and hands full
    /// ones to its I/O threads, with no bound on how many wait: a fetcher spilling faster than
    /// the disk takes writes (the kernel throttles a writer with many dirty pages) piled them
    /// up — `catchup run` peaked at 303–505 MiB with 1 KiB records where it holds under
    /// 200 MiB. Waiting makes the disk's pace the spiller's. The wait is sled's flush, as its
    /// own flusher runs every `flush_every_ms`: while it lasts, sled holds back every other
    /// write of the process too (a write takes sled's lock exclusively, a flush shares it), so
    /// the other fetcher's appends and the commits wait with it — for as long as the disk
    /// takes 8 MiB.
    fn relieve_memory(&self) -> Result<(), StoreError> {
        let spilled = self.spill_largest_lanes()?;
        let unflushed = self.spilled_unflushed.fetch_add(spilled, Ordering::Relaxed) + spilled;
        // After a failed write sled's flush can block for good: no wait then (the consumer
        // stops writing anyway).
        if unflushed >= SPILL_FLUSH_BYTES {
            self.spilled_unflushed.store(0, Ordering::Relaxed);
            self.write_out()?;
        }
        Ok(())
    }

    /// Waits for sled to write out what it was handed, so that the filesystem's free space
    /// shows it (sled's flush). Does nothing after a failed write: sled's flush can block
    /// for good then, and the consumer stops writing anyway.
    pub fn write_out(&self) -> Result<(), StoreError> {
        if self.write_failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let handed = self.allowance.handed_so_far();
        self.db()?.flush().map_err(|err| {
            self.write_failed.store(true, Ordering::Relaxed);
            self.sled_error(err)
        })?;
        self.allowance.written_out(handed);
        Ok(())
    }

    /// Sets how many bytes the memory tier may write to sled from now on (its spills stop
    /// there, leaving the rest in memory), from the free space above the filesystem's floor
    /// (see `allowance`). Without a call, there is no limit.
    pub fn set_write_allowance(&self, disk_bytes: u64) {
        self.allowance.set(disk_bytes);
    }

    /// Bytes sled was handed that it may not have written out yet: not in the filesystem's
    /// free space (see [`write_out`](Self::write_out)).
    pub fn unwritten_bytes(&self) -> u64 {
        self.allowance.unwritten()
    }

    /// Whether a spill stopped at the write allowance since it was last set: the memory tier
    /// holds more than it may until the next allowance.
    pub fn write_allowance_spent(&self) -> bool {
        self.allowance.held_back()
    }

    /// Spills the largest lanes' oldest appends until a quarter of the tier's bounds is free
    /// again ([`spilled_enough`](super::tail::spilled_enough)); the bytes spilled. While what
    /// waits is over its bound, the lanes with the most records no reader took go first.
    fn spill_largest_lanes(&self) -> Result<u64, StoreError> {
        let allowed = self.memory_bytes.load(Ordering::Relaxed);
        let mut spilled = 0;
        loop {
            let held = self.tail_bytes.load(Ordering::Relaxed);
            let taken = self.tail_taken_bytes.load(Ordering::Relaxed);
            if super::tail::spilled_enough(held, taken, allowed) {
                break;
            }
            let untaken_over = held.saturating_sub(taken) > allowed / 4 * 3;
            let mut largest: Option<(PartitionKey, Lane, u64)> = None;
            for shard in &self.partition_locks {
                let shard = super::lock(shard);
                for (part, tail) in &shard.tails {
                    for lane in Lane::ALL {
                        let measure = if untaken_over {
                            tail.untaken(lane)
                        } else {
                            tail.counts(lane).1
                        };
                        if measure > largest.map_or(0, |(_, _, most)| most) {
                            largest = Some((*part, lane, measure));
                        }
                    }
                }
            }
            let Some((part, lane, bytes)) = largest else {
                break;
            };
            let mut shard = self.partition_lock(part);
            let Some(tail) = shard.tails.get_mut(&part) else {
                break;
            };
            // Nothing written: the write allowance is spent (or nothing is left to write).
            match self.spill(part, tail, lane, bytes / 2, Allowed::WithinAllowance)? {
                0 => break,
                bytes => spilled += bytes,
            }
        }
        Ok(spilled)
    }

    /// Writes `lane`'s oldest appends in memory to sled until it holds at most `keep_bytes`
    /// there; the bytes written. A failed write leaves them in memory.
    fn spill(
        &self,
        part: PartitionKey,
        tail: &mut Tail,
        lane: Lane,
        keep_bytes: u64,
        write: Allowed,
    ) -> Result<u64, StoreError> {
        let mut popped = Vec::new();
        while tail.counts(lane).1 > keep_bytes {
            let Some(oldest) = tail.oldest_bytes(lane) else {
                break;
            };
            if write == Allowed::WithinAllowance && !self.allowance.take(oldest) {
                break;
            }
            popped.extend(tail.pop_oldest(lane));
        }
        if popped.is_empty() {
            return Ok(0);
        }
        let bytes: u64 = popped.iter().map(|pending| pending.bytes).sum();
        if write == Allowed::Always {
            self.allowance.spend(bytes);
        }
        let taken: u64 = popped
            .iter()
            .filter(|pending| pending.taken)
            .map(|pending| pending.bytes)
            .sum();
        let mut persisted = tail.persisted.clone();
        let written = match self.injected_spill_failure() {
            Some(err) => Err(err),
            None => self.write_pending(part, &mut persisted, lane, &popped),
        };
        self.allowance.landed(bytes, written.is_ok());
        match written {
            Ok(()) => {
                tail.persisted = persisted;
                self.tail_bytes.fetch_sub(bytes, Ordering::Relaxed);
                self.tail_taken_bytes.fetch_sub(taken, Ordering::Relaxed);
                if self.memory_bytes.load(Ordering::Relaxed) > 0 {
                    self.spilled_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                Ok(bytes)
            }
            Err(err) => {
                tail.restore_oldest(lane, popped);
                Err(err)
            }
        }
    }

    /// Writes appends of `lane`, in order from `persisted`'s `fetched_next`, as chunks, with
    /// the state moved past them, in one atomic batch; `persisted` is that state.
    fn write_pending(
        &self,
        part: PartitionKey,
        persisted: &mut PartitionState,
        lane: Lane,
        appends: &[Pending],
    ) -> Result<(), StoreError> {
        let topic = self
            .topic_name(part.topic_id)
            .unwrap_or_else(|| format!("topic id {}", part.topic_id));
        let partition = part.partition as i32;
        let mut batch = Batch::default();
        let mut value = Vec::new();
        let mut written: u64 = 0;
        let mut stored_bytes: u64 = 0;
        for pending in appends {
            if pending.first != persisted.lane(lane).fetched_next {
                return Err(self.rejected(
                    &topic,
                    partition,
                    format!(
                        "{lane} lane: an append from {} does not continue the stored lane at {}",
                        pending.first,
                        persisted.lane(lane).fetched_next
                    ),
                ));
            }
            let kept = &pending.records;
            let mut chunk_first = pending.first;
            let mut chunk_start = 0;
            let mut chunk_bytes = 0;
            for (index, record) in kept.iter().enumerate() {
                let size = estimated_size(record);
                if chunk_bytes > 0 && chunk_bytes + size > self.options.chunk_target_bytes {
                    // The next chunk starts at this record: the chunks stay contiguous.
                    let chunk = ChunkRef {
                        next: record.offset as u64,
                        records: &kept[chunk_start..index],
                    };
                    codec::encode_into(&chunk, &mut value);
                    self.check_decodable(&topic, partition, lane, chunk.records, value.len())?;
                    let key = keys::chunk(lane, part, chunk_first as u64);
                    written += (key.len() + value.len()) as u64;
                    batch.insert(key, value.as_slice());
                    chunk_first = record.offset;
                    chunk_start = index;
                    chunk_bytes = 0;
                }
                chunk_bytes += size;
            }
            let chunk = ChunkRef {
                next: pending.next as u64,
                records: &kept[chunk_start..],
            };
            codec::encode_into(&chunk, &mut value);
            self.check_decodable(&topic, partition, lane, chunk.records, value.len())?;
            let key = keys::chunk(lane, part, chunk_first as u64);
            written += (key.len() + value.len()) as u64;
            batch.insert(key, value.as_slice());
            persisted.lane_mut(lane).fetched_next = pending.fetched_next;
            stored_bytes += kept.iter().map(|r| r.payload_bytes() as u64).sum::<u64>();
        }
        batch.insert(keys::state(part), codec::encode(&*persisted));
        self.apply(batch)?;
        self.compaction.added(written, stored_bytes);
        Ok(())
    }

    /// Writes everything the memory tier holds to sled, so that the next start finds it
    /// (a clean close, a durability point). A crash skips this: memory is lost, and those
    /// records are fetched again from Kafka.
    pub fn flush_memory(&self) -> Result<(), StoreError> {
        self.write_memory(Allowed::Always)
    }

    /// Writes what the memory tier holds to sled as far as the write allowance goes (see
    /// [`set_write_allowance`](Self::set_write_allowance)), each lane's oldest appends first:
    /// at a clean close near the free-space floor. What it leaves in memory (the bytes
    /// returned) is fetched again from Kafka by the next start.
    pub fn flush_memory_within_allowance(&self) -> Result<u64, StoreError> {
        self.write_memory(Allowed::WithinAllowance)?;
        Ok(self.memory_held())
    }

    fn write_memory(&self, write: Allowed) -> Result<(), StoreError> {
        for shard in &self.partition_locks {
            let mut shard = super::lock(shard);
            let parts: Vec<PartitionKey> = shard.tails.keys().copied().collect();
            for part in parts {
                if let Some(tail) = shard.tails.get_mut(&part) {
                    for lane in Lane::ALL {
                        self.spill(part, tail, lane, 0, write)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets how many bytes the memory tier may hold (see
    /// [`BufferOptions::memory_bytes`](super::BufferOptions)), writing what it holds beyond
    /// that to sled now.
    pub fn set_memory_bytes(&self, bytes: u64) -> Result<(), StoreError> {
        self.memory_bytes.store(bytes, Ordering::Relaxed);
        if bytes == 0 {
            self.flush_memory()
        } else {
            self.relieve_memory()
        }
    }

    /// Forgets what the memory tier holds without writing it: what a crash of the process
    /// does to it (for simulations of one; those records are fetched again from Kafka).
    /// Returns the bytes forgotten.
    pub fn forget_memory(&self) -> u64 {
        let held = self.memory_held();
        for shard in &self.partition_locks {
            let mut shard = super::lock(shard);
            let parts: Vec<PartitionKey> = shard.tails.keys().copied().collect();
            for part in parts {
                self.forget_tail(&mut shard, part);
            }
        }
        held
    }

    /// Bytes of records the memory tier holds now.
    pub fn memory_held(&self) -> u64 {
        self.tail_bytes.load(Ordering::Relaxed)
    }

    /// Bytes the memory tier wrote to sled so far: what waited beyond its allowance (the
    /// writes a write-through buffer makes are not counted).
    pub fn spilled_bytes(&self) -> u64 {
        self.spilled_bytes.load(Ordering::Relaxed)
    }

    /// The memory tier of `part` under its lock, loaded with its state from sled on first
    /// use; `None` when the partition is not laid out.
    pub(super) fn tail_in<'s>(
        &self,
        shard: &'s mut Shard,
        part: PartitionKey,
    ) -> Result<Option<&'s mut Tail>, StoreError> {
        match shard.tails.entry(part) {
            std::collections::hash_map::Entry::Occupied(tail) => Ok(Some(tail.into_mut())),
            std::collections::hash_map::Entry::Vacant(slot) => Ok(self
                .load_state(part)?
                .map(|state| slot.insert(Tail::new(state)))),
        }
    }

    /// The error for an append or commit to a partition that was never laid out.
    fn not_laid_out(&self, topic: &str, partition: i32) -> StoreError {
        self.rejected(
            topic,
            partition,
            "not laid out; call reset_partition first".into(),
        )
    }

    /// Forgets what the memory tier holds of `part` (its records are being dropped).
    fn forget_tail(&self, shard: &mut Shard, part: PartitionKey) {
        if let Some(tail) = shard.tails.remove(&part) {
            self.tail_bytes.fetch_sub(tail.bytes(), Ordering::Relaxed);
            self.tail_taken_bytes
                .fetch_sub(tail.taken_bytes(), Ordering::Relaxed);
        }
    }

    /// Records that Kafka now holds `committed_next` for `lane` of `topic`/`partition` (the
    /// main log for the catch-up lane, or the side log for the live lane) and deletes the
    /// chunks that offset covers entirely, atomically with the new state.
    ///
    /// Call it only after the commit succeeded: records are never deleted before the offsets
    /// covering them are durable in Kafka. An older or equal offset changes nothing; an
    /// offset past what the lane fetched is rejected. Returns the number of chunks deleted.
    pub fn record_committed(
        &self,
        lane: Lane,
        topic: &str,
        partition: i32,
        committed_next: i64,
    ) -> Result<usize, StoreError> {
        self.commit_lane(lane, topic, partition, committed_next, false)
    }

    /// [`record_committed`](Self::record_committed) at an assignment, with Kafka's position:
    /// one past what `lane` fetched is taken too — Kafka says every record the lane holds
    /// is processed (what the memory tier held before a crash never reached the disk) — and
    /// the lane then resumes there with nothing buffered.
    pub fn record_resumed(
        &self,
        lane: Lane,
        topic: &str,
        partition: i32,
        committed_next: i64,
    ) -> Result<usize, StoreError> {
        self.commit_lane(lane, topic, partition, committed_next, true)
    }

    fn commit_lane(
        &self,
        lane: Lane,
        topic: &str,
        partition: i32,
        committed_next: i64,
        resume: bool,
    ) -> Result<usize, StoreError> {
        let no_layout = || self.not_laid_out(topic, partition);
        let part = self
            .partition_key(topic, partition)?
            .ok_or_else(no_layout)?;
        let mut shard = self.partition_lock(part);
        let tail = self.tail_in(&mut shard, part)?.ok_or_else(no_layout)?;
        let mut logical = tail.logical();
        let mut state = tail.persisted.clone();
        let resumed_past = logical.normalize(lane, committed_next);
        if resume && resumed_past > logical.lane(lane).fetched_next {
            // Kafka is past everything the lane holds: it resumes there, empty.
            logical.lane_mut(lane).fetched_next = resumed_past;
            state.lane_mut(lane).fetched_next = resumed_past;
        }
        let plan = logical
            .plan_commit(lane, committed_next)
            .map_err(|reason| self.rejected(topic, partition, reason))?;
        let Some(committed) = plan else { return Ok(0) };

        // What memory holds below the commit is never written; sled's lane then starts at
        // the commit if it ended below it.
        if committed > state.lane(lane).fetched_next {
            state.lane_mut(lane).fetched_next = committed;
        }

        // Chunks starting below the committed offset: all but the last are wholly committed
        // (the chunks are contiguous); the last one only if it ends there. A chunk starting
        // at it holds nothing committed, and is not read.
        let lane_state = *state.lane(lane);
        let from = keys::chunk(lane, part, lane_state.retained_from as u64);
        let before = keys::chunk(lane, part, committed as u64);
        // Only the last chunk's value is read: a commit far ahead (a reuse at an assignment)
        // must not hold every chunk it deletes in memory at once.
        let mut covered = Vec::new();
        let mut last_value = None;
        for entry in self.db()?.range(from..before) {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            covered.push((key, value.len()));
            last_value = Some(value);
        }
        // Unless a chunk reaches past the commit, the lane's chain goes on at the commit: a
        // chunk missing there is a hole that the next read must find, not a gap to infer
        // (invariant 8). Taking the lane's end for it skipped what the lane still held.
        // (`committed` is normalized by `plan_commit`, and the lane's `fetched_next` was
        // raised to it above.)
        let mut retained_from = committed;
        if let (Some((last_key, _)), Some(last_value)) = (covered.last(), &last_value) {
            let head: super::record::ChunkHead =
                codec::decode_prefix(last_value).map_err(|err| {
                    self.damaged(format!("a chunk of {topic}/{partition} {lane}: {err}"))
                })?;
            // A `next` past i64::MAX (a crafted chunk) must not wrap below the commit and
            // count the chunk as processed: clamped, as reads clamp it.
            let next = i64::try_from(head.next).unwrap_or(i64::MAX);
            if state.normalize(lane, next) > committed {
                retained_from = keys::chunk_first(last_key).ok_or_else(|| {
                    self.damaged(format!("a chunk key of {topic}/{partition} {lane}"))
                })? as i64;
                covered.pop();
            }
        }
        let mut batch = Batch::default();
        let mut removed: u64 = 0;
        for (key, value_len) in &covered {
            removed += (key.len() + value_len) as u64;
            batch.remove(key);
        }
        let lane_state = state.lane_mut(lane);
        lane_state.committed_next = committed;
        lane_state.retained_from = retained_from;
        batch.insert(keys::state(part), codec::encode(&state));
        self.apply(batch)?;
        tail.persisted = state;
        let (dropped, dropped_taken) = tail.drop_committed(lane, committed);
        self.tail_bytes.fetch_sub(dropped, Ordering::Relaxed);
        self.tail_taken_bytes
            .fetch_sub(dropped_taken, Ordering::Relaxed);
        self.compaction.removed(removed);
        Ok(covered.len())
    }

    /// Drops everything the buffer holds for `topic`/`partition` — records of both lanes and
    /// the state — in one atomic batch (the partition was revoked, or its state is stale).
    /// Returns whether there was anything to drop.
    pub fn discard_partition(&self, topic: &str, partition: i32) -> Result<bool, StoreError> {
        let Some(part) = self.partition_key(topic, partition)? else {
            return Ok(false);
        };
        let mut shard = self.partition_lock(part);
        let existed = self
            .db()?
            .contains_key(keys::state(part))
            .map_err(|err| self.sled_error(err))?;
        let (batch, removed) = self.removal_batch(part)?;
        self.apply(batch)?;
        self.forget_tail(&mut shard, part);
        self.compaction.removed(removed);
        self.new_layout_id(part);
        Ok(existed)
    }

    /// Keeps what the buffer holds for `topic`/`partition` but makes every writer positioned
    /// so far stale (the partition was revoked: a fetcher still running for it must not
    /// append, yet a reassignment may reuse the records).
    pub fn retire_layout(&self, topic: &str, partition: i32) -> Result<(), StoreError> {
        if let Some(part) = self.partition_key(topic, partition)? {
            let _guard = self.partition_lock(part);
            self.new_layout_id(part);
        }
        Ok(())
    }

    /// Records Kafka's id for `topic` (its incarnation). When the buffer knew another id —
    /// the topic was deleted and recreated under the same name, its offsets restarting with
    /// other data — every partition of the topic but those `keep` names is discarded first,
    /// and the old id is returned. A crash in between leaves the old id recorded: the next
    /// call discards the rest.
    pub fn record_incarnation(
        &self,
        topic: &str,
        topic_id: &str,
        keep: impl Fn(i32) -> bool,
    ) -> Result<Option<String>, StoreError> {
        let key = keys::incarnation(topic);
        let recorded = match self.db()?.get(&key).map_err(|err| self.sled_error(err))? {
            Some(value) => Some(
                codec::decode::<String>(&value)
                    .map_err(|err| self.damaged(format!("incarnation of topic {topic}: {err}")))?,
            ),
            None => None,
        };
        if recorded.as_deref() == Some(topic_id) {
            return Ok(None);
        }
        if recorded.is_some() {
            for (name, partition, _) in self.partitions()? {
                if name == topic && !keep(partition) {
                    self.discard_partition(topic, partition)?;
                }
            }
        }
        // Under the lock a compaction takes: no write may land in a generation being left.
        let _alloc = super::lock(&self.topic_alloc);
        let mut batch = Batch::default();
        batch.insert(&key, codec::encode(&topic_id.to_owned()));
        self.apply(batch)?;
        Ok(recorded)
    }

    /// A batch removing the state and every chunk of `part`, and the bytes of the chunks.
    fn removal_batch(&self, part: PartitionKey) -> Result<(Batch, u64), StoreError> {
        let mut batch = Batch::default();
        let mut removed: u64 = 0;
        for lane in Lane::ALL {
            for entry in self.db()?.scan_prefix(keys::chunk_prefix(lane, part)) {
                let (key, value) = entry.map_err(|err| self.sled_error(err))?;
                removed += (key.len() + value.len()) as u64;
                batch.remove(key);
            }
        }
        batch.remove(keys::state(part));
        Ok((batch, removed))
    }

    /// Refuses a chunk no read could decode (see [`codec::DECODE_LIMIT`]): stored, it would
    /// stop its partition for good. bincode counts against the limit the bytes it reads and,
    /// up front, the memory of every list it decodes (records, headers).
    fn check_decodable(
        &self,
        topic: &str,
        partition: i32,
        lane: Lane,
        records: &[Record],
        encoded: usize,
    ) -> Result<(), StoreError> {
        let headers: usize = records.iter().map(|r| r.headers.len()).sum();
        let claimed = encoded
            .saturating_add(records.len().saturating_mul(std::mem::size_of::<Record>()))
            .saturating_add(headers.saturating_mul(std::mem::size_of::<super::Header>()));
        if claimed <= codec::DECODE_LIMIT {
            return Ok(());
        }
        let first = records.first().map_or(-1, |r| r.offset);
        Err(self.rejected(
            topic,
            partition,
            format!(
                "{lane} lane: the record at offset {first} needs {claimed} bytes to decode, above the buffer's limit of {} bytes",
                codec::DECODE_LIMIT
            ),
        ))
    }
}
