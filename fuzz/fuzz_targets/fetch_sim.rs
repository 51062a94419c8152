//! Drives the fetch-layer simulation (`tests/sim/harness.rs`) from the fuzzer's bytes: the
//! first eight are a seed, every later byte a choice of the history (faults, produce,
//! retention, revokes, restarts, which fetcher polls, what the client answers), so coverage
//! steers the decisions themselves. Histories are short (10 to 60 faulty steps over logs of
//! under 60 entries) and share one buffer database, in memory where `/dev/shm` exists.
//! `cargo test --test simulation fuzz_corpus_replays` replays the corpus (and a crash input
//! put there) without the fuzzer.
//!
//! ```text
//! cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run fetch_sim
//! ```
#![no_main]

#[path = "../../tests/sim/harness.rs"]
mod harness;

use std::sync::Mutex;

use catchup::store::{Buffer, BufferOptions};
use libfuzzer_sys::fuzz_target;

/// The buffer directory and the open buffer, shared by every input.
static SHARED: Mutex<Option<(tempfile::TempDir, Option<Buffer>)>> = Mutex::new(None);

fn scratch_dir() -> Option<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return Some(dir);
        }
    }
    tempfile::tempdir().ok()
}

fuzz_target!(|input: &[u8]| {
    let mut shared = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if shared.is_none() {
        *shared = scratch_dir().map(|dir| (dir, None));
    }
    let Some((dir, buffer)) = shared.as_mut() else {
        return;
    };
    let path = dir.path().join("buffer");
    if buffer.is_none() {
        // Nothing here needs durability: no periodic flush, and the largest log segments
        // (sled hands each full one to its writer thread).
        let options = BufferOptions {
            flush_every_ms: None,
            segment_bytes: 16 << 20,
            ..BufferOptions::default()
        };
        *buffer = Buffer::open(&path, options).ok();
    }
    let (result, returned) = harness::run_input(input, path, buffer.take());
    *buffer = returned;
    if let Err(failure) = result {
        panic!("{failure}");
    }
});
