//! The reading side of the buffer: records in delivery order, partition states, statistics.

use super::keys::{self, PartitionKey};
use super::record::{Chunk, ChunkHead};
use super::{Buffer, Lane, PartitionState, Record, StoreError, codec};

/// Records read from one lane of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    /// The lane they come from.
    pub lane: Lane,
    /// Records by increasing offset.
    pub records: Vec<Record>,
    /// Where the next read continues: past the chunks read (sled) or at the first record left
    /// out (the memory tier), or the `from` given when there was nothing to read.
    pub next: i64,
    /// The read reached the end of what the buffer proved when it ended (seen under the lock
    /// appends take): a read from `next` finds nothing until the partition is appended to.
    /// `Ordered`: its catch-up lane not fetched through yet, or the live lane's end. `false`
    /// whenever that is not known (a spill moved the records meanwhile, the read stopped at
    /// `max_records`).
    pub exhausted: bool,
}

/// What one lane of one partition holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneStats {
    /// The lane.
    pub lane: Lane,
    /// Stored chunks.
    pub chunks: u64,
    /// Stored records (including committed ones in a partly committed chunk).
    pub records: u64,
    /// Encoded bytes of the stored chunks.
    pub bytes: u64,
    /// Offset of the first stored record.
    pub first_offset: Option<i64>,
    /// Offset of the last stored record.
    pub last_offset: Option<i64>,
    /// Records held in memory beyond the chunks (the memory tier), not on disk.
    pub memory_records: u64,
    /// Key, payload and header bytes of those records.
    pub memory_bytes: u64,
}

/// What the buffer holds for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStats {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// Layout and per-lane cursors.
    pub state: PartitionState,
    /// Catch-up lane, then live lane.
    pub lanes: [LaneStats; 2],
}

/// What the whole buffer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferStats {
    /// Per partition, by topic then partition.
    pub partitions: Vec<PartitionStats>,
    /// Bytes on disk, as sled accounts them.
    pub disk_bytes: u64,
}

/// How many times a read of sled is made again because commits moved the lane's cursors
/// while it read ([`Buffer::read_lane`]): commits come a few per second, so more than one in
/// a row is already unlikely.
const RACED_COMMIT_REREADS: u32 = 4;

