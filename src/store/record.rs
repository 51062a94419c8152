//! What the buffer stores: Kafka records, grouped into chunks.

use bincode::de::Decoder;
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{Decode, Encode};
pub use bytes::Bytes;

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
///
/// Key and value are reference-counted ([`Bytes`]): the memory tier, the reader and the
/// application share one copy of what was fetched, and cloning a record copies no payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Offset in its partition.
    pub offset: i64,
    /// Timestamp and its type.
    pub timestamp: Timestamp,
    /// Record key; `None` for a null key.
    pub key: Option<Bytes>,
    /// Record value; `None` for a null value (a tombstone).
    pub payload: Option<Bytes>,
    /// Headers in the order the producer wrote them.
    pub headers: Vec<Header>,
}

// Written by hand because bincode knows no `Bytes`: the fields in their order, key and value
// as byte strings — the encoding the derived impl gave `Option<Vec<u8>>` (a unit test holds
// the two to the same bytes), so buffers written before read the same.
impl Encode for Record {
    fn encode<E: Encoder>(&self, encoder: &mut E) -> Result<(), EncodeError> {
        self.offset.encode(encoder)?;
        self.timestamp.encode(encoder)?;
        self.key.as_deref().encode(encoder)?;
        self.payload.as_deref().encode(encoder)?;
        self.headers.encode(encoder)
    }
}

impl<Context> Decode<Context> for Record {
    fn decode<D: Decoder<Context = Context>>(decoder: &mut D) -> Result<Self, DecodeError> {
        Ok(Record {
            offset: Decode::decode(decoder)?,
            timestamp: Decode::decode(decoder)?,
            key: Option::<Vec<u8>>::decode(decoder)?.map(Bytes::from),
            payload: Option::<Vec<u8>>::decode(decoder)?.map(Bytes::from),
            headers: Decode::decode(decoder)?,
        })
    }
}

bincode::impl_borrow_decode!(Record);

impl Record {
    /// Bytes of key, payload and headers: what the user produced.
    pub fn payload_bytes(&self) -> usize {
        let header_bytes: usize = self
            .headers
            .iter()
            .map(|h| h.key.len() + h.value.as_ref().map_or(0, Vec::len))
            .sum();
        self.key.as_ref().map_or(0, Bytes::len)
            + self.payload.as_ref().map_or(0, Bytes::len)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec;

    /// The record as the derived codec wrote it before keys and values were shared.
    #[derive(Debug, PartialEq, Encode, Decode)]
    struct RecordWithVecs {
        offset: i64,
        timestamp: Timestamp,
        key: Option<Vec<u8>>,
        payload: Option<Vec<u8>>,
        headers: Vec<Header>,
    }

    #[test]
    fn a_record_is_stored_in_the_bytes_it_always_was() {
        let cases = [
            (None, None, vec![]),
            (Some(&b""[..]), Some(&b"value"[..]), vec![]),
            (
                Some(&b"key"[..]),
                None,
                vec![Header {
                    key: "h".into(),
                    value: Some(vec![0, 1, 255]),
                }],
            ),
        ];
        for (offset, (key, payload, headers)) in cases.into_iter().enumerate() {
            let old = RecordWithVecs {
                offset: offset as i64 * 1000,
                timestamp: Timestamp::CreateTime(-5),
                key: key.map(<[u8]>::to_vec),
                payload: payload.map(<[u8]>::to_vec),
                headers: headers.clone(),
            };
            let new = Record {
                offset: offset as i64 * 1000,
                timestamp: Timestamp::CreateTime(-5),
                key: key.map(Bytes::copy_from_slice),
                payload: payload.map(Bytes::copy_from_slice),
                headers,
            };
            assert_eq!(codec::encode(&new), codec::encode(&old));
            assert_eq!(codec::decode::<Record>(&codec::encode(&old)), Ok(new));
        }
    }
}
