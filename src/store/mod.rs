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
//! [`BufferOptions::flush_every_ms`]; after a process crash the buffer holds a prefix of the
//! batches applied. After a power loss that holds only if no item was a blob file (see
//! [`BufferOptions::segment_bytes`]), and nothing is trusted without checking: every read
//! verifies that the chunks chain without a hole and decode with their checksums, and the
//! consumer discards and refetches a partition that fails (a record is delivered only if the
//! buffer proves it). [`Buffer::sync`] is the durability point for library users who want
//! one; the consumer never calls it.

mod codec;
mod compact;
mod fsync;
mod generation;
mod keys;
mod read;
mod record;
mod snapshot;
mod space;
mod state;
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
pub use read::{BufferStats, LaneStats, PartitionStats, ReadBatch};
pub use record::{Header, Record, Timestamp};
pub use snapshot::Snapshot;
pub use space::{DiskSpace, free_space};
pub use state::{LaneState, OffsetRange, PartitionLayout, PartitionState};
pub use verify::{Finding, MAX_FINDINGS};
pub use write::{AppendOutcome, Fetched};

use keys::PartitionKey;

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
        }
    }
}

/// Errors of the buffer. Each names the directory and, where it applies, the partition.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory could not be created, read or synced.
    #[error("buffer {dir}: {action}: {source}")]
    Io {
        /// The buffer directory.
        dir: PathBuf,
        /// What was being done.
        action: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Another process (or another handle in this one) holds the buffer open.
    #[error("buffer {dir} is in use by another process (a running consumer holds its lock)")]
    Locked {
        /// The buffer directory.
        dir: PathBuf,
    },
    /// The buffer was released ([`Buffer::release`]): this handle no longer has a database.
    #[error("buffer {dir} was closed")]
    Released {
        /// The buffer directory.
        dir: PathBuf,
    },
    /// The directory does not exist (for operations that never create one).
    #[error("buffer {dir} does not exist")]
    Missing {
        /// The path given.
        dir: PathBuf,
    },
    /// The directory exists but holds no catchup buffer.
    #[error("{dir} is not a catchup buffer: {reason}")]
    NotABuffer {
        /// The directory.
        dir: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// The buffer was written by a newer catchup.
    #[error(
        "buffer {dir} has format version {found}; this build reads up to {FORMAT_VERSION}: upgrade catchup or use a new buffer directory"
    )]
    NewerFormat {
        /// The buffer directory.
        dir: PathBuf,
        /// The version found.
        found: u8,
    },
    /// The buffer's files or values are damaged.
    #[error("buffer {dir} is damaged: {reason}")]
    Damaged {
        /// The buffer directory.
        dir: PathBuf,
        /// What is wrong and where.
        reason: String,
    },
    /// sled reported an error.
    #[error("buffer {dir}: sled: {source}")]
    Sled {
        /// The buffer directory.
        dir: PathBuf,
        /// The underlying error.
        source: sled::Error,
    },
    /// An append fetched under an earlier layout of the partition (the partition was revoked,
    /// discarded or laid out again since): refused, the writer is stale.
    #[error(
        "buffer {dir}, {topic}/{partition} {lane} lane: append fetched under {fetched_under}, the partition is now at {current}; refused"
    )]
    StaleLayout {
        /// The buffer directory.
        dir: PathBuf,
        /// Topic of the append.
        topic: String,
        /// Partition of the append.
        partition: i32,
        /// Lane of the append.
        lane: Lane,
        /// The layout the fetcher named.
        fetched_under: LayoutId,
        /// The partition's layout now.
        current: LayoutId,
    },
    /// An append that does not continue from where the lane stands: the offsets in between
    /// were never proven fetched (invariant 8). Refused; refetch from `fetched_next`.
    #[error(
        "buffer {dir}, {topic}/{partition} {lane} lane: batch continues from {continues_from} but the lane is fetched up to {fetched_next}; refused, refetch from {fetched_next}"
    )]
    Discontinuous {
        /// The buffer directory.
        dir: PathBuf,
        /// Topic of the append.
        topic: String,
        /// Partition of the append.
        partition: i32,
        /// Lane of the append.
        lane: Lane,
        /// Where the batch said it continues from.
        continues_from: i64,
        /// Where the lane stands.
        fetched_next: i64,
    },
    /// An offline tool's private copy of the buffer would not fit in the temporary directory.
    #[error(
        "buffer {dir}: a snapshot needs {} MiB in {}, {} MiB are free there: pass --tmp-dir (or set TMPDIR) to a filesystem with room",
        needed >> 20, tmp.display(), available >> 20
    )]
    NoRoom {
        /// The buffer directory.
        dir: PathBuf,
        /// Where the copy would go.
        tmp: PathBuf,
        /// Bytes the copy needs.
        needed: u64,
        /// Bytes free there.
        available: u64,
    },
    /// The [`BufferOptions`] cannot be used.
    #[error("buffer {dir}: {reason}")]
    Options {
        /// The buffer directory.
        dir: PathBuf,
        /// Which option and why.
        reason: String,
    },
    /// A call that does not fit the partition's state (a bug in the caller, reported rather
    /// than written).
    #[error("buffer {dir}, {topic}/{partition}: {reason}")]
    Rejected {
        /// The buffer directory.
        dir: PathBuf,
        /// Topic of the call.
        topic: String,
        /// Partition of the call.
        partition: i32,
        /// Why it was rejected.
        reason: String,
    },
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
    partition_locks: Vec<Mutex<()>>,
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

