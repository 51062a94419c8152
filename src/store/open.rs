//! Opening, syncing, releasing and emptying a buffer directory: sled's files under a
//! marker file, one generation at a time (see `generation`).

use super::*;

impl Buffer {
    /// Opens the buffer in `dir`, creating the directory (mode 0700: it holds message
    /// payloads) and an empty buffer if needed.
    pub fn open(dir: impl AsRef<Path>, options: BufferOptions) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        fsync::create_private_dir(&dir).map_err(|source| StoreError::Io {
            dir: dir.clone(),
            action: "creating the directory".into(),
            error: source,
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

    pub(super) fn open_dir(
        dir: PathBuf,
        options: BufferOptions,
        create: bool,
    ) -> Result<Self, StoreError> {
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
    pub(super) fn open_sled(
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
                    // the copy takes: wait for it rather than fail.
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

    pub(super) fn with_db(
        dir: PathBuf,
        sled_dir: PathBuf,
        db: sled::Db,
        options: BufferOptions,
        create: bool,
    ) -> Result<Self, StoreError> {
        let memory_bytes = options.memory_bytes;
        let buffer = Buffer {
            dir,
            current: RwLock::new(Generation {
                db: Some(std::sync::Arc::new(db)),
                path: sled_dir,
            }),
            options,
            topics: RwLock::new(HashMap::new()),
            topic_alloc: Mutex::new(()),
            partition_locks: (0..LOCK_SHARDS)
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            tail_bytes: std::sync::atomic::AtomicU64::new(0),
            tail_taken_bytes: std::sync::atomic::AtomicU64::new(0),
            memory_bytes: std::sync::atomic::AtomicU64::new(memory_bytes),
            spilled_bytes: std::sync::atomic::AtomicU64::new(0),
            spilled_unflushed: std::sync::atomic::AtomicU64::new(0),
            allowance: Default::default(),
            write_failed: std::sync::atomic::AtomicBool::new(false),
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
                    error: source,
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
                    error: source,
                }
            })?;
        }
        Ok(buffer)
    }

    /// The open generation's database (a cheap handle). Take it afresh for every use, after
    /// any lock the use needs: a compaction swaps it under those locks.
    pub(super) fn db(&self) -> Result<std::sync::Arc<sled::Db>, StoreError> {
        read_lock(&self.current)
            .db
            .clone()
            .ok_or_else(|| StoreError::Released {
                dir: self.dir.clone(),
            })
    }

    /// The directory holding the open generation's sled files.
    pub(super) fn sled_dir(&self) -> PathBuf {
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
        // What the memory tier holds is made durable too.
        self.flush_memory()?;
        // Not while a compaction switches generations under the walk.
        let _alone = self.compaction.exclusive();
        self.db()?.flush().map_err(|err| self.sled_error(err))?;
        fsync::sync_tree(&self.sled_dir())
            .and_then(|()| fsync::sync_path(&self.dir))
            .map_err(|source| StoreError::Io {
                dir: self.dir.clone(),
                action: "fsync".into(),
                error: source,
            })
    }

    /// Bytes the buffer's directory occupies on disk (allocated blocks of every file in it).
    pub fn disk_bytes(&self) -> Result<u64, StoreError> {
        Ok(generation::allocated_bytes(&self.dir))
    }

    /// What the memory tier holds is not written (call [`Buffer::flush_memory`] first to keep
    /// it): it is fetched again from Kafka, as after a crash.
    ///
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
            error: source,
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
            .and_then(|_| fsync::sync_path(&marker))
            .and_then(|()| fsync::sync_path(&self.dir))
            .map_err(|source| StoreError::Io {
                dir: self.dir.clone(),
                action: format!(
                    "marking it untrusted after a failed write ({}); delete the directory before the next start",
                    marker.display()
                ),
                error: source,
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
            error: source,
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
            error: source,
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
            error: source,
        })
    }
}

/// How long opening waits, beyond [`BufferOptions::lock_wait`], while an offline tool holds
/// the buffer's lock to copy it (a copy of several GB takes minutes).
pub(super) const TOOL_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Entries a sled leaf holds at most before it splits (it splits above 16), plus one.
pub(super) const LEAF_ENTRIES: usize = 18;

/// The largest chunk whose leaf of [`LEAF_ENTRIES`] chunks stays below sled's blob
/// threshold for `segment_bytes` (a quarter segment less sled's segment and message
/// headers, and about 64 bytes of key and framing per entry). Two thirds of that: chunks are
/// cut on an estimate of their encoded size, which tiny records can exceed by up to 40 %.
pub(super) fn largest_chunk_without_blobs(segment_bytes: usize) -> usize {
    ((segment_bytes / 4).saturating_sub(20 + 32) / LEAF_ENTRIES).saturating_sub(64) * 2 / 3
}

pub(super) fn check_options(dir: &Path, options: &BufferOptions) -> Result<(), StoreError> {
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
pub(super) fn sled_config(sled_dir: &Path, options: &BufferOptions) -> sled::Config {
    sled::Config::new()
        .path(sled_dir)
        .cache_capacity(options.cache_capacity)
        .flush_every_ms(options.flush_every_ms)
        .segment_size(options.segment_bytes)
        .mode(sled::Mode::HighThroughput)
}

/// The segment size recorded in an existing buffer's sled configuration file, if any.
pub(super) fn persisted_segment_bytes(dir: &Path) -> Option<usize> {
    let conf = std::fs::read(dir.join("conf")).ok()?;
    String::from_utf8_lossy(&conf)
        .lines()
        .find_map(|line| line.strip_prefix("segment_size: "))
        .and_then(|value| value.trim().parse().ok())
}

/// The file that marks a buffer whose write failed (see [`Buffer::mark_untrusted`]).
pub(super) const UNTRUSTED: &str = "UNTRUSTED";

/// The file that marks a directory as a catchup buffer (see [`Buffer::is_marked`]).
pub(super) const MARKER: &str = "CATCHUP_BUFFER";

pub(super) const MARKER_TEXT: &str = "A catchup buffer: a cache of Kafka records. When sled cannot recover it, catchup deletes its sled files (db, conf, blobs, snap.*) and refetches from Kafka.\n";
