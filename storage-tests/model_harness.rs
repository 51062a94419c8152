//! A reference model of the buffer and a harness that runs the real buffer next to it.
//!
//! Shared by the proptest state machine (`storage-tests/model.rs`) and the cargo-fuzz target
//! (`fuzz/fuzz_targets/buffer_model.rs`), which decodes its operations from the fuzzer's bytes.
//!
//! A crash is simulated by copying the buffer directory while the database is open and
//! unsynced — exactly the files a killed process leaves — and continuing on the copy. After a
//! crash the buffer must look like the model did after some operation since the last sync
//! (a prefix of the history): never older than the sync, never a mix with holes.
#![allow(dead_code)] // the fuzz target and the proptest use different parts

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use catchup::store::{
    Buffer, BufferOptions, Fetched, Lane, PartitionLayout, Record, StoreError, Timestamp,
};

/// Partitions the harness uses.
pub const PARTITIONS: u8 = 3;

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Fetch `count` records into `lane` starting `back` offsets before `fetched_next`.
    Append {
        partition: u8,
        lane: Lane,
        back: u8,
        count: u16,
    },
    /// Read the lane from its committed offset and compare with the model.
    Read { partition: u8, lane: Lane },
    /// Commit `permille`/1000 of the way from `committed_next` to `fetched_next`.
    Commit {
        partition: u8,
        lane: Lane,
        permille: u16,
    },
    /// Drop everything of the partition.
    Discard { partition: u8 },
    /// Lay the partition out afresh (split or plain) under the next epoch.
    Reset {
        partition: u8,
        split: bool,
        from: u16,
    },
    /// Make everything durable.
    Sync,
    /// Crash without sync and recover.
    Crash,
    /// Power lost without sync: each page written since the last sync persisted or not, on
    /// its own (chosen with `seed`), each file's length and a new or deleted file likewise.
    TornCrash { seed: u16 },
    /// Close cleanly and reopen.
    Reopen,
}

/// Decodes operations from arbitrary bytes (the fuzzer's input): 4 bytes per operation.
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    data.chunks_exact(4)
        .map(|b| {
            let partition = b[1] % PARTITIONS;
            let lane = if b[2] & 1 == 0 {
                Lane::Catchup
            } else {
                Lane::Live
            };
            match b[0] % 16 {
                0..=5 => Op::Append {
                    partition,
                    lane,
                    back: b[2] >> 5,
                    count: u16::from(b[3]) * 3,
                },
                6..=7 => Op::Read { partition, lane },
                8..=10 => Op::Commit {
                    partition,
                    lane,
                    permille: u16::from(b[3]) * 4,
                },
                11 => Op::Discard { partition },
                12 => Op::Reset {
                    partition,
                    split: b[2] & 2 == 0,
                    from: u16::from(b[3]),
                },
                13 => Op::Sync,
                14 if b[2] & 4 == 0 => Op::Crash,
                14 => Op::TornCrash {
                    seed: u16::from_be_bytes([b[1], b[3]]),
                },
                _ => Op::Reopen,
            }
        })
        .collect()
}

/// The payload of every record is a function of where it is.
pub fn record(epoch: u64, partition: u8, lane: Lane, offset: i64) -> Record {
    let mut payload = format!("{epoch}/{partition}/{lane}/{offset}").into_bytes();
    payload.resize(payload.len() + (offset as usize * 7) % 90, b'.');
    Record {
        offset,
        timestamp: Timestamp::LogAppendTime(offset * 10),
        key: (offset % 3 != 0).then(|| offset.to_le_bytes().to_vec().into()),
        payload: Some(payload.into()),
        headers: Vec::new(),
    }
}

const TOPIC: &str = "model";
/// Boundary offset of split layouts, relative to their start.
const SPLIT_BACKLOG: i64 = 700;

/// What the model (and the observation of the real buffer) knows of one lane.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaneModel {
    pub fetched_next: i64,
    pub committed_next: i64,
    /// Records from `committed_next` to `fetched_next`.
    pub records: Vec<i64>,
}

/// One partition as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionModel {
    pub layout: PartitionLayout,
    pub lanes: [LaneModel; 2],
}

/// The observable state of the whole buffer.
pub type Observed = BTreeMap<u8, PartitionModel>;

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Catchup => 0,
        Lane::Live => 1,
    }
}

