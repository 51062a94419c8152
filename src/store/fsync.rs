//! Directory creation and full fsync, which sled 0.34.7 does not do on its own.

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Creates `dir` and its missing parents, owner-only (0700): a buffer holds message payloads.
/// An existing directory is left as it is.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// fsyncs every file under `dir`, every subdirectory, and `dir` itself, so that both the
/// data and the directory entries naming it survive a power loss.
pub(crate) fn sync_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            sync_tree(&entry.path())?;
        } else if file_type.is_file() {
            match File::open(entry.path()) {
                Ok(file) => file.sync_all()?,
                // sled removes segment and blob files concurrently; a vanished file needs no sync.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    File::open(dir)?.sync_all()
}
