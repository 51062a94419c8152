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
    /// A fetched batch cannot be decoded by this build of librdkafka: its compression codec
    /// was left out (zstd, unless catchup's `zstd` feature is on — it is by default) or its
    /// format is newer. Nothing after it can be read, so the consumer stops rather than skip
    /// it; nothing processed is lost. Build with the codec and start again.
    #[error(
        "a fetched batch cannot be decoded by this build ({reason}): its compression codec is missing or its record format is newer (zstd needs catchup's `zstd` feature, on by default); nothing after it can be read"
    )]
    Undecodable {
        /// What librdkafka reported.
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
    /// A setting is missing or wrong (in the rdkafka configuration, the [`CatchupConfig`](crate::CatchupConfig)
    /// or the topic names given to `subscribe`): nothing was started with it.
    #[error("configuration: {0}")]
    Config(String),
    /// rdkafka refused the subscription (a pattern it cannot compile, say): `recv` reports it
    /// until the next [`subscribe`](crate::CatchupConsumer::subscribe), which clears it.
    #[error("subscription refused: {reason}")]
    Subscription {
        /// What rdkafka said.
        reason: String,
    },
    /// A task of catchup's own failed while it was `doing` something (it panicked: a bug in
    /// catchup, please report it with the log). Nothing acknowledged is lost.
    #[error("{doing} failed: {reason} (a bug in catchup: please report it with the log)")]
    Internal {
        /// What the task was doing.
        doing: String,
        /// How it failed.
        reason: String,
    },
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

impl Error {
    /// Whether the same consumer can go on after this error. `true` for what the
    /// application can fix or wait out: a missing topic and a refused subscription (subscribe
    /// again), a wrong setting passed to a call, a request that timed out or that the
    /// brokers failed (try again). `false` once the consumer can deliver nothing more:
    /// closed, a failed write to the buffer, refused access, a dead fetcher, a damaged or
    /// unusable buffer — close it and start a new one.
    ///
    /// ```
    /// let missing = catchup::Error::TopicMissing { topic: "orders".into() };
    /// assert!(missing.is_recoverable());
    /// assert!(!catchup::Error::Closed.is_recoverable());
    /// ```
    pub fn is_recoverable(&self) -> bool {
        match self {
            Error::TopicMissing { .. }
            | Error::Subscription { .. }
            | Error::Config(_)
            | Error::Timeout { .. } => true,
            Error::Kafka(kafka) => kafka.is_recoverable(),
            Error::Store(_)
            | Error::BufferFailed { .. }
            | Error::Refused { .. }
            | Error::Undecodable { .. }
            | Error::FetcherDied { .. }
            | Error::Closed
            | Error::Internal { .. } => false,
        }
    }
}

impl Error {
    /// A missing topic or a refused subscription: what the next `subscribe` clears.
    pub(crate) fn is_subscription_error(&self) -> bool {
        matches!(
            self,
            Error::TopicMissing { .. } | Error::Subscription { .. }
        )
    }
}

impl From<crate::engine::Stopped> for Error {
    fn from(stopped: crate::engine::Stopped) -> Self {
        use crate::engine::Stopped;
        match stopped {
            Stopped::TopicMissing(topic) => Error::TopicMissing { topic },
            Stopped::Refused(reason) => Error::Refused { reason },
            Stopped::Undecodable(reason) => Error::Undecodable { reason },
            Stopped::Subscription(reason) => Error::Subscription { reason },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each cause is printed once: an error whose message names its cause gives no
    /// `source()`, so a reporter that walks the chain (anyhow's `{:#}`, tracing-error) does
    /// not print it a second time.
    #[test]
    fn no_error_prints_its_source_twice() {
        let errors = [
            Error::from(StoreError::Io {
                dir: "/buffer".into(),
                action: "creating the directory".into(),
                error: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied"),
            }),
            Error::from(StoreError::Sled {
                dir: "/buffer".into(),
                error: sled::Error::Unsupported("no such thing".into()),
            }),
            Error::from(KafkaError::client(
                "committing",
                rdkafka::error::KafkaError::ConsumerCommit(
                    rdkafka::types::RDKafkaErrorCode::RebalanceInProgress,
                ),
            )),
            Error::from(KafkaError::Spawn {
                thread: "live",
                error: std::io::Error::other("no threads left"),
            }),
        ];
        for error in errors {
            let message = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                assert!(
                    !message.contains(&cause.to_string()),
                    "{message:?} prints its source {cause:?} again"
                );
                source = cause.source();
            }
            // And the cause is in the message, for who prints only that.
            assert!(
                ["denied", "no such thing", "rebalance", "no threads"]
                    .iter()
                    .any(|cause| message.to_lowercase().contains(cause)),
                "{message}"
            );
        }
    }
}
