//! The crash-safe on-disk buffer both fetchers write into and the reader drains.
//!
//! One sled database per consumer instance (a *buffer directory*), holding one tree:
//!
//! * records are stored in **chunks**, one sled entry per fetched batch of one lane of one
//!   partition, keyed `(lane, topic id, partition, first offset)` big-endian, so a range
//!   scan walks a partition's lane in offset order (see [`keys`](self) for the layout);
//! * each partition has one **state** entry ([`PartitionState`]): split epoch, catch-up
//!   ranges, boundary and, per lane, `fetched_next`, `committed_next` and `retained_from`;
//! * topics are mapped to small ids.
//!
//! Every change to a partition is one sled batch — the chunks it adds or removes together
//! with the state that describes them. sled applies a batch atomically, also across a crash,
//! which a multi-tree transaction would give too but at several times the cost; keeping
//! everything in one tree with key prefixes is what lets a single cheap batch carry it.
//!
//! A chunk rather than an entry per record: sled does about 100k single inserts per second
//! here, librdkafka hands out far more; one entry per fetched batch amortises sled's
//! per-entry cost over hundreds of records. A partly committed chunk stays until all of it
//! is committed; the lane's `committed_next` is the cursor inside it.
//!
//! Disk: sled never shrinks its files while the buffer lives, so [`Buffer::compact`] copies
//! what is stored into a fresh database (a *generation*, see `generation`) and switches to
//! it; [`Buffer::compact_if_bloated`] decides when (the consumer asks every 10 s).
//!
//! Durability: the buffer is a cache of Kafka, and the consumer needs none for correctness.
//! sled writes through its page cache and fsyncs its log every
//! [`BufferOptions::flush_every_ms`] (and whenever the memory tier spilled 8 MiB, to bound the
//! write buffers sled keeps in memory); after a process crash the buffer holds a prefix of the
//! batches applied. After a power loss that holds only if no item was a blob file (see
//! [`BufferOptions::segment_bytes`]), and nothing is trusted without checking: every read
//! verifies that the chunks chain without a hole and decode with their checksums, and the
//! consumer discards and refetches a partition that fails (a record is delivered only if the
//! buffer proves it). [`Buffer::sync`] is the durability point for library users who want
//! one; the consumer never calls it.

mod allowance;
mod codec;
mod compact;
mod error;
mod fsync;
mod generation;
mod keys;
mod open;
mod read;
mod record;
mod snapshot;
mod space;
mod state;
mod tail;
mod topics;
mod verify;
mod write;

#[cfg(test)]
mod compact_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, RwLock};

use bincode::{Decode, Encode};

pub use codec::{CodecError, DECODE_LIMIT, FORMAT_VERSION};
pub use compact::{COPY_OVERHEAD, COPY_RATIO, Compaction};
pub use error::StoreError;
pub use read::{BufferStats, LaneStats, PartitionStats, ReadBatch};
pub use record::{Header, Record, Timestamp};
pub use snapshot::Snapshot;
pub use space::{DiskSpace, free_space};
pub use state::{LaneState, OffsetRange, PartitionLayout, PartitionState};
pub use verify::{Finding, MAX_FINDINGS};
pub use write::{AppendOutcome, Fetched, FetchedBatch};

use error::{classify_open_error, current_error, panic_reason, sled_error};
use keys::PartitionKey;
use open::sled_config;

/// The two lanes of a split partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// The backlog `[committed, boundary)`, fetched by the catch-up consumer.
    Catchup,
    /// Everything from the boundary on (or from the committed offset without a split).
    Live,
}

impl Lane {
    /// Both lanes, catch-up first.
    pub const ALL: [Lane; 2] = [Lane::Catchup, Lane::Live];

    /// The lane's name as the CLI and logs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Catchup => "catchup",
            Lane::Live => "live",
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Names one layout of one partition for as long as this process has the buffer open:
/// [`Buffer::reset_partition`] and [`Buffer::discard_partition`] give the partition a new one.
/// A fetcher positions itself under a layout and names it in every append, so a writer that
/// outlived a revoke or a re-layout is refused instead of writing into the new layout. Stale
/// writers are threads of this process, so an id needs no persistence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LayoutId(pub u64);

impl fmt::Display for LayoutId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layout #{}", self.0)
    }
}

