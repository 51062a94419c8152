//! Drives the buffer's model test from the fuzzer's bytes: 4 bytes per operation (append,
//! read, commit, discard, reset, sync, crash, reopen), checked against the in-memory model.
//!
//! ```text
//! cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run buffer_model
//! ```
#![no_main]

#[path = "../../storage-tests/model_harness.rs"]
mod model_harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Long inputs add little and slow the fuzzer down: each op touches the disk.
    let ops = model_harness::ops_from_bytes(&data[..data.len().min(400)]);
    if let Err(problem) = model_harness::Harness::run(&ops) {
        panic!("{problem}");
    }
});
