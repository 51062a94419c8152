//! Drives the fetch-layer simulation (`tests/sim/harness.rs`) from the fuzzer's bytes: the
//! first eight are the seed of the whole history (faults, produce, retention, revokes,
//! restarts). A crash prints the seed; `CATCHUP_SIM_SEED=<seed> cargo test --test simulation`
//! replays it without the fuzzer.
//!
//! ```text
//! cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run fetch_sim
//! ```
#![no_main]

#[path = "../../tests/sim/harness.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut seed = [0u8; 8];
    let len = data.len().min(8);
    seed[..len].copy_from_slice(&data[..len]);
    let seed = u64::from_le_bytes(seed);
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let (result, _) = harness::run_seed(seed, dir.path().join("buffer"), None);
    if let Err(failure) = result {
        panic!("seed {seed:#x}: {failure}");
    }
});
