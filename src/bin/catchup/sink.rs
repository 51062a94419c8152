//! The file sink of `catchup run`: processed records as JSON lines in a file, fsynced before
//! they are acknowledged, or on stdout.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use catchup::Delivery;

use crate::Failure;
use crate::schema::RecordLine;

/// What the sink gathers before a write to its file: a batch of 500 lines of 1 KiB values
/// in three writes (the default 8 KiB made one system call per seven lines).
const WRITE_BUFFER_BYTES: usize = 256 << 10;

/// Appends processed records as JSON lines; durable before they are acknowledged.
pub struct Sink {
    path: PathBuf,
    writer: BufWriter<SinkTarget>,
}

/// Where the sink writes: a file, fsynced at every sync point, or stdout (`-`), where an
/// fsync means nothing (a pipe or a terminal refuses it): flushed only.
enum SinkTarget {
    File(File),
    Stdout(std::io::Stdout),
}

impl Write for SinkTarget {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            SinkTarget::File(file) => file.write(bytes),
            SinkTarget::Stdout(stdout) => stdout.write(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            SinkTarget::File(file) => file.flush(),
            SinkTarget::Stdout(stdout) => stdout.flush(),
        }
    }
}

impl Sink {
    pub fn open(path: PathBuf) -> Result<Self, Failure> {
        let target = if path.as_os_str() == "-" {
            SinkTarget::Stdout(std::io::stdout())
        } else {
            SinkTarget::File(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| {
                        Failure::Usage(format!("cannot open the sink {}: {e}", path.display()))
                    })?,
            )
        };
        Ok(Self {
            path,
            writer: BufWriter::with_capacity(WRITE_BUFFER_BYTES, target),
        })
    }

    /// Appends `delivery`'s line.
    pub fn write(&mut self, delivery: &Delivery, processed_at_ms: u128) -> Result<(), Failure> {
        RecordLine::processed(delivery, processed_at_ms)
            .write_to(&mut self.writer)
            .and_then(|()| self.writer.write_all(b"\n"))
            .map_err(|e| self.error(e))
    }

    /// Flushes and fsyncs: everything written so far survives a crash (stdout: flushed).
    pub fn sync(&mut self) -> Result<(), Failure> {
        self.writer.flush().map_err(|e| self.error(e))?;
        match self.writer.get_ref() {
            SinkTarget::File(file) => file.sync_data().map_err(|e| self.error(e)),
            SinkTarget::Stdout(_) => Ok(()),
        }
    }

    fn error(&self, err: std::io::Error) -> Failure {
        Failure::Runtime(format!("writing the sink {}: {err}", self.path.display()))
    }
}
