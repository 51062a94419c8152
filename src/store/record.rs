//! What the buffer stores: Kafka records, grouped into chunks.

use bincode::{Decode, Encode};

/// A record's timestamp, as Kafka reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum Timestamp {
    /// The broker sent no timestamp.
    NotAvailable,
    /// Set by the producer (`message.timestamp.type=CreateTime`).
    CreateTime(i64),
    /// Set by the broker on append (`message.timestamp.type=LogAppendTime`).
    LogAppendTime(i64),
}

/// One record header: a name and an optional value.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Header {
    /// Header name.
    pub key: String,
    /// Header value; `None` is a null value, distinct from an empty one.
    pub value: Option<Vec<u8>>,
}

/// A Kafka record as the buffer keeps it: everything a consumer sees, except the topic and
/// partition, which the buffer's keys carry.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Record {
    /// Offset in its partition.
    pub offset: i64,
    /// Timestamp and its type.
    pub timestamp: Timestamp,
    /// Record key; `None` for a null key.
    pub key: Option<Vec<u8>>,
    /// Record value; `None` for a null value (a tombstone).
    pub payload: Option<Vec<u8>>,
    /// Headers in the order the producer wrote them.
    pub headers: Vec<Header>,
}

impl Record {
    /// Bytes of key, payload and headers: what the user produced.
    pub fn payload_bytes(&self) -> usize {
        let header_bytes: usize = self
            .headers
            .iter()
            .map(|h| h.key.len() + h.value.as_ref().map_or(0, Vec::len))
            .sum();
        self.key.as_ref().map_or(0, Vec::len)
            + self.payload.as_ref().map_or(0, Vec::len)
            + header_bytes
    }
}

/// The stored value of a chunk: the records one fetch returned for one lane of one partition.
///
/// A chunk covers the offsets `[first, next)`, where `first` is in its key. Records inside may
/// leave gaps (compaction, transaction markers); the chunks of a lane cover its fetched range
/// without holes, which is what `verify` checks.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Chunk {
    /// One past the last offset this chunk covers: the fetch position after it.
    pub next: u64,
    /// The records, by strictly increasing offset, all inside `[first, next)`.
    pub records: Vec<Record>,
}

/// The leading fields of a [`Chunk`], decodable without decoding its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Decode)]
pub(crate) struct ChunkHead {
    pub next: u64,
    pub record_count: u64,
}
