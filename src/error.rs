//! The umbrella error of the public API.

use std::time::Duration;

use crate::kafka::KafkaError;
use crate::store::StoreError;

/// Everything that can go wrong in catchup. New variants may come in minor versions: match
/// with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Kafka or the side topic.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A write to the buffer failed (disk full, I/O error, quota): the consumer stopped
    /// fetching. Nothing acknowledged is lost and nothing unprocessed was committed; close
    /// this consumer and start a new one in a new process once the disk is usable — it
    /// resumes from Kafka. (sled cannot be reopened reliably in the same process after such
    /// a failure: its flush may block for good, holding the directory's lock.)
    #[error(
        "buffer {dir} can no longer be written: {reason}; nothing processed is lost — close the consumer and start a new process once the disk is usable (it resumes from Kafka)"
    )]
    BufferFailed {
        /// The buffer directory.
        dir: std::path::PathBuf,
        /// The write that failed.
        reason: String,
    },
    /// A topic the consumer subscribed to does not exist (the cluster confirmed it): the
    /// consumer stops delivering. Create the topic (or fix the name) and subscribe again.
    #[error("topic {topic} does not exist")]
    TopicMissing {
        /// The topic.
        topic: String,
    },
    /// The cluster refused the consumer: authentication kept failing for 10 s with no
    /// request getting through (credentials refused, or no OAUTHBEARER token to be had —
    /// librdkafka would retry for ever), or access to a topic, the group or the cluster was
    /// denied. Fix the credentials or ACLs and start again.
    #[error("the cluster refused access: {reason}")]
    Refused {
        /// What the client reported.
        reason: String,
    },
    /// A fetcher thread stopped unexpectedly (a bug in catchup: please report it with the
    /// log). Nothing acknowledged is lost and nothing unprocessed was committed; close the
    /// consumer and start it again — it resumes from the buffer and Kafka.
    #[error(
        "the {fetcher} fetcher stopped unexpectedly ({reason}); nothing processed is lost — close the consumer and start it again"
    )]
    FetcherDied {
        /// `live` or `catch-up`.
        fetcher: &'static str,
        /// What stopped it.
        reason: String,
    },
    /// The consumer was closed ([`CatchupConsumer::close`](crate::CatchupConsumer::close)).
    #[error("the consumer was closed")]
    Closed,
    /// A setting is missing or wrong — a subscription rdkafka refused among them, reported by
    /// `recv` until the next `subscribe`.
    #[error("configuration: {0}")]
    Config(String),
    /// A request to the consumer's threads (a commit, the backlog, closing) did not finish
    /// in time: the brokers may be unreachable. Nothing was lost; a commit may still land.
    #[error("{what} did not finish within {} s (are the brokers reachable?)", .after.as_secs())]
    Timeout {
        /// What did not finish.
        what: String,
        /// How long it was given.
        after: Duration,
    },
}

impl From<crate::engine::Stopped> for Error {
    fn from(stopped: crate::engine::Stopped) -> Self {
        use crate::engine::Stopped;
        match stopped {
            Stopped::TopicMissing(topic) => Error::TopicMissing { topic },
            Stopped::Refused(reason) => Error::Refused { reason },
            Stopped::Subscription(reason) => Error::Config(reason),
            Stopped::FetcherDied { fetcher, reason } => Error::FetcherDied { fetcher, reason },
        }
    }
}

impl From<crate::engine::BufferFailure> for Error {
    fn from(failure: crate::engine::BufferFailure) -> Self {
        Error::BufferFailed {
            dir: failure.dir,
            reason: failure.reason,
        }
    }
}
