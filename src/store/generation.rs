//! Which sled database in a buffer directory is the current one.
//!
//! sled never gives disk back while a database lives (a drained buffer kept
//! its peak size), so [`Buffer::compact`](super::Buffer::compact) copies what is buffered
//! into a fresh database — a *generation* — and switches to it. A buffer starts with its
//! database directly in the directory (every buffer of an earlier version is laid out so);
//! after the first compaction it lives in `gen-<n>/`, named by the `CURRENT` file:
//!
//! ```text
//! buffer/CATCHUP_BUFFER       the mark (see Buffer::is_marked)
//! buffer/CURRENT              "gen-3": absent while the database is at the top level
//! buffer/gen-3/{conf,db,...}  sled's files of the current generation
//! ```
//!
//! The switch is one `rename` of a fully written and fsynced `CURRENT`, after the new
//! generation itself is fsynced: a crash or power loss leaves either generation whole.
//! Whatever is not the current generation is left over from an interrupted compaction or
//! from before a switch, and is removed when the buffer is opened.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The file naming the current generation.
pub(crate) const CURRENT: &str = "CURRENT";
const PREFIX: &str = "gen-";

/// Whether `name` is one of sled's files at the top of a database directory.
pub(crate) fn is_sled_file(name: &str) -> bool {
    name == "db" || name == "conf" || name == "blobs" || name.starts_with("snap.")
}

fn generation_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The directory holding the current generation's sled files: `dir` itself, or the
/// `gen-<n>` subdirectory `CURRENT` names. A `CURRENT` naming anything else is an error
/// (`InvalidData`): it was not written by catchup.
pub(crate) fn current(dir: &Path) -> io::Result<PathBuf> {
    match std::fs::read_to_string(dir.join(CURRENT)) {
        Ok(text) => {
            let name = text.trim();
            if generation_number(name).is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{CURRENT} names {name:?}, not a generation (gen-<number>)"),
                ));
            }
            Ok(dir.join(name))
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(dir.to_path_buf()),
        Err(err) => Err(err),
    }
}

/// The name of the generation after `current` (`gen-1` after the top level); `None` after
/// the last number (only a crafted `CURRENT` gets there).
pub(crate) fn next_name(dir: &Path, current: &Path) -> Option<String> {
    let number = if current == dir {
        0
    } else {
        current
            .file_name()
            .and_then(|name| generation_number(&name.to_string_lossy()))?
    };
    Some(format!("{PREFIX}{}", number.checked_add(1)?))
}

/// Makes `name` the current generation: `CURRENT` is written beside, fsynced and renamed
/// over, then the directory is fsynced.
pub(crate) fn switch_to(dir: &Path, name: &str) -> io::Result<()> {
    let staged = dir.join(format!("{CURRENT}.new"));
    File::create(&staged)?.write_all(format!("{name}\n").as_bytes())?;
    super::fsync::sync_path(&staged)?;
    std::fs::rename(&staged, dir.join(CURRENT))?;
    super::fsync::sync_path(dir)
}

/// Removes every generation but `current`: sled's files at the top level when the database
/// lives in a `gen-<n>/`, every other `gen-<n>/`, and a staged `CURRENT.new`. Nothing else
/// in the directory is touched. Returns the bytes freed.
pub(crate) fn remove_stale(dir: &Path, current: &Path) -> io::Result<u64> {
    let mut freed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        let stale = if generation_number(&name).is_some() {
            path != current
        } else if is_sled_file(&name) {
            current != dir
        } else {
            name == format!("{CURRENT}.new")
        };
        if stale {
            freed += allocated_bytes(&path);
            remove(&path)?;
        }
    }
    Ok(freed)
}

/// Removes a file or a whole directory; one already gone is fine.
pub(crate) fn remove(path: &Path) -> io::Result<()> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(err) => Err(err),
    };
    match removed {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Bytes allocated on disk under `path` (blocks, not apparent length: sled's files can be
/// sparse); what cannot be read counts as nothing.
pub(crate) fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.blocks() * 512;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| allocated_bytes(&entry.path()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_level_until_current_names_a_generation() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(current(dir.path()).expect("current"), dir.path());
        assert_eq!(next_name(dir.path(), dir.path()).as_deref(), Some("gen-1"));
        switch_to(dir.path(), "gen-1").expect("switch");
        let gen1 = dir.path().join("gen-1");
        assert_eq!(current(dir.path()).expect("current"), gen1);
        assert_eq!(next_name(dir.path(), &gen1).as_deref(), Some("gen-2"));
        let last = dir.path().join(format!("gen-{}", u64::MAX));
        assert_eq!(next_name(dir.path(), &last), None);
    }

    #[test]
    fn a_current_not_naming_a_generation_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        for text in ["../elsewhere", "gen-", "gen-1/..", "db", ""] {
            std::fs::write(dir.path().join(CURRENT), text).expect("write");
            let err = current(dir.path()).expect_err(text);
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{text}");
        }
    }

    #[test]
    fn stale_generations_go_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let top = dir.path();
        for name in [
            "db",
            "conf",
            "snap.0001",
            "CATCHUP_BUFFER",
            "notes.txt",
            "CURRENT.new",
        ] {
            std::fs::write(top.join(name), b"x").expect("write");
        }
        for name in ["gen-1", "gen-2", "blobs", "other"] {
            std::fs::create_dir(top.join(name)).expect("mkdir");
        }
        switch_to(top, "gen-2").expect("switch");
        remove_stale(top, &top.join("gen-2")).expect("remove");
        let mut left: Vec<String> = std::fs::read_dir(top)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["CATCHUP_BUFFER", "CURRENT", "gen-2", "notes.txt", "other"]
        );

        // At the top level, only other generations are stale.
        let dir = tempfile::tempdir().expect("tempdir");
        let top = dir.path();
        std::fs::write(top.join("db"), b"x").expect("write");
        std::fs::create_dir(top.join("gen-4")).expect("mkdir");
        remove_stale(top, top).expect("remove");
        assert!(top.join("db").exists());
        assert!(!top.join("gen-4").exists());
    }
}