impl PartitionModel {
    fn new(layout: PartitionLayout) -> Self {
        let catchup_start = layout
            .catchup_ranges
            .first()
            .map_or(layout.live_from, |r| r.start);
        let lane = |at: i64| LaneModel {
            fetched_next: at,
            committed_next: at,
            records: Vec::new(),
        };
        Self {
            lanes: [lane(catchup_start), lane(layout.live_from)],
            layout,
        }
    }

    /// The model's own rule for where a lane's offsets end (no shared code with the buffer).
    fn lane_end(&self, lane: Lane) -> i64 {
        match lane {
            Lane::Catchup => self
                .layout
                .catchup_ranges
                .last()
                .map_or(self.layout.live_from, |r| r.end),
            Lane::Live => i64::MAX,
        }
    }

    fn append(&mut self, lane: Lane, start: i64, count: i64) {
        let end = self.lane_end(lane);
        let state = &mut self.lanes[lane_index(lane)];
        let next = (start + count).min(end);
        for offset in state.fetched_next.max(start)..next {
            state.records.push(offset);
        }
        state.fetched_next = state.fetched_next.max(next);
    }

    fn commit(&mut self, lane: Lane, upto: i64) {
        let state = &mut self.lanes[lane_index(lane)];
        if upto > state.committed_next {
            state.committed_next = upto;
            state.records.retain(|&o| o >= upto);
        }
    }
}

/// Tears the crash image in `image` against the files of the last durable point in
/// `synced`: every 4 KiB page that differs comes from either, a file's length is either, and a
/// file present in only one of them is there or not. The choices follow `seed`. Returns how
/// many differing pages (or files) came from `synced`.
fn tear(synced: &Path, image: &Path, seed: u16) -> std::io::Result<u32> {
    const PAGE: usize = 4096;
    let mut state = u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut coin = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state & 1 == 0
    };
    let mut from_synced = 0;
    let mut names = std::collections::BTreeSet::new();
    for dir in [synced, image] {
        for path in files_under(dir, dir)? {
            names.insert(path);
        }
    }
    for name in names {
        let old = std::fs::read(synced.join(&name)).ok();
        let new = std::fs::read(image.join(&name)).ok();
        let target = image.join(&name);
        let torn = match (old, new) {
            (Some(old), Some(new)) if old == new => continue,
            (Some(old), Some(new)) => {
                let len = if coin() { old.len() } else { new.len() };
                let mut torn = vec![0u8; len];
                for (index, page) in torn.chunks_mut(PAGE).enumerate() {
                    let at = index * PAGE;
                    let page_of = |file: &[u8]| -> Vec<u8> {
                        file.iter().skip(at).take(PAGE).copied().collect()
                    };
                    let differs = page_of(&old) != page_of(&new);
                    let from = if coin() {
                        from_synced += u32::from(differs);
                        &old
                    } else {
                        &new
                    };
                    if let Some(rest) = from.get(at..) {
                        let have = rest.len().min(page.len());
                        page[..have].copy_from_slice(&rest[..have]);
                    }
                }
                Some(torn)
            }
            (None, Some(new)) => coin().then_some(new).or_else(|| {
                from_synced += 1;
                None
            }),
            (Some(old), None) => coin().then_some(old).inspect(|_| from_synced += 1),
            (None, None) => continue,
        };
        match torn {
            Some(bytes) => {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&target, bytes)?;
            }
            None if target.exists() => std::fs::remove_file(&target)?,
            None => {}
        }
    }
    Ok(from_synced)
}

/// The files under `dir`, relative to `root`.
fn files_under(root: &Path, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            files.extend(files_under(root, &entry.path())?);
        } else if let Ok(relative) = entry.path().strip_prefix(root) {
            files.push(relative.to_path_buf());
        }
    }
    Ok(files)
}

/// The real buffer next to the model.
pub struct Harness {
    root: tempfile::TempDir,
    generation: u32,
    buffer: Option<Buffer>,
    model: Observed,
    /// Model states since the last sync, oldest first: what a crash may leave.
    since_sync: Vec<Observed>,
    next_epoch: u64,
    /// Torn crashes whose image sled could not recover, and which therefore started empty
    /// (as the consumer starts on a damaged buffer).
    pub emptied: u32,
    /// Pages (or whole files) torn crashes took from the last durable point while the
    /// crashed files differed there.
    pub torn: u32,
}

