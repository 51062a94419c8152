//! Giving disk back: how many bytes the buffer stores, and the copy into a fresh generation.
//!
//! sled reuses the space of deleted entries for new ones but never shrinks its files while
//! a live page sits near their end, so a drained buffer keeps its peak size (store audit
//! D1), and even a full one carries up to 2–3× its entries in garbage awaiting sled's
//! cleaner. [`Buffer::compact`] copies every entry into a new sled database in a new
//! generation directory and switches to it (see `generation`): the copy is as large as
//! what is stored, and the old files go at once. [`Buffer::compact_if_bloated`] does it
//! when the directory holds more than twice the stored bytes plus
//! [`BufferOptions::disk_allowance_bytes`](super::BufferOptions::disk_allowance_bytes).
//!
//! A compaction holds every partition's write lock while it copies: fetchers and commits
//! wait (reads go on, from the old generation, which nothing changes meanwhile). It copies
//! only what is stored, and is triggered only when that is at most half of what is on
//! disk, so each one at least halves the directory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Buffer, Generation, StoreError, fsync, generation, lock, sled_config, write_lock};

/// Entries copied per sled batch, and the bytes that end one early.
const COPY_BATCH_ENTRIES: usize = 1000;
const COPY_BATCH_BYTES: usize = 4 << 20;

/// Room a compaction wants beyond the copy itself (sled's segment rounding, its `conf` and
/// snapshot files): without it, it is not tried.
const COPY_MARGIN: u64 = 32 << 20;

/// What the buffer tracks for compaction.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    /// Held by a compaction and by `sync` (which walks the generation's files).
    alone: Mutex<()>,
    /// Key and value bytes of entries written and removed since the buffer was opened.
    added: AtomicU64,
    removed: AtomicU64,
    /// The stored bytes counted once (a scan or a compaction) and the counters then.
    baseline: Mutex<Option<Baseline>>,
}

#[derive(Debug, Clone, Copy)]
struct Baseline {
    bytes: u64,
    added: u64,
    removed: u64,
}

impl Tracker {
    pub(crate) fn exclusive(&self) -> MutexGuard<'_, ()> {
        lock(&self.alone)
    }

    pub(crate) fn added(&self, bytes: u64) {
        self.added.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn removed(&self, bytes: u64) {
        self.removed.fetch_add(bytes, Ordering::Relaxed);
    }

    fn estimate(&self) -> Option<u64> {
        let baseline = (*lock(&self.baseline))?;
        let added = self.added.load(Ordering::Relaxed) - baseline.added;
        let removed = self.removed.load(Ordering::Relaxed) - baseline.removed;
        Some((baseline.bytes + added).saturating_sub(removed))
    }

    /// Records `bytes` as stored when the counters read `added` and `removed`.
    fn set_baseline(&self, bytes: u64, added: u64, removed: u64) {
        *lock(&self.baseline) = Some(Baseline {
            bytes,
            added,
            removed,
        });
    }

    fn counters(&self) -> (u64, u64) {
        (
            self.added.load(Ordering::Relaxed),
            self.removed.load(Ordering::Relaxed),
        )
    }
}

/// What one compaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// Bytes the directory occupied before.
    pub disk_before: u64,
    /// Bytes it occupies after.
    pub disk_after: u64,
    /// Key and value bytes copied (everything stored).
    pub copied_bytes: u64,
    /// Entries copied.
    pub entries: u64,
    /// How long writers waited.
    pub took: Duration,
}

impl Buffer {
    /// Key and value bytes of every entry the buffer stores (records, encoded, and the
    /// small state entries). Counted by a scan the first time, then kept up to date by
    /// every write; entries written during that first scan may be counted twice or missed,
    /// which only moves when a compaction comes.
    pub fn stored_bytes(&self) -> Result<u64, StoreError> {
        if let Some(bytes) = self.compaction.estimate() {
            return Ok(bytes);
        }
        let (added, removed) = self.compaction.counters();
        let mut bytes = 0;
        for entry in self.db().iter() {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            bytes += (key.len() + value.len()) as u64;
        }
        self.compaction.set_baseline(bytes, added, removed);
        Ok(bytes)
    }

    /// Compacts ([`Buffer::compact`]) when the directory occupies more than twice the
    /// stored bytes plus [`BufferOptions::disk_allowance_bytes`](super::BufferOptions) and
    /// the filesystem has room for the copy; `None` when it did not.
    pub fn compact_if_bloated(&self) -> Result<Option<Compaction>, StoreError> {
        let allowance = self.options.disk_allowance_bytes;
        let disk = self.disk_bytes()?;
        if disk <= allowance {
            return Ok(None);
        }
        let stored = self.stored_bytes()?;
        if disk <= stored.saturating_mul(2).saturating_add(allowance) {
            return Ok(None);
        }
        let free = self.free_space()?.available;
        if free < stored.saturating_add(COPY_MARGIN) {
            tracing::debug!(
                dir = %self.dir.display(),
                stored,
                free,
                "no room to compact the buffer"
            );
            return Ok(None);
        }
        self.compact().map(Some)
    }

