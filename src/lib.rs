//! catchup: Kafka consumers that do not fall behind after a crash.
//!
//! When a consumer rejoins its group after a crash, every fresh record normally waits behind
//! the backlog. A [`CatchupConsumer`] splits such a partition at the log end (the
//! *boundary*): the group member fetches fresh records from the boundary on (the **live
//! lane**) while a second consumer fetches the backlog (the **catch-up lane**); both write
//! into a crash-safe sled buffer, from which the application reads in [`Mode::Ordered`]
//! (the backlog, then live — strictly increasing offsets) or [`Mode::Concurrent`] (fresh
//! records first, each lane in order).
//!
//! ```no_run
//! use catchup::{CatchupConfig, CatchupConsumer, Mode};
//! use rdkafka::ClientConfig;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), catchup::Error> {
//!     let mut kafka = ClientConfig::new();
//!     kafka.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "orders-app");
//!     let config = CatchupConfig::new("/var/lib/orders-app/buffer")
//!         .mode(Mode::Concurrent)
//!         .min_lag(10_000);
//!     let consumer = CatchupConsumer::connect(&kafka, config).await?;
//!     consumer.subscribe(&["orders"])?;
//!     loop {
//!         tokio::select! {
//!             delivery = consumer.recv() => {
//!                 let delivery = delivery?;
//!                 println!("{}/{} @{} via {}", delivery.topic, delivery.partition, delivery.offset, delivery.lane.as_str());
//!                 consumer.ack(&delivery); // only acknowledged records are committed
//!             }
//!             _ = tokio::signal::ctrl_c() => break,
//!         }
//!     }
//!     // Commits what was acknowledged, leaves the group and lets go of the buffer.
//!     consumer.close().await
//! }
//! ```
//!
//! The public API is what this page lists: [`CatchupConsumer`] and its vocabulary,
//! [`group_lag`], the errors and the metric names. Inside, the layers are modules
//! (`docs/layout.md` in the repository walks through them); three are reachable but hidden,
//! for the command line and the test harnesses, and are not covered by semver:
//!
//! * `store` — the crash-safe on-disk buffer (sled) both lanes write into;
//! * `plan` — pure decisions: reconciliation on assignment, commits, token formats;
//! * `fetch` — pure decisions of the fetchers: what a poll proves, what to append, when to
//!   reposition, which partitions to pause;
//! * `engine` — the per-partition state the fetchers and the reader share;
//! * `kafka` — rdkafka adapters (live fetcher, catch-up fetcher, side log);
//! * `consumer` — the public API around [`CatchupConsumer`].

#![warn(missing_docs)]

pub mod consumer;
mod engine;
mod error;
// `fetch`, `plan` and `store` are public for the command line, the simulation, the fuzzers
// and the storage tests only: hidden from the docs and outside the semver promise (they may
// change in any release). What the public API needs of them is re-exported below.
#[doc(hidden)]
pub mod fetch;
mod kafka;
#[doc(hidden)]
pub mod plan;
#[doc(hidden)]
pub mod store;

/// The type of a [`Delivery`]'s key and value: shared, cheap to clone, read as `&[u8]`.
pub use bytes::Bytes;
pub use consumer::{
    AckToken, CatchupConfig, CatchupConsumer, ClientHooks, Delivery, DeliveryHeaders, DeliveryLane,
    DiskFloor, Event, Header, Health, LaneBuffer, Mode, PartitionBuffer, PartitionLag, SideStatus,
    Timestamp, TrueLag, group_lag,
};
pub use error::Error;
pub use kafka::KafkaError;
/// The rdkafka this crate is built against: `catchup::rdkafka::ClientConfig` always matches
/// the one [`CatchupConsumer::connect`] takes.
pub use rdkafka;
pub use store::StoreError;

/// The metrics catchup reports through the `metrics` facade (install any recorder, e.g.
/// `metrics-exporter-prometheus`): their names, and the buckets the time-to-fresh histogram
/// is meant to be exported with. Every series carries the consumer's `group`; see
/// `docs/operations.md` for each one's labels and alert rules.
pub mod metrics {
    pub use crate::engine::telemetry::{
        BROKER_ERRORS, BUFFERED_BYTES, COMPACTIONS, LAG_OFFSETS, MERGES, PARTITION_BACKLOG,
        PARTITION_BACKLOG_ETA, PARTITION_LIVE_LAG, PARTITION_LIVE_LAG_SECONDS,
        PARTITIONS_DISCARDED, RECORDS_DELIVERED, RECORDS_FETCHED, SPILLED_BYTES, STALE_STATE,
        TIME_TO_FIRST_FRESH, TIME_TO_FIRST_FRESH_BUCKETS, TRUNCATED_OFFSETS,
    };
}

/// The README's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