fn options() -> BufferOptions {
    BufferOptions {
        chunk_target_bytes: 2048,
        flush_every_ms: None,
        ..BufferOptions::default()
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            match std::fs::copy(entry.path(), &target) {
                Ok(_) => {}
                // sled deletes files concurrently; a file gone mid-copy is gone after a crash too.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(())
}

impl Harness {
    /// A fresh buffer in a temporary directory.
    pub fn new() -> Result<Self, String> {
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut harness = Self {
            root,
            generation: 0,
            buffer: None,
            model: Observed::new(),
            since_sync: Vec::new(),
            next_epoch: 1,
            emptied: 0,
            torn: 0,
        };
        harness.buffer = Some(Buffer::open(harness.dir(), options()).map_err(|e| e.to_string())?);
        harness.since_sync.push(harness.model.clone());
        harness.keep_synced()?;
        Ok(harness)
    }

    fn dir(&self) -> PathBuf {
        self.root.path().join(format!("gen{}", self.generation))
    }

    /// Where the files stood at the last durable point, which a torn crash mixes with the
    /// files as they are.
    fn synced_dir(&self) -> PathBuf {
        self.root.path().join("synced")
    }

    fn keep_synced(&self) -> Result<(), String> {
        let synced = self.synced_dir();
        if synced.exists() {
            std::fs::remove_dir_all(&synced).map_err(|e| e.to_string())?;
        }
        copy_dir(&self.dir(), &synced).map_err(|e| format!("copying the synced files: {e}"))
    }

    fn buffer(&self) -> Result<&Buffer, String> {
        self.buffer
            .as_ref()
            .ok_or_else(|| "no open buffer".to_string())
    }

    /// Runs `ops` and checks after each one; returns the harness, for its counts.
    pub fn run(ops: &[Op]) -> Result<Self, String> {
        let mut harness = Self::new()?;
        for (index, op) in ops.iter().enumerate() {
            harness
                .apply(op)
                .map_err(|e| format!("op {index} {op:?}: {e}"))?;
        }
        Ok(harness)
    }

    /// Applies one operation to both and compares them.
    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        let err = |e: catchup::store::StoreError| e.to_string();
        match *op {
            Op::Append {
                partition,
                lane,
                back,
                count,
            } => {
                let Some(model) = self.model.get(&partition) else {
                    return Ok(());
                };
                let lane_model = &model.lanes[lane_index(lane)];
                let start =
                    (lane_model.fetched_next - i64::from(back)).max(lane_model.committed_next);
                let records: Vec<Record> = (start..start + i64::from(count))
                    .map(|o| record(model.layout.epoch, partition, lane, o))
                    .collect();
                let buffer = self.buffer()?;
                let layout = buffer
                    .layout_id(TOPIC, i32::from(partition))
                    .map_err(err)?
                    .ok_or("a laid-out partition has no layout id")?;
                let result = buffer.append(
                    lane,
                    TOPIC,
                    i32::from(partition),
                    Fetched {
                        layout,
                        continues_from: start,
                        records: &records,
                        next: start + i64::from(count),
                    },
                );
                match result {
                    // Invariant 8: a batch that does not continue from fetched_next is refused
                    // and changes nothing (the comparison below checks the latter).
                    Err(StoreError::Discontinuous { .. }) if start != lane_model.fetched_next => {}
                    Err(other) => return Err(err(other)),
                    Ok(_) if start != lane_model.fetched_next => {
                        return Err(format!(
                            "an append continuing from {start} was accepted at fetched_next {}",
                            lane_model.fetched_next
                        ));
                    }
                    Ok(_) => {
                        if let Some(model) = self.model.get_mut(&partition) {
                            model.append(lane, start, i64::from(count));
                        }
                    }
                }
            }
            Op::Read { .. } => {} // every step compares the whole observable state below
            Op::Commit {
                partition,
                lane,
                permille,
            } => {
                let Some(model) = self.model.get(&partition) else {
                    return Ok(());
                };
                let lane_model = &model.lanes[lane_index(lane)];
                let span = lane_model.fetched_next - lane_model.committed_next;
                let upto = lane_model.committed_next + span * i64::from(permille.min(1000)) / 1000;
                self.buffer()?
                    .record_committed(lane, TOPIC, i32::from(partition), upto)
                    .map_err(err)?;
                if let Some(model) = self.model.get_mut(&partition) {
                    model.commit(lane, upto);
                }
            }
            Op::Discard { partition } => {
                self.buffer()?
                    .discard_partition(TOPIC, i32::from(partition))
                    .map_err(err)?;
                self.model.remove(&partition);
            }
            Op::Reset {
                partition,
                split,
                from,
            } => {
                let epoch = self.next_epoch;
                self.next_epoch += 1;
                let from = i64::from(from);
                let layout = if split {
                    PartitionLayout::split(epoch, from, from + SPLIT_BACKLOG)
                } else {
                    PartitionLayout {
                        epoch,
                        ..PartitionLayout::plain(from)
                    }
                };
                self.buffer()?
                    .reset_partition(TOPIC, i32::from(partition), layout.clone())
                    .map_err(err)?;
                self.model.insert(partition, PartitionModel::new(layout));
            }
            Op::Sync => {
                self.buffer()?.sync().map_err(err)?;
                self.since_sync.clear();
                self.keep_synced()?;
            }
            Op::Reopen => {
                self.buffer = None; // sled flushes on a clean close
                self.buffer = Some(Buffer::open(self.dir(), options()).map_err(err)?);
                self.since_sync.clear();
                self.keep_synced()?;
            }
            Op::Crash => return self.crash(None),
            Op::TornCrash { seed } => return self.crash(Some(seed)),
        }
        self.since_sync.push(self.model.clone());
        let observed = self.observe()?;
        if observed != self.model {
            return Err(format!(
                "buffer and model differ:\n buffer {observed:?}\n model  {:?}",
                self.model
            ));
        }
        Ok(())
    }

    fn crash(&mut self, torn: Option<u16>) -> Result<(), String> {
        let from = self.dir();
        self.generation += 1;
        let to = self.dir();
        copy_dir(&from, &to).map_err(|e| format!("copying the crash image: {e}"))?;
        self.buffer = None;
        if let Some(seed) = torn {
            self.torn += tear(&self.synced_dir(), &to, seed)
                .map_err(|e| format!("tearing the image: {e}"))?;
        }
        let buffer = match Buffer::open(&to, options()) {
            Err(StoreError::Damaged { .. }) if torn.is_some() => {
                // Beyond sled's recovery: the consumer starts such a buffer empty.
                self.emptied += 1;
                Buffer::empty(&to).map_err(|e| e.to_string())?;
                let buffer = Buffer::open(&to, options()).map_err(|e| e.to_string())?;
                self.buffer = Some(buffer);
                self.model = Observed::new();
                self.since_sync = vec![self.model.clone()];
                self.keep_synced()?;
                return Ok(());
            }
            other => other.map_err(|e| format!("reopen after crash: {e}"))?,
        };
        let findings = buffer.verify().map_err(|e| e.to_string())?;
        if !findings.is_empty() {
            return Err(format!("verify after crash: {findings:?}"));
        }
        self.buffer = Some(buffer);
        let observed = self.observe()?;
        // Any state since the last sync is an acceptable outcome; nothing else is.
        match self.since_sync.iter().rposition(|state| *state == observed) {
            Some(_) => {
                self.model = observed;
                self.since_sync = vec![self.model.clone()];
                self.keep_synced()
            }
            None => Err(format!(
                "after a crash the buffer matches no state since the last sync:\n buffer {observed:?}\n candidates {:?}",
                self.since_sync
            )),
        }
    }

    /// The observable state of the real buffer, in the model's terms.
    fn observe(&self) -> Result<Observed, String> {
        let buffer = self.buffer()?;
        let mut observed = Observed::new();
        for (topic, partition, state) in buffer.partitions().map_err(|e| e.to_string())? {
            if topic != TOPIC {
                return Err(format!("unexpected topic {topic}"));
            }
            let partition = u8::try_from(partition).map_err(|e| e.to_string())?;
            let mut model = PartitionModel::new(state.layout.clone());
            for lane in Lane::ALL {
                let cursors = state.lane(lane);
                let mut records = Vec::new();
                let mut from = cursors.committed_next;
                loop {
                    let read = buffer
                        .read(lane, TOPIC, i32::from(partition), from, 500)
                        .map_err(|e| e.to_string())?;
                    if read.records.is_empty() {
                        break;
                    }
                    for r in read.records {
                        if r != record(state.layout.epoch, partition, lane, r.offset) {
                            return Err(format!(
                                "record {} of p{partition} {lane} has the wrong content",
                                r.offset
                            ));
                        }
                        records.push(r.offset);
                    }
                    from = read.next;
                }
                model.lanes[lane_index(lane)] = LaneModel {
                    fetched_next: cursors.fetched_next,
                    committed_next: cursors.committed_next,
                    records,
                };
            }
            observed.insert(partition, model);
        }
        Ok(observed)
    }
}
