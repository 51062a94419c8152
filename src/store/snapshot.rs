//! Read-only access to a buffer directory for the inspector: a private copy, opened.
//!
//! sled has no read-only mode (recovery may rewrite files), so tools never open the original:
//! they take a shared lock on its database file — which fails while a consumer holds the
//! directory — copy the files into a private temporary directory and open the copy.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::{Buffer, BufferOptions, StoreError, generation};

/// A private, opened copy of a buffer directory. The original is never written.
#[derive(Debug)]
pub struct Snapshot {
    buffer: Buffer,
    // Dropped after the buffer (field order): the copy outlives the open database.
    _copy: tempfile::TempDir,
}

impl Snapshot {
    /// The opened copy.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }
}

impl Buffer {
    /// Opens a read-only snapshot of the buffer in `dir` (see the module docs). `progress`
    /// is called with (bytes copied, bytes in total) while copying.
    ///
    /// Fails with [`StoreError::Locked`] while a consumer holds the directory, and with the
    /// errors of [`Buffer::open_existing`] — naming `dir`, not the copy — for anything that
    /// is not a readable buffer.
    pub fn open_snapshot(
        dir: impl AsRef<Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Snapshot, StoreError> {
        Self::open_snapshot_in(dir, None, progress)
    }

    /// [`Buffer::open_snapshot`] with the private copy under `tmp_dir` (default: the
    /// system's temporary directory). Fails with [`StoreError::NoRoom`] before copying when
    /// that filesystem cannot hold the copy, and with [`StoreError::NotABuffer`] when the
    /// directory holds a symlink or a special file (never followed).
    pub fn open_snapshot_in(
        dir: impl AsRef<Path>,
        tmp_dir: Option<&Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Snapshot, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        check_buffer_dir(&dir)?;
        let io = |action: &str, source| StoreError::Io {
            dir: dir.clone(),
            action: action.into(),
            error: source,
        };
        let current = generation::current(&dir).map_err(|err| super::current_error(&dir, err))?;
        let db_file =
            File::open(current.join("db")).map_err(|e| io("opening the database file", e))?;
        // A consumer holds an exclusive flock on `db` for as long as it has the buffer open.
        // SAFETY: flock on a valid, owned file descriptor; no memory is involved.
        if unsafe { libc::flock(db_file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::EWOULDBLOCK) => StoreError::Locked { dir },
                _ => io("locking the database file", err),
            });
        }
        // A consumer that compacted and switched away from that generation holds the lock
        // of the new one: the lock of a generation no longer current proves nothing.
        if generation::current(&dir).ok().as_ref() != Some(&current) {
            return Err(StoreError::Locked { dir });
        }
        let total = tree_bytes(&dir).map_err(|err| match err {
            TreeError::Io(e) => io("reading the directory", e),
            TreeError::NotAFile(path) => StoreError::NotABuffer {
                dir: dir.clone(),
                reason: format!(
                    "{} is a symlink or a special file; a buffer holds only sled's files",
                    path.display()
                ),
            },
        })?;
        let tmp = tmp_dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let available = super::free_space(&tmp)
            .map_err(|e| io(&format!("measuring the free space in {}", tmp.display()), e))?
            .available;
        // The copy, and room for sled to open it.
        let needed = total.saturating_add(SNAPSHOT_MARGIN);
        if available < needed {
            return Err(StoreError::NoRoom {
                dir,
                tmp,
                needed,
                available,
            });
        }
        let copy = tempfile::Builder::new()
            .prefix("catchup-snapshot-")
            .tempdir_in(&tmp)
            .map_err(|e| io("creating a temporary directory for the snapshot", e))?;
        let mut copied = 0;
        copy_tree(&dir, copy.path(), &mut |bytes| {
            copied += bytes;
            progress(copied, total);
        })
        .map_err(|e| io("copying into the snapshot", e))?;
        drop(db_file); // releases the shared lock
        let buffer = Buffer::open_dir(copy.path().to_path_buf(), BufferOptions::default(), false)
            .map_err(|err| err.for_dir(&dir))?;
        Ok(Snapshot {
            buffer,
            _copy: copy,
        })
    }
}

/// The checks of [`Buffer::open_existing`]: a directory holding sled's files.
pub(crate) fn check_buffer_dir(dir: &Path) -> Result<(), StoreError> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(StoreError::NotABuffer {
                dir: dir.into(),
                reason: "it is not a directory".into(),
            });
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::Missing { dir: dir.into() });
        }
        Err(source) => {
            return Err(StoreError::Io {
                dir: dir.into(),
                action: "reading the directory".into(),
                error: source,
            });
        }
    }
    let current = generation::current(dir).map_err(|err| super::current_error(dir, err))?;
    for file in ["conf", "db"] {
        if !current.join(file).is_file() {
            return Err(StoreError::NotABuffer {
                dir: dir.into(),
                reason: format!("the database file '{file}' is missing"),
            });
        }
    }
    Ok(())
}

/// Room left beyond the copy itself: sled's recovery of the copy may write to it.
const SNAPSHOT_MARGIN: u64 = 16 << 20;

/// Why a directory tree cannot be measured or copied.
enum TreeError {
    Io(std::io::Error),
    /// A symlink, FIFO, socket or device: never followed, read or copied.
    NotAFile(PathBuf),
}

impl From<std::io::Error> for TreeError {
    fn from(err: std::io::Error) -> Self {
        TreeError::Io(err)
    }
}

/// The bytes of the regular files under `dir`; anything else is refused.
fn tree_bytes(dir: &Path) -> Result<u64, TreeError> {
    let mut total: u64 = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_type = entry.file_type()?; // of the entry itself, not a symlink's target
        total = total.saturating_add(if file_type.is_dir() {
            tree_bytes(&entry.path())?
        } else if file_type.is_file() {
            entry.metadata()?.len()
        } else {
            return Err(TreeError::NotAFile(entry.path()));
        });
    }
    Ok(total)
}

fn copy_tree(from: &Path, to: &Path, copied: &mut dyn FnMut(u64)) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target: PathBuf = to.join(entry.file_name());
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            copy_tree(&entry.path(), &target, copied)?;
        } else if file_type.is_file() {
            copied(std::fs::copy(entry.path(), &target)?);
        }
        // Anything else was refused when the tree was measured, under the same lock.
    }
    Ok(())
}

/// Whether the holder of the buffer's lock is an offline tool copying it (a shared lock)
/// rather than a consumer (an exclusive one): only then does a shared probe succeed. A
/// lock released in between also answers yes, which only means trying again.
pub(crate) fn held_by_reader(dir: &Path) -> bool {
    let Ok(current) = generation::current(dir) else {
        return false;
    };
    let Ok(file) = File::open(current.join("db")) else {
        return false;
    };
    // SAFETY: flock on a valid, owned file descriptor; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    true
}

/// Takes an exclusive flock on `file` and keeps it (until `file` is closed): `Ok(false)`
/// while someone else holds it.
pub(crate) fn try_lock_exclusive_held(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a valid, owned file descriptor; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Ok(false),
            _ => Err(err),
        };
    }
    Ok(true)
}

/// Takes and at once releases an exclusive flock on `file`: `Ok(false)` while someone holds
/// it (a consumer's sled has the buffer open).
pub(crate) fn try_lock_exclusive(file: &File) -> std::io::Result<bool> {
    let locked = try_lock_exclusive_held(file)?;
    if locked {
        // SAFETY: flock on a valid, owned file descriptor; no memory is involved.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    }
    Ok(locked)
}