    /// Copies every entry into a new generation and switches to it, giving back all the
    /// space sled held (see the module docs). Writers wait meanwhile. On an error the buffer
    /// stays as it was, in the old generation, and the partial copy is removed.
    pub fn compact(&self) -> Result<Compaction, StoreError> {
        let _alone = self.compaction.exclusive();
        // Every writer of the database takes one of these locks first (and topic
        // allocation, the incarnation record and the metadata take `topic_alloc`).
        let _writers: Vec<_> = self.partition_locks.iter().map(lock).collect();
        let _topics = lock(&self.topic_alloc);
        let started = Instant::now();
        let disk_before = self.disk_bytes()?;
        let old_dir = self.sled_dir();
        let name = generation::next_name(&self.dir, &old_dir);
        let new_dir = self.dir.join(&name);
        let io = |action: &str, source| StoreError::Io {
            dir: self.dir.clone(),
            action: format!("compacting into {}: {action}", new_dir.display()),
            source,
        };
        // Left over from a compaction interrupted before its switch: not the buffer.
        generation::remove(&new_dir).map_err(|e| io("removing a partial copy", e))?;
        let (new_db, entries, copied_bytes) = match self.copy_into(&new_dir) {
            Ok(copied) => copied,
            Err(err) => {
                let _ = generation::remove(&new_dir);
                return Err(err);
            }
        };
        if let Err(source) = generation::switch_to(&self.dir, &name) {
            // A failed fsync of the directory after the rename has still switched.
            if generation::current(&self.dir).ok().as_deref() != Some(&*new_dir) {
                drop(new_db);
                let _ = generation::remove(&new_dir);
                return Err(io("switching to it", source));
            }
            tracing::warn!(%source, "buffer compaction: switched, but the switch may not be durable");
        }
        let old = std::mem::replace(
            &mut *write_lock(&self.current),
            Generation {
                db: new_db,
                path: new_dir.clone(),
            },
        );
        drop(old);
        generation::remove_stale(&self.dir, &new_dir)
            .map_err(|e| io("removing the old generation", e))?;
        let (added, removed) = self.compaction.counters();
        self.compaction.set_baseline(copied_bytes, added, removed);
        let compaction = Compaction {
            disk_before,
            disk_after: self.disk_bytes()?,
            copied_bytes,
            entries,
            took: started.elapsed(),
        };
        tracing::info!(
            dir = %self.dir.display(),
            generation = %name,
            disk_before = compaction.disk_before,
            disk_after = compaction.disk_after,
            copied_bytes,
            took_ms = compaction.took.as_millis() as u64,
            "compacted the buffer"
        );
        Ok(compaction)
    }

    /// Copies every entry of the open generation into a new database in `new_dir`, made
    /// durable; returns it with the entries and bytes copied.
    fn copy_into(&self, new_dir: &std::path::Path) -> Result<(sled::Db, u64, u64), StoreError> {
        let io = |action: &str, source| StoreError::Io {
            dir: self.dir.clone(),
            action: format!("compacting into {}: {action}", new_dir.display()),
            source,
        };
        fsync::create_private_dir(new_dir).map_err(|e| io("creating it", e))?;
        let new_db = sled_config(new_dir, &self.options)
            .open()
            .map_err(|err| self.sled_error(err))?;
        let (mut entries, mut bytes) = (0u64, 0u64);
        let mut batch = sled::Batch::default();
        let (mut batch_entries, mut batch_bytes) = (0, 0);
        for entry in self.db().iter() {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            let size = key.len() + value.len();
            batch.insert(key, value);
            entries += 1;
            bytes += size as u64;
            batch_entries += 1;
            batch_bytes += size;
            if batch_entries >= COPY_BATCH_ENTRIES || batch_bytes >= COPY_BATCH_BYTES {
                new_db
                    .apply_batch(std::mem::take(&mut batch))
                    .map_err(|err| self.sled_error(err))?;
                (batch_entries, batch_bytes) = (0, 0);
            }
        }
        new_db
            .apply_batch(batch)
            .map_err(|err| self.sled_error(err))?;
        new_db.flush().map_err(|err| self.sled_error(err))?;
        // sled's own flush is `sync_file_range`; the switch must follow a real fsync.
        fsync::sync_tree(new_dir).map_err(|e| io("fsync", e))?;
        Ok((new_db, entries, bytes))
    }
}
