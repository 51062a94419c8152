//! catchup: Kafka consumers that do not fall behind after a crash.
//!
//! The crate is built up in layers (see the repository's README):
//!
//! * [`store`] — the crash-safe on-disk buffer (sled) both lanes write into;
//! * [`plan`] — pure decisions: reconciliation on assignment, commits, token formats;
//! * `kafka` — rdkafka adapters (live fetcher, catch-up fetcher, side log);
//! * [`CatchupConsumer`] — the public API.

pub mod consumer;
mod error;
mod kafka;
pub mod plan;
pub mod store;

pub use consumer::{
    CatchupConfig, CatchupConsumer, Delivery, DeliveryLane, Event, Mode, PartitionBuffer,
};
pub use error::Error;
pub use kafka::KafkaError;