/// Tuning of the sled database under a buffer.
#[derive(Debug, Clone)]
pub struct BufferOptions {
    /// Bytes of sled's page cache. The reader mostly reads chunks shortly after they were
    /// written, so a modest cache serves it; 64 MiB by default.
    pub cache_capacity: u64,
    /// How often sled flushes and fsyncs its log in the background, in milliseconds (`None`:
    /// never); 500 ms by default. This bounds what a power loss can take back between
    /// explicit [`Buffer::sync`] calls (a process crash loses nothing sled was handed). The
    /// consumer needs no durability point: it verifies what it reads and refetches.
    pub flush_every_ms: Option<u64>,
    /// Upper bound on the encoded size of one chunk (a single larger record makes a chunk
    /// of its own); 32 KiB by default. See [`BufferOptions::segment_bytes`] for the limit.
    pub chunk_target_bytes: usize,
    /// sled's segment size for a new buffer (a power of two, 1–16 MiB); 4 MiB by default.
    /// An existing buffer keeps the size it was created with (sled cannot change it).
    ///
    /// The rule this serves: sled writes a logged item (a whole tree leaf when it rewrites
    /// one, up to 17 entries) larger than a quarter of a segment as a separate *blob* file,
    /// which it never fsyncs and, when the file is missing after a power loss, skips
    /// without stopping recovery — the recovered tree is then not a prefix of what was
    /// written. So `open` requires that 18 chunks of `chunk_target_bytes` fit in two thirds
    /// of a quarter segment (chunks are cut on an estimate of their encoded size), and no
    /// leaf of chunks becomes a blob unless a single record exceeds that share (about
    /// 38 KiB with the defaults). The reader's checks catch what a blob could still tear: a
    /// damaged partition is refetched, never read over.
    pub segment_bytes: usize,
    /// How long `open` waits for the directory's lock. sled releases it only once its
    /// background threads let go of the files, shortly after the previous handle in this
    /// process was dropped; another process holding it gets [`StoreError::Locked`] after
    /// this wait, 2 s by default — except an offline tool copying the buffer (a shared
    /// lock), which `open` waits for up to 10 minutes more.
    pub lock_wait: std::time::Duration,
    /// Disk the buffer may occupy beyond twice what it stores before
    /// [`Buffer::compact_if_bloated`] compacts it; 64 MiB by default. sled's garbage
    /// awaiting its cleaner, its segment rounding and the compaction's pause all shrink as
    /// this grows.
    pub disk_allowance_bytes: u64,
    /// Bytes of appended records the buffer may keep in memory ahead of sled (the memory
    /// tier, see `tail`): the reader takes them from there, a commit drops them unwritten,
    /// and only what waits beyond this is written to sled, largest lane first. What a reader
    /// took may hold as much again until its commit. 0 (the default) writes every append
    /// through; the consumer gives it a quarter of its byte budget.
    pub memory_bytes: u64,
}

impl Default for BufferOptions {
    fn default() -> Self {
        Self {
            cache_capacity: 64 << 20,
            flush_every_ms: Some(500),
            chunk_target_bytes: 32 << 10,
            segment_bytes: 4 << 20,
            lock_wait: std::time::Duration::from_secs(2),
            disk_allowance_bytes: 64 << 20,
            memory_bytes: 0,
        }
    }
}

/// Buffer-wide metadata, stored under key `M`.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
struct BufferMeta {
    /// The id the next new topic gets.
    next_topic_id: u32,
}

/// Shards of the per-partition write lock: two writers of one partition (the two fetchers,
/// the committer) must not interleave their read-modify-write of its state.
const LOCK_SHARDS: usize = 64;

/// One shard of the partitions' write lock, and the memory tier of its partitions: what a
/// partition holds in memory changes only under its lock, as its state in sled does.
#[derive(Debug, Default)]
struct Shard {
    tails: HashMap<PartitionKey, tail::Tail>,
}

/// A crash-safe buffer of Kafka records in a directory.
///
/// All methods take `&self`; a `Buffer` can be shared between the fetcher threads and the
/// reader (`Arc<Buffer>`).
pub struct Buffer {
    dir: PathBuf,
    /// The open generation; replaced only by [`Buffer::compact`], under every writer's lock.
    current: RwLock<Generation>,
    options: BufferOptions,
    topics: RwLock<HashMap<String, u32>>,
    topic_alloc: Mutex<()>,
    partition_locks: Vec<Mutex<Shard>>,
    /// Bytes the memory tier holds, every partition.
    tail_bytes: std::sync::atomic::AtomicU64,
    /// Of them, the bytes of appends a reader took (they wait for their commit).
    tail_taken_bytes: std::sync::atomic::AtomicU64,
    /// Bytes it may hold ([`BufferOptions::memory_bytes`], [`Buffer::set_memory_bytes`]).
    memory_bytes: std::sync::atomic::AtomicU64,
    /// Bytes it wrote to sled so far (what waited beyond it).
    spilled_bytes: std::sync::atomic::AtomicU64,
    /// Bytes it spilled since it last waited for sled's writes (`relieve_memory`).
    spilled_unflushed: std::sync::atomic::AtomicU64,
    /// What the memory tier may still write to sled, and what sled did not write out yet.
    allowance: allowance::WriteAllowance,
    /// A write to sled failed: sled's flush may then block for good, so the memory tier no
    /// longer waits for it.
    write_failed: std::sync::atomic::AtomicBool,
    /// The current layout of each partition this process has touched (see [`LayoutId`]).
    layouts: Mutex<HashMap<PartitionKey, LayoutId>>,
    next_layout: std::sync::atomic::AtomicU64,
    /// What compaction needs to decide (stored bytes) and to run alone (see `compact`).
    compaction: compact::Tracker,
}

/// One sled database of a buffer and the directory holding its files (see `generation`).
/// The handle is shared so that a compaction can tell when the last read let go of it.
struct Generation {
    /// `None` once [`Buffer::release`] let go of it.
    db: Option<std::sync::Arc<sled::Db>>,
    path: PathBuf,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

// The locks guard no data of their own (only ordering of sled writes), so a panic in another
// thread while holding one leaves nothing inconsistent: recover the guard.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
