//! Giving disk back: how many bytes the buffer stores, and the copy into a fresh generation.
//!
//! sled reuses the space of deleted entries for new ones but never shrinks its files while
//! a live page sits near their end, so a drained buffer keeps its peak size, and
//! even a full one carries up to 2–3× its entries in garbage awaiting sled's
//! cleaner. [`Buffer::compact`] copies every entry into a new sled database in a new
//! generation directory and switches to it (see `generation`); the old files go once no
//! read holds them. [`Buffer::compact_if_bloated`] decides when: the directory holds more
//! than twice the payload plus
//! [`BufferOptions::disk_allowance_bytes`](super::BufferOptions::disk_allowance_bytes), and
//! the copy is expected to take at most two thirds of it.
//!
//! A compaction copies in two phases so that writers wait only for the second: first
//! everything, while fetchers and commits go on writing the old generation and note the
//! keys they touch ([`Batch`]); then, under every writer's lock, those keys again from the
//! old generation, an fsync, and the switch. A failed compaction leaves the buffer in the old
//! generation, as it was.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{
    Buffer, Generation, Shard, StoreError, fsync, generation, lock, sled_config, write_lock,
};

/// Entries copied per sled batch, and the bytes that end one early.
const COPY_BATCH_ENTRIES: usize = 1000;
const COPY_BATCH_BYTES: usize = 4 << 20;

/// What a fresh sled copy occupies per byte stored, at most: sled rewrites a leaf each
/// time it consolidates one, and keeps the superseded versions until a segment is half
/// garbage. Measured on copies of 40 MB of 32 KiB chunks: 2.2–2.7 (by insertion order).
pub const COPY_RATIO: f64 = 2.5;

/// What a fresh sled database occupies with nearly nothing in it (its first segments,
/// `conf`, a snapshot).
pub const COPY_OVERHEAD: u64 = 16 << 20;

/// The disk a compaction of `stored` bytes is expected to leave.
fn expected_after(stored: u64) -> u64 {
    ((stored as f64 * COPY_RATIO) as u64).saturating_add(COPY_OVERHEAD)
}

/// How long a compaction waits for reads still on the old generation before removing it
/// (a read holds it for one call); past that, the next compaction or open removes it.
const READERS_WAIT: Duration = Duration::from_secs(10);

/// Ends the noting of keys when a compaction ends, however it ends.
struct StopNoting<'a>(&'a Tracker);

impl Drop for StopNoting<'_> {
    fn drop(&mut self) {
        *lock(&self.0.touched) = None;
    }
}

/// What the buffer tracks for compaction.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    /// Held by a compaction and by `sync` (which walks the generation's files).
    alone: Mutex<()>,
    /// Key and value bytes of entries written and removed since the buffer was opened.
    added: AtomicU64,
    removed: AtomicU64,
    /// Of the bytes added, those of the records' keys, values and headers (the payload).
    payload_added: AtomicU64,
    /// The stored bytes counted once (a scan or a compaction) and the counters then.
    baseline: Mutex<Option<Baseline>>,
    /// While a compaction copies: every key written since it began.
    touched: Mutex<Option<HashSet<Vec<u8>>>>,
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

    /// `bytes` stored, of which `payload` bytes of records.
    pub(crate) fn added(&self, bytes: u64, payload: u64) {
        self.added.fetch_add(bytes, Ordering::Relaxed);
        self.payload_added.fetch_add(payload, Ordering::Relaxed);
    }

    /// What is stored, scaled by the share of payload in what this process wrote: the
    /// bytes the target counts (keys, values and headers of the records buffered).
    fn payload_estimate(&self, stored: u64) -> u64 {
        let added = self.added.load(Ordering::Relaxed);
        let payload = self.payload_added.load(Ordering::Relaxed);
        if added == 0 {
            return stored;
        }
        (stored as u128 * payload.min(added) as u128 / added as u128) as u64
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

    /// Whether writers note their keys (a compaction is copying).
    #[cfg(test)]
    pub(crate) fn is_noting(&self) -> bool {
        lock(&self.touched).is_some()
    }

    /// Notes keys a writer changed, under the lock that orders it with a compaction.
    fn touched(&self, keys: Vec<Vec<u8>>) {
        if let Some(touched) = lock(&self.touched).as_mut() {
            touched.extend(keys);
        }
    }

    fn counters(&self) -> (u64, u64) {
        (
            self.added.load(Ordering::Relaxed),
            self.removed.load(Ordering::Relaxed),
        )
    }
}

