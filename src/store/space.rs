//! What the filesystem holding a buffer reports: the free-space floor is decided on it
//! (`fetch::DiskFloor`).

use std::path::Path;

/// What the filesystem holding the buffer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpace {
    /// Bytes an unprivileged writer may still use.
    pub available: u64,
    /// Size of the filesystem.
    pub total: u64,
}

/// Free (for an unprivileged writer) and total bytes of the filesystem holding `path`.
pub fn free_space(path: &Path) -> std::io::Result<DiskSpace> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a valid C string and `stats` a writable statvfs; on success the call
    // has initialised it.
    let stats = unsafe {
        if libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        stats.assume_init()
    };
    let block = stats.f_frsize as u64;
    Ok(DiskSpace {
        available: (stats.f_bavail as u64).saturating_mul(block),
        total: (stats.f_blocks as u64).saturating_mul(block),
    })
}
