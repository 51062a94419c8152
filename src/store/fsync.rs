//! Directory creation and full fsync, which sled 0.34.7 does not do on its own.

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

#[cfg(test)]
thread_local! {
    /// Every path fsynced on this thread, in order: what the tests hold `sync`, compaction and
    /// the untrusted mark to.
    pub(crate) static SYNCED: std::cell::RefCell<Vec<std::path::PathBuf>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// fsyncs the file or directory at `path` (data, and for a directory its entries). Every
/// fsync of the buffer goes through here.
pub(crate) fn sync_path(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()?;
    #[cfg(test)]
    SYNCED.with(|synced| synced.borrow_mut().push(path.to_path_buf()));
    Ok(())
}

/// Creates `dir` and its missing parents, owner-only (0700): a buffer holds message payloads.
/// An existing directory is left as it is. The parent of each directory created is fsynced,
/// so the new directory's entry survives a power loss.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        sync_path(parent)?;
    }
    Ok(())
}

/// fsyncs every file under `dir`, every subdirectory, and `dir` itself, so that both the
/// data and the directory entries naming it survive a power loss. Subdirectories (sled's
/// `blobs/`) go first and sled's log `db` last, so the log never becomes durable before
/// the blob files it points to. Callers must treat an error as final for
/// the handle: after a failed fsync the kernel may have dropped the dirty pages, and a retry
/// can succeed without them.
pub(crate) fn sync_tree(dir: &Path) -> io::Result<()> {
    let mut entries = std::fs::read_dir(dir)?.collect::<io::Result<Vec<_>>>()?;
    entries.sort_by_key(|entry| {
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        (!is_dir, entry.file_name() == "db")
    });
    for entry in entries {
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            sync_tree(&entry.path())?;
        } else if file_type.is_file() {
            match sync_path(&entry.path()) {
                Ok(()) => {}
                // sled removes segment and blob files concurrently; a vanished file needs no sync.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    sync_path(dir)
}
