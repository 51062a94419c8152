//! catchup: Kafka consumers that do not fall behind after a crash.
//!
//! The crate is built up in layers (see the repository's README):
//!
//! * [`store`] — the crash-safe on-disk buffer (sled) both lanes write into.

pub mod plan;
pub mod store;
