//! What an error returned by a consumer's `poll` means for the records around it.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// How a fetcher treats an error its consumer's `poll` returned (DESIGN §6: an error is not
/// the end of what was polled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollErrorKind {
    /// The end of a partition (`enable.partition.eof`): nothing is wrong and nothing was
    /// skipped.
    EndOfPartition,
    /// A client-wide condition the client recovers from by itself (a broker connection
    /// dropped, all brokers down for a while, a timeout): no message was skipped; keep
    /// polling.
    Transient,
    /// The fetch offset is out of range (with `auto.offset.reset=error`): retention passed
    /// it, or the log was truncated below it. The partition stops fetching until moved.
    OutOfRange,
    /// Anything else (a corrupt or oversized message, an authorization or unknown-topic
    /// error, a fatal error): the client may have moved past messages, so the chain of proof
    /// ends and fetching resumes from the buffer's position.
    BreaksChain,
}

/// Classifies an error returned by `poll`.
pub fn classify_poll_error(error: &KafkaError) -> PollErrorKind {
    use RDKafkaErrorCode as Code;
    match error {
        KafkaError::PartitionEOF(_) => PollErrorKind::EndOfPartition,
        KafkaError::MessageConsumption(code) => match code {
            Code::PartitionEOF => PollErrorKind::EndOfPartition,
            Code::OffsetOutOfRange | Code::AutoOffsetReset => PollErrorKind::OutOfRange,
            Code::BrokerTransportFailure
            | Code::AllBrokersDown
            | Code::Resolve
            | Code::OperationTimedOut
            | Code::RequestTimedOut
            | Code::PollExceeded
            | Code::NetworkException
            | Code::NotLeaderForPartition
            | Code::LeaderNotAvailable
            | Code::BrokerNotAvailable => PollErrorKind::Transient,
            _ => PollErrorKind::BreaksChain,
        },
        _ => PollErrorKind::BreaksChain,
    }
}

/// A poll error the consumer cannot get past by itself: the application must hear of it
/// (through `recv`), not only a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatalKind {
    /// A subscribed topic is unknown to the cluster (confirm with its metadata: it may be
    /// created a moment later).
    UnknownTopic,
    /// Authentication failed, or access to a topic, the group or the cluster was refused.
    Refused,
    /// A batch this build's librdkafka cannot decode (a compression codec it was built
    /// without: zstd unless the `zstd` feature is on). librdkafka reports it and moves past
    /// the batch; the chain of proof sends the fetcher back to it, round after round, so
    /// polling on never gets past it.
    Undecodable,
}

/// Whether `error` is one the consumer cannot recover from by polling on.
pub fn fatal_kind(error: &KafkaError) -> Option<FatalKind> {
    use RDKafkaErrorCode as Code;
    let (code, fatal) = match error {
        KafkaError::MessageConsumption(code) => (code, false),
        KafkaError::MessageConsumptionFatal(code) => (code, true),
        _ => return None,
    };
    match code {
        Code::UnknownTopicOrPartition | Code::UnknownTopic => Some(FatalKind::UnknownTopic),
        Code::TopicAuthorizationFailed
        | Code::GroupAuthorizationFailed
        | Code::ClusterAuthorizationFailed => Some(FatalKind::Refused),
        // librdkafka retries a failed authentication by itself (one broker mid-rotation, a
        // token refresh racing): final only when it says so.
        Code::SaslAuthenticationFailed | Code::Authentication if fatal => Some(FatalKind::Refused),
        Code::NotImplemented => Some(FatalKind::Undecodable),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        use RDKafkaErrorCode as Code;
        let cases = [
            (KafkaError::PartitionEOF(3), PollErrorKind::EndOfPartition),
            (
                KafkaError::MessageConsumption(Code::BrokerTransportFailure),
                PollErrorKind::Transient,
            ),
            (
                KafkaError::MessageConsumption(Code::AllBrokersDown),
                PollErrorKind::Transient,
            ),
            (
                KafkaError::MessageConsumption(Code::AutoOffsetReset),
                PollErrorKind::OutOfRange,
            ),
            (
                KafkaError::MessageConsumption(Code::OffsetOutOfRange),
                PollErrorKind::OutOfRange,
            ),
            (
                KafkaError::MessageConsumption(Code::BadMessage),
                PollErrorKind::BreaksChain,
            ),
            (
                KafkaError::MessageConsumption(Code::TopicAuthorizationFailed),
                PollErrorKind::BreaksChain,
            ),
            (
                KafkaError::MessageConsumptionFatal(Code::Fatal),
                PollErrorKind::BreaksChain,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(classify_poll_error(&error), kind, "{error}");
        }
    }

    #[test]
    fn fatal_table() {
        use RDKafkaErrorCode as Code;
        let cases = [
            (KafkaError::PartitionEOF(3), None),
            (
                KafkaError::MessageConsumption(Code::UnknownTopicOrPartition),
                Some(FatalKind::UnknownTopic),
            ),
            (
                KafkaError::MessageConsumption(Code::UnknownTopic),
                Some(FatalKind::UnknownTopic),
            ),
            (
                KafkaError::MessageConsumption(Code::TopicAuthorizationFailed),
                Some(FatalKind::Refused),
            ),
            (
                KafkaError::MessageConsumption(Code::GroupAuthorizationFailed),
                Some(FatalKind::Refused),
            ),
            (
                KafkaError::MessageConsumptionFatal(Code::SaslAuthenticationFailed),
                Some(FatalKind::Refused),
            ),
            (KafkaError::MessageConsumption(Code::Authentication), None),
            (
                KafkaError::MessageConsumption(Code::SaslAuthenticationFailed),
                None,
            ),
            (KafkaError::MessageConsumption(Code::AllBrokersDown), None),
            (KafkaError::MessageConsumption(Code::BadMessage), None),
            (KafkaError::MessageConsumption(Code::OffsetOutOfRange), None),
            // A codec this build lacks: the same batch again each round.
            (
                KafkaError::MessageConsumption(Code::NotImplemented),
                Some(FatalKind::Undecodable),
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(fatal_kind(&error), kind, "{error}");
        }
    }
}
