//! rdkafka adapters: the live fetcher (the group member, with its rebalance context), the
//! catch-up fetcher, and the side log. Thin I/O around the decisions in [`crate::plan`].

mod arena;
mod budget;
mod cached_watermarks;
mod catchup_fetcher;
mod context;
mod fetch_queues;
mod ffi;
mod group_offsets;
mod live;
mod offset_commit;
mod positions;
mod prefetch;
mod queue_batch;
mod raw_message;
mod rebootstrap;
mod side_log;
mod side_reader;
mod topic_id;
mod wakeup;
mod watermarks;

pub(crate) use crate::engine::BrokerHealth;
pub(crate) use budget::Budget;
pub(crate) use catchup_fetcher::{CatchupCommand, CatchupFetcher};
pub(crate) use context::{
    RoleContext, check_token_settings, create_consumer, for_role, tokens_from_hooks,
};
pub(crate) use group_offsets::committed_partitions;
pub(crate) use live::{LiveCommand, LiveFetcher, Reply};
pub(crate) use offset_commit::commit_each;
pub(crate) use rebootstrap::Rebootstrap;
pub(crate) use side_log::{SideLog, for_other_consumers};
pub(crate) use side_reader::read_side_entries;

use rdkafka::message::BorrowedMessage;

use bytes::Bytes;

use crate::store::Record;
pub(crate) use positions::Positions;
pub(crate) use queue_batch::Taken;
use raw_message::RawMessage;

/// Errors of the Kafka layer, with what was being done. New variants may come in minor
/// versions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// A client call failed.
    #[error("Kafka: {action}: {error}")]
    Client {
        /// What was being done.
        action: String,
        /// rdkafka's error (in the message, so not also a `source()`: printed once).
        error: rdkafka::error::KafkaError,
    },
    /// The side topic cannot be created, read or written.
    #[error("side topic {topic}: {reason}")]
    SideLog {
        /// The side topic.
        topic: String,
        /// What went wrong.
        reason: String,
    },
    /// A background thread is gone.
    #[error("the {0} thread has stopped")]
    Stopped(&'static str),
    /// A thread of the consumer could not be started.
    #[error("cannot start the {thread} thread: {error}")]
    Spawn {
        /// Which one.
        thread: &'static str,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// The assignment of a partition could not be carried out: what went wrong.
    #[error("{0}")]
    Assignment(String),
    /// A request made through librdkafka's admin API failed.
    #[error("Kafka: {action}: {reason}")]
    Request {
        /// What was being done.
        action: String,
        /// What librdkafka said.
        reason: String,
    },
}

impl KafkaError {
    /// Whether the consumer goes on after it: a request that failed can be made again; a
    /// thread that is gone or could not start cannot.
    ///
    /// ```
    /// assert!(!catchup::KafkaError::Stopped("live fetcher").is_recoverable());
    /// ```
    pub fn is_recoverable(&self) -> bool {
        !matches!(self, KafkaError::Stopped(_) | KafkaError::Spawn { .. })
    }

    pub(crate) fn client(action: &str, source: rdkafka::error::KafkaError) -> Self {
        KafkaError::Client {
            action: action.to_owned(),
            error: source,
        }
    }

    pub(crate) fn side(topic: &str, reason: String) -> Self {
        KafkaError::SideLog {
            topic: topic.to_owned(),
            reason,
        }
    }
}

/// The name of `message`'s topic as bytes. `Message::topic` checks the name is UTF-8 on
/// every call (3 % of the group member's thread at full speed, called up to three times a
/// record); runs of a partition only compare names.
pub(crate) fn topic_bytes<'a>(message: &'a BorrowedMessage<'_>) -> &'a [u8] {
    // SAFETY: a message holds a reference on its topic handle, and the handle's name is a
    // NUL-terminated string that lives as long as the handle (rust-rdkafka's `topic()` reads
    // it the same way).
    unsafe { std::ffi::CStr::from_ptr(rdkafka::bindings::rd_kafka_topic_name(message.topic_ptr())) }
        .to_bytes()
}

/// The buffer's copy of a message polled alone (its key and value a run of their own).
pub(crate) fn to_record(message: &BorrowedMessage<'_>) -> Record {
    let message = RawMessage::of(message);
    let [key, payload] = arena::copy_record([message.key(), message.payload()]);
    record_of(&message, key, payload)
}

/// The buffer's copy of `message`, with its `key` and `payload` already copied. Read from
/// librdkafka directly: rust-rdkafka's header reader panics on a header name that is not
/// UTF-8.
fn record_of(message: &RawMessage<'_>, key: Option<Bytes>, payload: Option<Bytes>) -> Record {
    Record {
        offset: message.offset(),
        timestamp: message.timestamp(),
        key,
        payload,
        headers: message.headers(),
    }
}