impl Buffer {
    /// The state of `topic`/`partition`, `None` if it is not laid out.
    /// The lanes count as fetched up to what the buffer proves, in sled or in memory.
    pub fn partition_state(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<PartitionState>, StoreError> {
        match self.partition_key(topic, partition)? {
            Some(part) => Ok(self.read_state(part)?.map(|(state, _)| state)),
            None => Ok(None),
        }
    }

    /// The state the buffer proves of `part` and, per lane, where its chunks in sled end
    /// (the memory tier holds the rest).
    pub(super) fn read_state(
        &self,
        part: PartitionKey,
    ) -> Result<Option<(PartitionState, [i64; 2])>, StoreError> {
        let mut shard = self.partition_lock(part);
        Ok(self.tail_in(&mut shard, part)?.map(|tail| {
            let sled_end = [
                tail.persisted.catchup.fetched_next,
                tail.persisted.live.fetched_next,
            ];
            (tail.logical(), sled_end)
        }))
    }

    /// Every laid-out partition, by topic name then partition, with the state the buffer
    /// proves (the memory tier's appends counted as fetched).
    pub fn partitions(&self) -> Result<Vec<(String, i32, PartitionState)>, StoreError> {
        Ok(self
            .partition_entries()?
            .into_iter()
            .map(|(part, topic, partition, state)| {
                let state = match self.partition_lock(part).tails.get(&part) {
                    Some(tail) => tail.logical(),
                    None => state,
                };
                (topic, partition, state)
            })
            .collect())
    }

    fn partition_entries(
        &self,
    ) -> Result<Vec<(PartitionKey, String, i32, PartitionState)>, StoreError> {
        let mut out = Vec::new();
        for entry in self.db()?.scan_prefix(keys::state_prefix()) {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            let Some(keys::ParsedKey::State(part)) = keys::parse(&key) else {
                return Err(self.damaged(format!("malformed state key {key:?}")));
            };
            let topic = self.topic_name(part.topic_id).ok_or_else(|| {
                self.damaged(format!("state of unknown topic id {}", part.topic_id))
            })?;
            let state = codec::decode(&value).map_err(|err| {
                self.damaged(format!("state of {topic}/{}: {err}", part.partition))
            })?;
            let partition = i32::try_from(part.partition).map_err(|_| {
                self.damaged(format!(
                    "state of {topic}/{}: not a partition number",
                    part.partition
                ))
            })?;
            out.push((part, topic, partition, state));
        }
        out.sort_by(|a, b| (&a.1, a.2).cmp(&(&b.1, b.2)));
        Ok(out)
    }

    /// Reads `lane` of `topic`/`partition` from offset `from` on (never below the lane's
    /// `committed_next`: those records are processed): from sled whole chunks at a time,
    /// stopping once at least `max_records` were read, and from the memory tier at most the
    /// `max_records` left (or until the lane is exhausted).
    pub fn read(
        &self,
        lane: Lane,
        topic: &str,
        partition: i32,
        from: i64,
        max_records: usize,
    ) -> Result<ReadBatch, StoreError> {
        let empty = ReadBatch {
            lane,
            records: Vec::new(),
            next: from,
            exhausted: false,
        };
        let Some(part) = self.partition_key(topic, partition)? else {
            return Ok(empty);
        };
        let Some((state, sled_end)) = self.read_state(part)? else {
            return Ok(empty);
        };
        self.read_lane(lane, part, &state, sled_end, from, max_records)
    }

    /// Reads `topic`/`partition` in `Ordered` delivery order from offset `from`: the
    /// catch-up ranges first and, only once they are fetched and read through, the live lane.
    pub fn read_ordered(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        max_records: usize,
    ) -> Result<ReadBatch, StoreError> {
        let empty = ReadBatch {
            lane: Lane::Catchup,
            records: Vec::new(),
            next: from,
            exhausted: false,
        };
        let Some(part) = self.partition_key(topic, partition)? else {
            return Ok(empty);
        };
        let Some((state, sled_end)) = self.read_state(part)? else {
            return Ok(empty);
        };
        match state.layout.catchup_end() {
            Some(end) if from < end => {
                let mut batch =
                    self.read_lane(Lane::Catchup, part, &state, sled_end, from, max_records)?;
                // At the backlog's end the next read turns to the live lane.
                batch.exhausted &= batch.next < end;
                Ok(batch)
            }
            _ => self.read_lane(
                Lane::Live,
                part,
                &state,
                sled_end,
                from.max(state.layout.live_from),
                max_records,
            ),
        }
    }

    /// Reads `lane` from sled up to `sled_end` (where its chunks end when `state` was
    /// taken), then on from the memory tier.
    ///
    /// A commit may delete chunks between the state's load and the read of sled: the live
    /// thread commits past empty chunks the reader has not read yet (`skip_trailing_gap`).
    /// The read then finds them missing. So damage found in sled is damage only under the
    /// lane's cursors as they are now: if a commit moved them meanwhile, the read is made
    /// again under the new state.
    pub(super) fn read_lane(
        &self,
        lane: Lane,
        part: PartitionKey,
        state: &PartitionState,
        sled_end: [i64; 2],
        from: i64,
        max_records: usize,
    ) -> Result<ReadBatch, StoreError> {
        let mut state = std::borrow::Cow::Borrowed(state);
        let mut sled_end = sled_end[super::tail::index(lane)];
        let mut rereads = 0;
        let mut batch = loop {
            let err = match self.read_sled(lane, part, &state, sled_end, from, max_records) {
                Err(err @ StoreError::Damaged { .. }) => err,
                other => break other?,
            };
            // A reload that fails reports the damage found, not its own failure.
            let Ok(Some((now, now_end))) = self.read_state(part) else {
                return Err(err);
            };
            // What a commit moves.
            let committed = |state: &PartitionState| {
                let cursors = state.lane(lane);
                (cursors.retained_from, cursors.committed_next)
            };
            if committed(&now) == committed(&state) || rereads == RACED_COMMIT_REREADS {
                return Err(err);
            }
            rereads += 1;
            sled_end = now_end[super::tail::index(lane)];
            state = std::borrow::Cow::Owned(now);
        };
        if batch.records.len() >= max_records || batch.next < sled_end {
            return Ok(batch);
        }
        // Sled read through: the rest is in memory, chained on from its end (unless a spill
        // moved it to sled meanwhile — the next read finds it there, and this one is not
        // exhausted: the lane's end lies past it).
        let state = state.as_ref();
        let from = state.normalize(lane, batch.next);
        let mut shard = self.partition_lock(part);
        if let Some(tail) = self.tail_in(&mut shard, part)? {
            if let Some((records, next, newly_taken)) =
                tail.read(lane, from, max_records - batch.records.len())
            {
                self.tail_taken_bytes
                    .fetch_add(newly_taken, std::sync::atomic::Ordering::Relaxed);
                batch.records.extend(records);
                batch.next = batch.next.max(next);
            }
            batch.exhausted = batch.records.len() < max_records
                && state.normalize(lane, batch.next) >= tail.fetched_next(lane);
        }
        Ok(batch)
    }

    fn read_sled(
        &self,
        lane: Lane,
        part: PartitionKey,
        state: &PartitionState,
        sled_end: i64,
        from: i64,
        max_records: usize,
    ) -> Result<ReadBatch, StoreError> {
        // Below committed_next everything is processed; below retained_from nothing is left.
        let cursors = state.lane(lane);
        let from = from
            .max(cursors.retained_from)
            .max(cursors.committed_next)
            .max(0);
        let mut batch = ReadBatch {
            lane,
            records: Vec::new(),
            next: from,
            exhausted: false,
        };
        if state.normalize(lane, from) >= sled_end {
            // Nothing of it in sled: the memory tier holds the rest.
            return Ok(batch);
        }
        let lane_start = keys::chunk(lane, part, 0);
        let lane_end = keys::chunk(lane, part, u64::MAX);
        // The chunk holding `from` starts at or below it.
        let start = match self
            .db()?
            .range(lane_start..=keys::chunk(lane, part, from as u64))
            .next_back()
        {
            Some(entry) => entry.map_err(|err| self.sled_error(err))?.0.to_vec(),
            None => lane_start.to_vec(),
        };
        // Chunks chain: each starts where the previous one ended (the end of a catch-up
        // range is the start of the next). A chunk starting past the offset the chain has
        // reached is a hole — records the state counts as fetched are gone — and must never
        // be read over as if the offsets were empty.
        //
        // The read stops at the proven end, the `fetched_next` of the state it loaded: what
        // lies beyond was appended after that load (or is not proven at all), and sled's
        // iterator can show a later chunk of a batch appended meanwhile and hide an earlier
        // one — a hole that would be read over silently (`docs/design.md`, "Reads stop at the
        // proven end"). The next read sees those chunks under a newer state.
        let proven_end = sled_end;
        let mut reached = state.normalize(lane, from);
        // Only the first chunk may start below `reached` (it holds `from`); a later one that
        // does overlaps the chain, and its records would come twice or out of order.
        let mut chained = false;
        for entry in self.db()?.range(start..=lane_end.to_vec()) {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            let first = keys::chunk_first(&key)
                .and_then(|first| i64::try_from(first).ok())
                .unwrap_or(i64::MAX);
            if first >= proven_end {
                break;
            }
            if first > reached {
                return Err(self.damaged(format!(
                    "{lane} lane of topic id {} partition {}: offsets {reached}..{first} are missing",
                    part.topic_id, part.partition
                )));
            }
            if chained && first < reached {
                return Err(self.damaged(format!(
                    "{lane} lane of topic id {} partition {}: a chunk starts at {first}, inside the chain that reached {reached}",
                    part.topic_id, part.partition
                )));
            }
            chained = true;
            let chunk: Chunk = codec::decode(&value).map_err(|err| {
                self.damaged(format!(
                    "chunk {:?} of topic id {} partition {}: {err}",
                    keys::parse(&key),
                    part.topic_id,
                    part.partition
                ))
            })?;
            let next = i64::try_from(chunk.next).unwrap_or(i64::MAX);
            // A chunk must cover offsets and hold its records inside them, in order: a reader
            // resumes at `next`, so one that does not advance past its records would hand
            // them out forever.
            let inside = chunk
                .records
                .first()
                .is_none_or(|record| record.offset >= first)
                && chunk
                    .records
                    .last()
                    .is_none_or(|record| record.offset < next)
                && chunk.records.windows(2).all(|w| w[0].offset < w[1].offset);
            if next <= first || !inside {
                return Err(self.damaged(format!(
                    "{lane} chunk @{first} of topic id {} partition {}: its records do not lie in order inside [{first}, {next})",
                    part.topic_id, part.partition
                )));
            }
            reached = reached.max(state.normalize(lane, next));
            let skip = chunk.records.partition_point(|r| r.offset < from);
            batch.records.extend(chunk.records.into_iter().skip(skip));
            batch.next = batch.next.max(state.normalize(lane, next));
            if batch.records.len() >= max_records {
                return Ok(batch);
            }
        }
        // The chain must reach the proven end: chunks missing at the lane's end are a hole
        // like any other (a read that stopped there would wait for ever for records the state
        // counts as fetched).
        if reached < proven_end {
            return Err(self.damaged(format!(
                "{lane} lane of topic id {} partition {}: offsets {reached}..{proven_end} are missing",
                part.topic_id, part.partition
            )));
        }
        Ok(batch)
    }

    /// Per partition and lane: chunks, records, bytes, first and last offset, cursors.
    pub fn stats(&self) -> Result<BufferStats, StoreError> {
        let mut partitions = Vec::new();
        for (part, topic, partition, state) in self.partition_entries()? {
            let mut lanes = [
                self.lane_stats(Lane::Catchup, part)?,
                self.lane_stats(Lane::Live, part)?,
            ];
            // The cursors as the buffer proves them, and what memory holds beyond sled.
            let state = match self.partition_lock(part).tails.get(&part) {
                Some(tail) => {
                    for stats in &mut lanes {
                        (stats.memory_records, stats.memory_bytes) = tail.counts(stats.lane);
                    }
                    tail.logical()
                }
                None => state,
            };
            partitions.push(PartitionStats {
                topic,
                partition,
                state,
                lanes,
            });
        }
        Ok(BufferStats {
            partitions,
            disk_bytes: self.disk_bytes()?,
        })
    }

    fn lane_stats(&self, lane: Lane, part: PartitionKey) -> Result<LaneStats, StoreError> {
        let mut stats = LaneStats {
            lane,
            chunks: 0,
            records: 0,
            bytes: 0,
            first_offset: None,
            last_offset: None,
            memory_records: 0,
            memory_bytes: 0,
        };
        let mut first_nonempty = None;
        let mut last_nonempty = None;
        for entry in self.db()?.scan_prefix(keys::chunk_prefix(lane, part)) {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            let head: ChunkHead = codec::decode_prefix(&value)
                .map_err(|err| self.damaged(format!("chunk {:?}: {err}", keys::parse(&key))))?;
            stats.chunks += 1;
            stats.records = stats.records.saturating_add(head.record_count);
            stats.bytes += value.len() as u64;
            if head.record_count > 0 {
                if first_nonempty.is_none() {
                    first_nonempty = Some(value.clone());
                }
                last_nonempty = Some(value);
            }
        }
        let decode = |value: &sled::IVec| -> Result<Chunk, StoreError> {
            codec::decode(value).map_err(|err| self.damaged(format!("a {lane} chunk: {err}")))
        };
        if let Some(value) = first_nonempty {
            stats.first_offset = decode(&value)?.records.first().map(|r| r.offset);
        }
        if let Some(value) = last_nonempty {
            stats.last_offset = decode(&value)?.records.last().map(|r| r.offset);
        }
        Ok(stats)
    }
}
