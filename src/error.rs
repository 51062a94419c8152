//! The umbrella error of the public API.

use crate::kafka::KafkaError;
use crate::store::StoreError;

/// Everything that can go wrong in catchup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The buffer directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Kafka or the side topic.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A setting is missing or wrong.
    #[error("configuration: {0}")]
    Config(String),
}