/// A sled batch that remembers its keys, for a compaction copying meanwhile. Every write
/// of the database goes through one ([`Buffer::apply`]).
#[derive(Default)]
pub(crate) struct Batch {
    sled: sled::Batch,
    keys: Vec<Vec<u8>>,
}

impl Batch {
    pub(crate) fn insert(&mut self, key: impl AsRef<[u8]>, value: impl Into<sled::IVec>) {
        self.sled.insert(key.as_ref(), value);
        self.keys.push(key.as_ref().to_vec());
    }

    pub(crate) fn remove(&mut self, key: impl AsRef<[u8]>) {
        self.sled.remove(key.as_ref());
        self.keys.push(key.as_ref().to_vec());
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
    /// How long the whole compaction took.
    pub took: Duration,
    /// How long writers waited: the keys they wrote during the copy, copied again, and the
    /// switch.
    pub writers_waited: Duration,
    /// Keys written during the copy, copied again.
    pub replayed_keys: u64,
}

impl Buffer {
    /// Applies `batch` atomically, noting its keys for a compaction that is copying. Call
    /// it under the lock that orders the write with a compaction: the partition's write
    /// lock, or `topic_alloc` for entries of no partition.
    pub(crate) fn apply(&self, batch: Batch) -> Result<(), StoreError> {
        self.db()?.apply_batch(batch.sled).map_err(|err| {
            self.write_failed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            self.sled_error(err)
        })?;
        self.compaction.touched(batch.keys);
        Ok(())
    }

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
        for entry in self.db()?.iter() {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            bytes += (key.len() + value.len()) as u64;
        }
        self.compaction.set_baseline(bytes, added, removed);
        Ok(bytes)
    }

