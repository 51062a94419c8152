//! Errors of the buffer, and how sled's and the filesystem's failures become them.

use super::*;

/// Errors of the buffer. Each names the directory and, where it applies, the partition.
/// New variants may come in minor versions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The directory could not be created, read or synced.
    #[error("buffer {dir}: {action}: {error}")]
    Io {
        /// The buffer directory.
        dir: PathBuf,
        /// What was being done.
        action: String,
        /// The underlying error (in the message, so not also a `source()`: printed once).
        error: std::io::Error,
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
    #[error("buffer {dir}: sled: {error}")]
    Sled {
        /// The buffer directory.
        dir: PathBuf,
        /// The underlying error (in the message, so not also a `source()`).
        error: sled::Error,
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

impl StoreError {
    /// Whether this is a failed read or write of the files (disk full, I/O error, quota, a
    /// sled failure) rather than a refusal or a finding about the data: after one, sled keeps
    /// failing until it is reopened.
    pub fn is_io_failure(&self) -> bool {
        matches!(self, StoreError::Io { .. } | StoreError::Sled { .. })
    }
}

impl StoreError {
    /// The same error, naming `dir` as the buffer directory (a snapshot reports the
    /// original directory, not its private copy).
    pub(super) fn for_dir(self, dir: &Path) -> Self {
        let dir = dir.to_path_buf();
        match self {
            StoreError::Io { action, error, .. } => StoreError::Io { dir, action, error },
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
            StoreError::Sled { error, .. } => StoreError::Sled { dir, error },
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

pub(super) fn classify_open_error(dir: PathBuf, err: sled::Error) -> StoreError {
    match err {
        sled::Error::Io(io) if io.to_string().contains("could not acquire lock") => {
            StoreError::Locked { dir }
        }
        sled::Error::Io(io) => StoreError::Io {
            dir,
            action: "opening the database".into(),
            error: io,
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
pub(super) fn sled_error(dir: &Path, files: &Path, source: sled::Error) -> StoreError {
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
            error: io,
        },
        source => StoreError::Sled {
            dir: dir.to_path_buf(),
            error: source,
        },
    }
}

/// A `CURRENT` file that cannot be read or names no generation.
pub(super) fn current_error(dir: &Path, err: std::io::Error) -> StoreError {
    match err.kind() {
        std::io::ErrorKind::InvalidData => StoreError::Damaged {
            dir: dir.to_path_buf(),
            reason: err.to_string(),
        },
        _ => StoreError::Io {
            dir: dir.to_path_buf(),
            action: format!("reading {}", generation::CURRENT),
            error: err,
        },
    }
}

/// The message of a panic sled raised.
pub(super) fn panic_reason(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("sled panicked on damaged data")
}