impl StoreError {
    /// Whether this is a failed read or write of the files (disk full, I/O error, quota, a
    /// sled failure) rather than a refusal or a finding about the data: after one, sled keeps
    /// failing until it is reopened.
    pub fn is_io_failure(&self) -> bool {
        matches!(self, StoreError::Io { .. } | StoreError::Sled { .. })
    }
}

impl Buffer {
    /// Opens the buffer in `dir`, creating the directory (mode 0700: it holds message
    /// payloads) and an empty buffer if needed.
    pub fn open(dir: impl AsRef<Path>, options: BufferOptions) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        fsync::create_private_dir(&dir).map_err(|source| StoreError::Io {
            dir: dir.clone(),
            action: "creating the directory".into(),
            source,
        })?;
        Self::open_dir(dir, options, true)
    }

    /// Opens an existing buffer; never creates one.
    pub fn open_existing(
        dir: impl AsRef<Path>,
        options: BufferOptions,
    ) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        snapshot::check_buffer_dir(&dir)?;
        Self::open_dir(dir, options, false)
    }

    fn open_dir(dir: PathBuf, options: BufferOptions, create: bool) -> Result<Self, StoreError> {
        // A compaction in another process may switch generations between our reading
        // `CURRENT` and sled's lock: the lock of a generation no longer current proves
        // nothing, so look again (a handful of switches in a row cannot happen: each needs
        // the lock we just got).
        let mut switches = 0;
        loop {
            let sled_dir = generation::current(&dir).map_err(|err| current_error(&dir, err))?;
            let opened = Self::open_sled(&dir, &sled_dir, options.clone());
            let still = generation::current(&dir).map_err(|err| current_error(&dir, err))?;
            if still != sled_dir {
                // Whatever that open found (even a panic on files being deleted), it was
                // not the buffer any more.
                drop(opened);
                switches += 1;
                if switches >= 5 {
                    return Err(StoreError::Locked { dir });
                }
                continue;
            }
            let (db, options) = opened?;
            return Self::with_db(dir, sled_dir, db, options, create);
        }
    }

    /// Opens sled in `sled_dir` (a generation of the buffer in `dir`), waiting for its lock.
    fn open_sled(
        dir: &Path,
        sled_dir: &Path,
        mut options: BufferOptions,
    ) -> Result<(sled::Db, BufferOptions), StoreError> {
        match persisted_segment_bytes(sled_dir) {
            // sled cannot change it: chunks are sized for the segments the buffer has (a
            // buffer of an earlier version has 512 KiB ones).
            Some(persisted) if persisted != options.segment_bytes => {
                tracing::debug!(
                    dir = %dir.display(),
                    persisted,
                    "the buffer keeps the sled segment size it was created with"
                );
                options.segment_bytes = persisted;
                options.chunk_target_bytes = options
                    .chunk_target_bytes
                    .min(largest_chunk_without_blobs(persisted))
                    .max(1);
            }
            _ => check_options(dir, &options)?,
        }
        let config = sled_config(sled_dir, &options);
        let started = std::time::Instant::now();
        let deadline = started + options.lock_wait;
        let tool_deadline = deadline + TOOL_WAIT;
        let mut told = false;
        // sled 0.34 can panic on some damaged files instead of returning an error; a damaged
        // buffer must be a typed error, so the panic is contained here and reported as one.
        let db = match catch_unwind(AssertUnwindSafe(|| {
            loop {
                match config
                    .open()
                    .map_err(|err| classify_open_error(dir.to_path_buf(), err))
                {
                    Err(StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    // `inspect`, `dump` or `verify` copying the buffer holds it for as long as
                    // the copy takes: wait for it rather than fail (store audit S1).
                    Err(StoreError::Locked { .. })
                        if std::time::Instant::now() < tool_deadline
                            && snapshot::held_by_reader(dir) =>
                    {
                        if !told {
                            tracing::info!(
                                dir = %dir.display(),
                                "an offline tool (inspect, dump or verify) is copying the buffer; waiting for it"
                            );
                            told = true;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    result => return result,
                }
            }
        })) {
            Ok(Ok(db)) => db,
            Ok(Err(err)) => return Err(err),
            Err(panic) => {
                return Err(StoreError::Damaged {
                    dir: dir.to_path_buf(),
                    reason: format!("recovery failed: {}", panic_reason(&*panic)),
                });
            }
        };
        Ok((db, options))
    }

    fn with_db(
        dir: PathBuf,
        sled_dir: PathBuf,
        db: sled::Db,
        options: BufferOptions,
        create: bool,
    ) -> Result<Self, StoreError> {
        let buffer = Buffer {
            dir,
            current: RwLock::new(Generation {
                db: Some(std::sync::Arc::new(db)),
                path: sled_dir,
            }),
            options,
            topics: RwLock::new(HashMap::new()),
            topic_alloc: Mutex::new(()),
            partition_locks: (0..LOCK_SHARDS).map(|_| Mutex::new(())).collect(),
            layouts: Mutex::new(HashMap::new()),
            next_layout: std::sync::atomic::AtomicU64::new(1),
            compaction: compact::Tracker::default(),
        };
        // sled can also panic on the first reads of a damaged database it opened.
        buffer.contain_panics("reading the buffer metadata", || {
            buffer.load_meta(create)?;
            buffer.load_topics()?;
            if create {
                buffer.forget_unused_topics()?;
            }
            Ok(())
        })?;
        // What an interrupted compaction or a switch left behind: not the buffer any more.
        let sled_dir = buffer.sled_dir();
        match generation::remove_stale(&buffer.dir, &sled_dir) {
            Ok(0) => {}
            Ok(freed) => tracing::info!(
                dir = %buffer.dir.display(),
                freed_bytes = freed,
                "removed what an interrupted buffer compaction left behind"
            ),
            Err(source) => {
                return Err(StoreError::Io {
                    dir: buffer.dir.clone(),
                    action: "removing an earlier generation of the database".into(),
                    source,
                });
            }
        }
        if create && !buffer.dir.join(MARKER).exists() {
            // Proven ours now (catchup metadata): the mark that lets a later start empty the
            // directory if sled cannot recover it, and never a directory that is not ours.
            std::fs::write(buffer.dir.join(MARKER), MARKER_TEXT).map_err(|source| {
                StoreError::Io {
                    dir: buffer.dir.clone(),
                    action: format!("writing {MARKER}"),
                    source,
                }
            })?;
        }
        Ok(buffer)
    }

    /// The open generation's database (a cheap handle). Take it afresh for every use, after
    /// any lock the use needs: a compaction swaps it under those locks.
    fn db(&self) -> Result<std::sync::Arc<sled::Db>, StoreError> {
        read_lock(&self.current)
            .db
            .clone()
            .ok_or_else(|| StoreError::Released {
                dir: self.dir.clone(),
            })
    }

    /// The directory holding the open generation's sled files.
    fn sled_dir(&self) -> PathBuf {
        read_lock(&self.current).path.clone()
    }

    /// Whether `dir` holds the mark a catchup buffer gets once opened (every buffer since
    /// this mark exists, and every older one opened since): only such a directory is ever
    /// emptied by [`Buffer::empty`].
    pub fn is_marked(dir: &Path) -> bool {
        dir.join(MARKER).is_file()
    }

    /// Runs `read`, turning a panic inside sled (which 0.34 raises on some damaged files
    /// instead of returning an error) into [`StoreError::Damaged`].
    pub(crate) fn contain_panics<T>(
        &self,
        action: &str,
        read: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        catch_unwind(AssertUnwindSafe(read)).unwrap_or_else(|panic| {
            Err(self.damaged(format!("{action}: {}", panic_reason(&*panic))))
        })
    }

    /// The buffer directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes everything written so far durable: sled's flush, then an fsync of every file in
    /// the directory and of the directory itself (sled 0.34.7 alone uses `sync_file_range`,
    /// which does not survive a power loss). After an error, do not trust a later success on
    /// the same handle: the kernel may have dropped the pages that failed to write.
    pub fn sync(&self) -> Result<(), StoreError> {
        // Not while a compaction switches generations under the walk.
        let _alone = self.compaction.exclusive();
        self.db()?.flush().map_err(|err| self.sled_error(err))?;
        fsync::sync_tree(&self.sled_dir())
            .and_then(|()| std::fs::File::open(&self.dir)?.sync_all())
            .map_err(|source| StoreError::Io {
                dir: self.dir.clone(),
                action: "fsync".into(),
                source,
            })
    }

    /// Bytes the buffer's directory occupies on disk (allocated blocks of every file in it).
    pub fn disk_bytes(&self) -> Result<u64, StoreError> {
        Ok(generation::allocated_bytes(&self.dir))
    }

    /// Drops the handle and waits (up to [`BufferOptions::lock_wait`]) until sled's
    /// background threads have let go of the directory's lock, so that another process — an
    /// offline tool, a restarted consumer — can open it at once. Dropping alone releases the
    /// lock a little later (sled's flusher holds the file until its next tick).
    pub fn close(self) -> Result<(), StoreError> {
        self.release()
    }

    /// [`Buffer::close`] through a shared handle: lets go of the database (a running
    /// compaction ends first) and waits for its lock like `close`; every later call on this
    /// buffer fails with [`StoreError::Released`]. Do not call it after a failed write (sled's
    /// flush on drop can then block for good).
    pub fn release(&self) -> Result<(), StoreError> {
        let _alone = self.compaction.exclusive();
        let (sled_dir, db) = {
            let mut current = write_lock(&self.current);
            (current.path.clone(), current.db.take())
        };
        let Some(db) = db else {
            return Ok(());
        };
        // A read in flight finishes first.
        let deadline = std::time::Instant::now() + self.options.lock_wait;
        while std::sync::Arc::strong_count(&db) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(db);
        let dir = self.dir.clone();
        let io = |action: &str, source| StoreError::Io {
            dir: dir.clone(),
            action: action.into(),
            source,
        };
        let db_file = std::fs::File::open(sled_dir.join("db"))
            .map_err(|e| io("opening the database file", e))?;
        loop {
            match snapshot::try_lock_exclusive(&db_file) {
                Ok(true) => return Ok(()),
                Ok(false) if std::time::Instant::now() < deadline => {
                    // Nothing to wait on but sled's thread letting go of the file.
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Ok(false) => return Err(StoreError::Locked { dir }),
                Err(err) => return Err(io("locking the database file", err)),
            }
        }
    }

    /// Marks the buffer untrusted after a failed write: sled may keep a torn state (a record
    /// chunk lost while the partition state that counts it survived), so the next
    /// [`Buffer::open`] through [`Buffer::empty_if_untrusted`] starts it empty and the
    /// consumer refetches from Kafka. Creating an empty file usually works on a full disk;
    /// if it does not, the error says to delete the directory.
    pub fn mark_untrusted(&self) -> Result<(), StoreError> {
        let marker = self.dir.join(UNTRUSTED);
        std::fs::File::create(&marker)
            .and_then(|file| file.sync_all())
            .and_then(|()| std::fs::File::open(&self.dir)?.sync_all())
            .map_err(|source| StoreError::Io {
                dir: self.dir.clone(),
                action: format!(
                    "marking it untrusted after a failed write ({}); delete the directory before the next start",
                    marker.display()
                ),
                source,
            })
    }

    /// If `dir` holds a buffer marked untrusted ([`Buffer::mark_untrusted`]), deletes its
    /// database so that the next open starts empty; returns whether it did.
    pub fn empty_if_untrusted(dir: &Path) -> Result<bool, StoreError> {
        let marker = dir.join(UNTRUSTED);
        if !marker.exists() {
            return Ok(false);
        }
        Self::empty(dir)?;
        std::fs::remove_file(&marker).map_err(|source| StoreError::Io {
            dir: dir.to_path_buf(),
            action: "removing the untrusted marker".into(),
            source,
        })?;
        Ok(true)
    }

    /// Deletes sled's files in `dir` (a buffer that cannot be trusted or recovered: it is a
    /// cache of Kafka, refetched from there). Other files in the directory are left alone.
    /// Refuses a directory without the catchup mark ([`Buffer::is_marked`]) with
    /// [`StoreError::NotABuffer`], and one whose database another process holds with
    /// [`StoreError::Locked`]: the lock is taken first and held until `db` goes, last.
    pub fn empty(dir: &Path) -> Result<(), StoreError> {
        let io = |action: &str, source| StoreError::Io {
            dir: dir.to_path_buf(),
            action: action.into(),
            source,
        };
        if !Self::is_marked(dir) {
            return Err(StoreError::NotABuffer {
                dir: dir.to_path_buf(),
                reason: format!("no {MARKER} file: not emptied, it may not be catchup's"),
            });
        }
        // A `CURRENT` naming no generation cannot be trusted either: everything goes.
        let named = generation::current(dir).ok();
        let current = named.clone().unwrap_or_else(|| dir.to_path_buf());
        let db = match std::fs::File::open(current.join("db")) {
            Ok(db) => Some(db),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(err) => return Err(io("opening the database file", err)),
        };
        if let Some(db) = &db {
            if !snapshot::try_lock_exclusive_held(db).map_err(|e| io("locking it", e))? {
                return Err(StoreError::Locked {
                    dir: dir.to_path_buf(),
                });
            }
        }
        // A consumer compacting switched generations meanwhile: it holds the new one.
        if generation::current(dir).ok() != named {
            return Err(StoreError::Locked {
                dir: dir.to_path_buf(),
            });
        }
        // Every other generation first, the locked one last: its lock keeps others out
        // until everything else is gone. sled's files and generations only: what else the
        // directory holds is not ours to delete.
        let remove = |path: &Path| {
            generation::remove(path)
                .map_err(|e| io(&format!("emptying it ({})", path.display()), e))
        };
        generation::remove_stale(dir, &current)
            .map_err(|e| io("removing an earlier generation", e))?;
        remove(&dir.join(generation::CURRENT))?;
        if current != dir {
            remove(&current)?;
        } else {
            let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
                .map_err(|e| io("listing it", e))?
                .collect::<Result<_, _>>()
                .map_err(|e| io("listing it", e))?;
            entries.sort_by_key(|entry| entry.file_name() == "db");
            for entry in entries {
                if generation::is_sled_file(&entry.file_name().to_string_lossy()) {
                    remove(&entry.path())?;
                }
            }
        }
        drop(db); // releases the lock
        Ok(())
    }

    /// Free and total bytes of the filesystem holding the buffer (`statvfs`).
    pub fn free_space(&self) -> Result<DiskSpace, StoreError> {
        free_space(&self.dir).map_err(|source| StoreError::Io {
            dir: self.dir.clone(),
            action: "reading the filesystem's free space".into(),
            source,
        })
    }

    fn load_meta(&self, create: bool) -> Result<(), StoreError> {
        match self
            .db()?
            .get(keys::META)
            .map_err(|err| self.sled_error(err))?
        {
            Some(value) => match codec::decode::<BufferMeta>(&value) {
                Ok(_) => Ok(()),
                Err(CodecError::NewerVersion { found }) => Err(StoreError::NewerFormat {
                    dir: self.dir.clone(),
                    found,
                }),
                Err(err) => Err(self.damaged(format!("buffer metadata: {err}"))),
            },
            None if create && self.db()?.is_empty() => {
                let meta = BufferMeta { next_topic_id: 0 };
                self.db()?
                    .insert(keys::META, codec::encode(&meta))
                    .map_err(|err| self.sled_error(err))?;
                Ok(())
            }
            None => Err(StoreError::NotABuffer {
                dir: self.dir.clone(),
                reason: if self.db()?.is_empty() {
                    "the database is empty".into()
                } else {
                    "a sled database without catchup metadata".into()
                },
            }),
        }
    }

    fn load_topics(&self) -> Result<(), StoreError> {
        let mut topics = HashMap::new();
        for entry in self.db()?.scan_prefix(keys::topic_prefix()) {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            let name = String::from_utf8(key[1..].to_vec())
                .map_err(|_| self.damaged("a topic name is not UTF-8".into()))?;
            let id: u32 = codec::decode(&value)
                .map_err(|err| self.damaged(format!("topic id of '{name}': {err}")))?;
            topics.insert(name, id);
        }
        *write_lock(&self.topics) = topics;
        Ok(())
    }

    /// Removes the entries of topics nothing is buffered for any more (every partition
    /// discarded or pruned): their name-to-id mapping and incarnation record (store audit
    /// D3). Only at open, before any writer: a writer resolves a topic's id before taking
    /// the partition's lock, so removing a mapping while writers run could orphan records.
    fn forget_unused_topics(&self) -> Result<(), StoreError> {
        let db = self.db()?;
        let unused: Vec<(String, u32)> = read_lock(&self.topics)
            .iter()
            .map(|(name, id)| (name.clone(), *id))
            .filter(|(_, id)| {
                keys::topic_id_prefixes(*id)
                    .iter()
                    .all(|prefix| db.scan_prefix(prefix).next().is_none())
            })
            .collect();
        if unused.is_empty() {
            return Ok(());
        }
        let mut batch = compact::Batch::default();
        for (name, _) in &unused {
            batch.remove(keys::topic(name));
            batch.remove(keys::incarnation(name));
        }
        self.apply(batch)?;
        let mut topics = write_lock(&self.topics);
        for (name, _) in &unused {
            topics.remove(name);
        }
        tracing::debug!(
            count = unused.len(),
            "forgot topics nothing is buffered for"
        );
        Ok(())
    }

    /// The id of `topic`, if the buffer has seen it.
    fn topic_id(&self, topic: &str) -> Option<u32> {
        read_lock(&self.topics).get(topic).copied()
    }

    fn topic_name(&self, topic_id: u32) -> Option<String> {
        read_lock(&self.topics)
            .iter()
            .find(|(_, id)| **id == topic_id)
            .map(|(name, _)| name.clone())
    }

    /// The id of `topic`, allocated (durably with the next batch) on first use.
    fn topic_id_or_insert(&self, topic: &str) -> Result<u32, StoreError> {
        if let Some(id) = self.topic_id(topic) {
            return Ok(id);
        }
        let _alloc = lock(&self.topic_alloc);
        if let Some(id) = self.topic_id(topic) {
            return Ok(id);
        }
        let meta: BufferMeta = match self
            .db()?
            .get(keys::META)
            .map_err(|err| self.sled_error(err))?
        {
            Some(value) => codec::decode(&value)
                .map_err(|err| self.damaged(format!("buffer metadata: {err}")))?,
            None => return Err(self.damaged("buffer metadata is missing".into())),
        };
        let id = meta.next_topic_id;
        if let Some((other, _)) = read_lock(&self.topics)
            .iter()
            .find(|(_, used)| **used == id)
        {
            // Only a damaged or crafted buffer gets here; sharing the id would mix two
            // topics' records under the same keys.
            return Err(self.damaged(format!(
                "the next topic id {id} in the buffer metadata is already used by topic {other}"
            )));
        }
        let next = BufferMeta {
            next_topic_id: id
                .checked_add(1)
                .ok_or_else(|| self.damaged("topic ids exhausted".into()))?,
        };
        let mut batch = compact::Batch::default();
        batch.insert(keys::topic(topic), codec::encode(&id));
        batch.insert(keys::META, codec::encode(&next));
        self.apply(batch)?;
        write_lock(&self.topics).insert(topic.to_owned(), id);
        Ok(id)
    }

    /// The current layout of `topic`/`partition`, to name in appends; `None` when the
    /// partition is not laid out.
    pub fn layout_id(&self, topic: &str, partition: i32) -> Result<Option<LayoutId>, StoreError> {
        let Some(part) = self.partition_key(topic, partition)? else {
            return Ok(None);
        };
        let _guard = self.partition_lock(part);
        if self.load_state(part)?.is_none() {
            return Ok(None);
        }
        Ok(Some(self.layout_id_of(part)))
    }

    /// The layout id of `part`, allocated on first use (a state reused from an earlier run).
    /// Call with the partition's lock held.
    fn layout_id_of(&self, part: PartitionKey) -> LayoutId {
        *lock(&self.layouts).entry(part).or_insert_with(|| {
            LayoutId(
                self.next_layout
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            )
        })
    }

    /// Gives `part` a new layout id: every writer positioned under the old one is stale.
    /// Call with the partition's lock held.
    fn new_layout_id(&self, part: PartitionKey) {
        let id = LayoutId(
            self.next_layout
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        lock(&self.layouts).insert(part, id);
    }

    fn partition_key(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<PartitionKey>, StoreError> {
        let partition = self.partition_number(topic, partition)?;
        Ok(self.topic_id(topic).map(|topic_id| PartitionKey {
            topic_id,
            partition,
        }))
    }

    fn partition_number(&self, topic: &str, partition: i32) -> Result<u32, StoreError> {
        u32::try_from(partition)
            .map_err(|_| self.rejected(topic, partition, "negative partition".into()))
    }

    fn partition_lock(&self, part: PartitionKey) -> MutexGuard<'_, ()> {
        let shard = (part.topic_id as usize)
            .wrapping_mul(31)
            .wrapping_add(part.partition as usize);
        lock(&self.partition_locks[shard % LOCK_SHARDS])
    }

    fn load_state(&self, part: PartitionKey) -> Result<Option<PartitionState>, StoreError> {
        match self
            .db()?
            .get(keys::state(part))
            .map_err(|err| self.sled_error(err))?
        {
            None => Ok(None),
            Some(value) => codec::decode(&value).map(Some).map_err(|err| {
                self.damaged(format!(
                    "state of topic id {} partition {}: {err}",
                    part.topic_id, part.partition
                ))
            }),
        }
    }

    fn sled_error(&self, source: sled::Error) -> StoreError {
        sled_error(&self.dir, &self.sled_dir(), source)
    }

    fn damaged(&self, reason: String) -> StoreError {
        StoreError::Damaged {
            dir: self.dir.clone(),
            reason,
        }
    }

    fn rejected(&self, topic: &str, partition: i32, reason: String) -> StoreError {
        StoreError::Rejected {
            dir: self.dir.clone(),
            topic: topic.to_owned(),
            partition,
            reason,
        }
    }
}

impl StoreError {
    /// The same error, naming `dir` as the buffer directory (a snapshot reports the
    /// original directory, not its private copy).
    fn for_dir(self, dir: &Path) -> Self {
        let dir = dir.to_path_buf();
        match self {
            StoreError::Io { action, source, .. } => StoreError::Io {
                dir,
                action,
                source,
            },
            StoreError::Locked { .. } => StoreError::Locked { dir },
            StoreError::Released { .. } => StoreError::Released { dir },
            StoreError::Missing { .. } => StoreError::Missing { dir },
            StoreError::NotABuffer { reason, .. } => StoreError::NotABuffer { dir, reason },
            StoreError::NewerFormat { found, .. } => StoreError::NewerFormat { dir, found },
            StoreError::Damaged { reason, .. } => StoreError::Damaged { dir, reason },
            StoreError::Options { reason, .. } => StoreError::Options { dir, reason },
            StoreError::NoRoom {
                tmp,
                needed,
                available,
                ..
            } => StoreError::NoRoom {
                dir,
                tmp,
                needed,
                available,
            },
            StoreError::Sled { source, .. } => StoreError::Sled { dir, source },
            StoreError::StaleLayout {
                topic,
                partition,
                lane,
                fetched_under,
                current,
                ..
            } => StoreError::StaleLayout {
                dir,
                topic,
                partition,
                lane,
                fetched_under,
                current,
            },
            StoreError::Discontinuous {
                topic,
                partition,
                lane,
                continues_from,
                fetched_next,
                ..
            } => StoreError::Discontinuous {
                dir,
                topic,
                partition,
                lane,
                continues_from,
                fetched_next,
            },
            StoreError::Rejected {
                topic,
                partition,
                reason,
                ..
            } => StoreError::Rejected {
                dir,
                topic,
                partition,
                reason,
            },
        }
    }
}

fn classify_open_error(dir: PathBuf, err: sled::Error) -> StoreError {
    match err {
        sled::Error::Io(io) if io.to_string().contains("could not acquire lock") => {
            StoreError::Locked { dir }
        }
        sled::Error::Io(io) => StoreError::Io {
            dir,
            action: "opening the database".into(),
            source: io,
        },
        sled::Error::Unsupported(reason) | sled::Error::ReportableBug(reason) => {
            StoreError::Damaged {
                dir,
                reason: format!("sled cannot open it: {reason}"),
            }
        }
        other => sled_error(&dir, &dir, other),
    }
}

/// A sled error as a sentence for a person: sled's own rendering of corruption is a debug
/// dump (`Read corrupted data at file offset Some(Inline(1180828)) backtrace ()`).
/// `files` is the directory of the generation whose files failed.
fn sled_error(dir: &Path, files: &Path, source: sled::Error) -> StoreError {
    match source {
        sled::Error::Corruption { at, .. } => StoreError::Damaged {
            dir: dir.to_path_buf(),
            reason: match at {
                Some(sled::DiskPtr::Inline(offset)) => format!(
                    "corrupted data in {} at byte {offset}",
                    files.join("db").display()
                ),
                Some(sled::DiskPtr::Blob(_, blob)) => format!(
                    "blob file {} is corrupted or missing",
                    files.join("blobs").join(blob.to_string()).display()
                ),
                None => "corrupted data in the database files".into(),
            },
        },
        sled::Error::Io(io) => StoreError::Io {
            dir: dir.to_path_buf(),
            action: "reading or writing the database".into(),
            source: io,
        },
        source => StoreError::Sled {
            dir: dir.to_path_buf(),
            source,
        },
    }
}

/// The message of a panic sled raised.
fn panic_reason(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("sled panicked on damaged data")
}

// The locks guard no data of their own (only ordering of sled writes), so a panic in another
// thread while holding one leaves nothing inconsistent: recover the guard.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How long opening waits, beyond [`BufferOptions::lock_wait`], while an offline tool holds
/// the buffer's lock to copy it (a copy of several GB takes minutes).
const TOOL_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Entries a sled leaf holds at most before it splits (it splits above 16), plus one.
const LEAF_ENTRIES: usize = 18;

/// The largest chunk whose leaf of [`LEAF_ENTRIES`] chunks stays below sled's blob
/// threshold for `segment_bytes` (a quarter segment less sled's segment and message
/// headers, and about 64 bytes of key and framing per entry). Two thirds of that: chunks are
/// cut on an estimate of their encoded size, which tiny records can exceed by up to 40 %.
fn largest_chunk_without_blobs(segment_bytes: usize) -> usize {
    ((segment_bytes / 4).saturating_sub(20 + 32) / LEAF_ENTRIES).saturating_sub(64) * 2 / 3
}

fn check_options(dir: &Path, options: &BufferOptions) -> Result<(), StoreError> {
    let invalid = |reason: String| StoreError::Options {
        dir: dir.to_path_buf(),
        reason,
    };
    let segment = options.segment_bytes;
    if !segment.is_power_of_two() || !((1 << 20)..=(16 << 20)).contains(&segment) {
        return Err(invalid(format!(
            "segment_bytes {segment} must be a power of two from 1 MiB to 16 MiB"
        )));
    }
    let largest = largest_chunk_without_blobs(segment);
    if options.chunk_target_bytes == 0 || options.chunk_target_bytes > largest {
        return Err(invalid(format!(
            "chunk_target_bytes {} must be from 1 to {largest} with segments of {segment} bytes: \
             larger chunks would make sled write leaves as blob files, which a power loss can \
             tear out of order",
            options.chunk_target_bytes
        )));
    }
    Ok(())
}

/// sled's configuration of a buffer generation in `sled_dir`.
fn sled_config(sled_dir: &Path, options: &BufferOptions) -> sled::Config {
    sled::Config::new()
        .path(sled_dir)
        .cache_capacity(options.cache_capacity)
        .flush_every_ms(options.flush_every_ms)
        .segment_size(options.segment_bytes)
        .mode(sled::Mode::HighThroughput)
}

/// A `CURRENT` file that cannot be read or names no generation.
fn current_error(dir: &Path, err: std::io::Error) -> StoreError {
    match err.kind() {
        std::io::ErrorKind::InvalidData => StoreError::Damaged {
            dir: dir.to_path_buf(),
            reason: err.to_string(),
        },
        _ => StoreError::Io {
            dir: dir.to_path_buf(),
            action: format!("reading {}", generation::CURRENT),
            source: err,
        },
    }
}

/// The segment size recorded in an existing buffer's sled configuration file, if any.
fn persisted_segment_bytes(dir: &Path) -> Option<usize> {
    let conf = std::fs::read(dir.join("conf")).ok()?;
    String::from_utf8_lossy(&conf)
        .lines()
        .find_map(|line| line.strip_prefix("segment_size: "))
        .and_then(|value| value.trim().parse().ok())
}

fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The file that marks a buffer whose write failed (see [`Buffer::mark_untrusted`]).
const UNTRUSTED: &str = "UNTRUSTED";
/// The file that marks a directory as a catchup buffer (see [`Buffer::is_marked`]).
const MARKER: &str = "CATCHUP_BUFFER";
const MARKER_TEXT: &str = "A catchup buffer: a cache of Kafka records. When sled cannot recover it, catchup deletes its sled files (db, conf, blobs, snap.*) and refetches from Kafka.\n";