    /// Compacts ([`Buffer::compact`]) when the directory occupies more than twice the
    /// payload stored (keys, values and headers of the records; estimated from what is
    /// stored by the share of payload in what this process wrote) plus
    /// [`BufferOptions::disk_allowance_bytes`](super::BufferOptions), the copy is expected
    /// to take at most two thirds of that ([`COPY_RATIO`] times what is stored, plus sled's
    /// fixed [`COPY_OVERHEAD`]), and the filesystem has room for it; `None` when it did not.
    ///
    /// The second condition keeps a full buffer from being copied over and over for
    /// nothing: sled's own write amplification holds a buffer being filled at 1.7–2.5
    /// times its payload, and a fresh copy lands there too.
    pub fn compact_if_bloated(&self) -> Result<Option<Compaction>, StoreError> {
        let allowance = self.options.disk_allowance_bytes;
        let disk = self.disk_bytes()?;
        if disk <= allowance {
            return Ok(None);
        }
        let stored = self.stored_bytes()?;
        let payload = self.compaction.payload_estimate(stored);
        if disk <= payload.saturating_mul(2).saturating_add(allowance) {
            return Ok(None);
        }
        let expected = expected_after(stored);
        if expected.saturating_mul(3) > disk.saturating_mul(2) {
            return Ok(None);
        }
        let free = self.free_space()?.available;
        if free < expected {
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
    /// space sled held (see the module docs). Writers wait only while the keys they wrote
    /// during the copy are copied again. On an error the buffer stays as it was, in the
    /// old generation, and the partial copy is removed.
    pub fn compact(&self) -> Result<Compaction, StoreError> {
        let _alone = self.compaction.exclusive();
        // However it ends (an error, a panic sled raised on damaged data), writers stop
        // noting their keys.
        let _stop_noting = StopNoting(&self.compaction);
        self.contain_panics("compacting the buffer", || self.compact_alone())
    }

    fn compact_alone(&self) -> Result<Compaction, StoreError> {
        let started = Instant::now();
        let old_dir = self.sled_dir();
        let name = generation::next_name(&self.dir, &old_dir).ok_or_else(|| {
            self.damaged(format!(
                "{} names the last generation number",
                old_dir.display()
            ))
        })?;
        let new_dir = self.dir.join(&name);
        let io = |action: &str, source| StoreError::Io {
            dir: self.dir.clone(),
            action: format!("compacting into {}: {action}", new_dir.display()),
            error: source,
        };
        // Left over: partial copies, and an earlier generation a compaction kept (readers
        // held it, or its switch was not known durable: made so now).
        fsync::sync_path(&self.dir)
            .and_then(|()| generation::remove_stale(&self.dir, &old_dir))
            .map_err(|e| io("removing what earlier compactions left", e))?;
        let disk_before = self.disk_bytes()?;
        {
            // Every write is ordered with this: a writer either finished before (the copy
            // sees it) or notes its keys.
            let _writers = self.lock_writers();
            *lock(&self.compaction.touched) = Some(HashSet::new());
        }
        let copied = self.copy_into(&new_dir);
        let writers = self.lock_writers();
        let touched = lock(&self.compaction.touched).take().unwrap_or_default();
        let pause = Instant::now();
        // On a failure below, the new database is never dropped: sled flushes on drop, and
        // after a failed write that flush can block for good. Writers go first.
        let (new_db, entries, copied_bytes) = match copied {
            Ok(copied) => copied,
            Err(err) => {
                drop(writers);
                let _ = generation::remove(&new_dir);
                return Err(err);
            }
        };
        let copied_bytes = match self.replay(&new_db, &new_dir, &touched) {
            Ok(delta) => copied_bytes.saturating_add_signed(delta),
            Err(err) => {
                drop(writers);
                std::mem::forget(new_db);
                let _ = generation::remove(&new_dir);
                return Err(err);
            }
        };
        let mut keep_old = false;
        if let Err(source) = generation::switch_to(&self.dir, &name) {
            match generation::current(&self.dir) {
                // Renamed, but the directory's fsync failed: go on in the new generation
                // and keep the old one whole, for an open after a power loss to choose.
                Ok(current) if current == new_dir => {
                    tracing::warn!(%source, "buffer compaction: switched, but the switch may not be durable");
                    keep_old = true;
                }
                Ok(_) => {
                    drop(writers);
                    std::mem::forget(new_db);
                    let _ = generation::remove(&new_dir);
                    return Err(io("switching to it", source));
                }
                // Which one is current cannot be told: keep both, and keep holding the new
                // one's lock (its handle is never dropped) so that no other process opens
                // it while this one goes on in the old.
                Err(_) => {
                    drop(writers);
                    std::mem::forget(new_db);
                    return Err(io("switching to it", source));
                }
            }
        }
        let old = std::mem::replace(
            &mut *write_lock(&self.current),
            Generation {
                db: Some(std::sync::Arc::new(new_db)),
                path: new_dir.clone(),
            },
        );
        let (added, removed) = self.compaction.counters();
        self.compaction.set_baseline(copied_bytes, added, removed);
        let writers_waited = pause.elapsed();
        drop(writers);
        // A read that took the old handle before the switch finishes on it (sled opens
        // blob files by path): its files go only once it let go.
        let deadline = Instant::now() + READERS_WAIT;
        let held = |db: &Option<std::sync::Arc<sled::Db>>| {
            db.as_ref()
                .is_some_and(|db| std::sync::Arc::strong_count(db) > 1)
        };
        while held(&old.db) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let released = !held(&old.db);
        drop(old);
        if released && !keep_old {
            if let Err(source) = generation::remove_stale(&self.dir, &new_dir) {
                // Switched all the same; the next compaction or open removes it.
                tracing::warn!(%source, "buffer compaction: the old generation could not be removed yet");
            }
        }
        let compaction = Compaction {
            disk_before,
            disk_after: self.disk_bytes()?,
            copied_bytes,
            entries,
            took: started.elapsed(),
            writers_waited,
            replayed_keys: touched.len() as u64,
        };
        tracing::info!(
            dir = %self.dir.display(),
            generation = %name,
            disk_before = compaction.disk_before,
            disk_after = compaction.disk_after,
            copied_bytes,
            took_ms = compaction.took.as_millis() as u64,
            writers_waited_ms = writers_waited.as_millis() as u64,
            "compacted the buffer"
        );
        Ok(compaction)
    }

    /// Every writer's lock: the partitions' (in order) and then `topic_alloc` (topic
    /// allocation, the incarnation record).
    fn lock_writers(&self) -> (Vec<MutexGuard<'_, Shard>>, MutexGuard<'_, ()>) {
        let partitions = self.partition_locks.iter().map(lock).collect();
        (partitions, lock(&self.topic_alloc))
    }

    /// Copies every entry of the open generation into a new database in `new_dir`, made
    /// durable; returns it with the entries and bytes copied. Writers go on meanwhile.
    fn copy_into(&self, new_dir: &std::path::Path) -> Result<(sled::Db, u64, u64), StoreError> {
        let io = |action: &str, source| StoreError::Io {
            dir: self.dir.clone(),
            action: format!("compacting into {}: {action}", new_dir.display()),
            error: source,
        };
        fsync::create_private_dir(new_dir).map_err(|e| io("creating it", e))?;
        let new_db = sled_config(new_dir, &self.options)
            .open()
            .map_err(|err| self.sled_error(err))?;
        match self.copy_all(&new_db, new_dir) {
            Ok((entries, bytes)) => Ok((new_db, entries, bytes)),
            Err(err) => {
                // Never dropped after a failed write (see `compact_alone`).
                std::mem::forget(new_db);
                Err(err)
            }
        }
    }

    fn copy_all(
        &self,
        new_db: &sled::Db,
        new_dir: &std::path::Path,
    ) -> Result<(u64, u64), StoreError> {
        let (mut entries, mut bytes) = (0u64, 0u64);
        let mut batch = sled::Batch::default();
        let (mut batch_entries, mut batch_bytes) = (0, 0);
        for entry in self.db()?.iter() {
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
        // Most of the copy reaches the disk here, before writers wait for the rest.
        self.apply_durably(new_db, new_dir, batch)?;
        Ok((entries, bytes))
    }

    /// Under every writer's lock: copies the `touched` keys again from the open generation
    /// (the value it holds now, or none) and makes the copy durable (the switch must follow
    /// a real fsync). Returns the change in stored bytes.
    fn replay(
        &self,
        new_db: &sled::Db,
        new_dir: &std::path::Path,
        touched: &HashSet<Vec<u8>>,
    ) -> Result<i64, StoreError> {
        let old_db = self.db()?;
        let mut delta: i64 = 0;
        let mut batch = sled::Batch::default();
        for key in touched {
            let before = new_db.get(key).map_err(|err| self.sled_error(err))?;
            let now = old_db.get(key).map_err(|err| self.sled_error(err))?;
            let size =
                |value: &Option<sled::IVec>| value.as_ref().map_or(0, |v| key.len() + v.len());
            delta += size(&now) as i64 - size(&before) as i64;
            match now {
                Some(value) => batch.insert(key.as_slice(), value),
                None => batch.remove(key.as_slice()),
            }
        }
        self.apply_durably(new_db, new_dir, batch)?;
        Ok(delta)
    }

    /// Applies `batch` to the new generation and makes all of it durable: sled's flush, then
    /// a real fsync of its files (sled's own is `sync_file_range`).
    fn apply_durably(
        &self,
        new_db: &sled::Db,
        new_dir: &std::path::Path,
        batch: sled::Batch,
    ) -> Result<(), StoreError> {
        new_db
            .apply_batch(batch)
            .map_err(|err| self.sled_error(err))?;
        new_db.flush().map_err(|err| self.sled_error(err))?;
        fsync::sync_tree(new_dir).map_err(|source| StoreError::Io {
            dir: self.dir.clone(),
            action: format!("compacting into {}: fsync", new_dir.display()),
            error: source,
        })
    }
}
