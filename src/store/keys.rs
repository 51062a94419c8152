//! Key layout of the buffer's single sled tree.
//!
//! Every key starts with a one-byte kind, then big-endian integers, so sled's byte order is
//! the order we read in: a range scan over one (lane, topic, partition) prefix walks the
//! chunks of that partition by increasing first offset.
//!
//! | kind | rest                                  | value                |
//! |------|---------------------------------------|----------------------|
//! | `M`  | —                                     | buffer metadata      |
//! | `T`  | topic name (UTF-8)                    | topic id             |
//! | `I`  | topic name (UTF-8)                    | Kafka's topic id (the incarnation) |
//! | `S`  | topic id u32, partition u32           | partition state      |
//! | `C`  | topic id u32, partition u32, first u64 | catch-up lane chunk |
//! | `L`  | topic id u32, partition u32, first u64 | live lane chunk     |

use super::Lane;

pub(crate) const META: &[u8] = b"M";
const TOPIC: u8 = b'T';
const INCARNATION: u8 = b'I';
const STATE: u8 = b'S';
/// The first byte of every key that is not a chunk's: the small entries `verify` reads
/// before it walks the chunks.
pub(crate) const NON_CHUNK_KINDS: [u8; 4] = [META[0], TOPIC, INCARNATION, STATE];
const CATCHUP: u8 = b'C';
const LIVE: u8 = b'L';

/// A partition inside the buffer: the topic's buffer-local id and the partition number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PartitionKey {
    pub topic_id: u32,
    pub partition: u32,
}

pub(crate) fn topic(name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + name.len());
    key.push(TOPIC);
    key.extend_from_slice(name.as_bytes());
    key
}

/// The key of `topic`'s incarnation: the topic id Kafka gave it.
pub(crate) fn incarnation(name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + name.len());
    key.push(INCARNATION);
    key.extend_from_slice(name.as_bytes());
    key
}

pub(crate) fn topic_prefix() -> [u8; 1] {
    [TOPIC]
}

pub(crate) fn state(part: PartitionKey) -> [u8; 9] {
    let mut key = [0; 9];
    key[0] = STATE;
    key[1..5].copy_from_slice(&part.topic_id.to_be_bytes());
    key[5..9].copy_from_slice(&part.partition.to_be_bytes());
    key
}

pub(crate) fn state_prefix() -> [u8; 1] {
    [STATE]
}

/// The prefixes every key of one topic id starts with, in the kinds that carry one:
/// partition states and the chunks of both lanes.
pub(crate) fn topic_id_prefixes(topic_id: u32) -> [[u8; 5]; 3] {
    [STATE, CATCHUP, LIVE].map(|kind| {
        let mut prefix = [0; 5];
        prefix[0] = kind;
        prefix[1..5].copy_from_slice(&topic_id.to_be_bytes());
        prefix
    })
}

fn lane_byte(lane: Lane) -> u8 {
    match lane {
        Lane::Catchup => CATCHUP,
        Lane::Live => LIVE,
    }
}

/// The prefix shared by every chunk of one lane of one partition.
pub(crate) fn chunk_prefix(lane: Lane, part: PartitionKey) -> [u8; 9] {
    let mut key = [0; 9];
    key[0] = lane_byte(lane);
    key[1..5].copy_from_slice(&part.topic_id.to_be_bytes());
    key[5..9].copy_from_slice(&part.partition.to_be_bytes());
    key
}

/// The key of the chunk whose first offset is `first` (offsets are never negative).
pub(crate) fn chunk(lane: Lane, part: PartitionKey, first: u64) -> [u8; 17] {
    let mut key = [0; 17];
    key[..9].copy_from_slice(&chunk_prefix(lane, part));
    key[9..].copy_from_slice(&first.to_be_bytes());
    key
}

/// The first offset of a chunk key.
pub(crate) fn chunk_first(key: &[u8]) -> Option<u64> {
    match parse(key)? {
        ParsedKey::Chunk(_, _, first) => Some(first),
        _ => None,
    }
}

/// What a raw key is, for verification and the inspector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParsedKey {
    Meta,
    Topic(String),
    Incarnation(String),
    State(PartitionKey),
    Chunk(Lane, PartitionKey, u64),
}

/// Parses a key; `None` for anything this build never writes.
pub(crate) fn parse(key: &[u8]) -> Option<ParsedKey> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(key.get(at..at + 4)?.try_into().ok()?))
    };
    match *key.first()? {
        b'M' if key.len() == 1 => Some(ParsedKey::Meta),
        TOPIC => std::str::from_utf8(&key[1..])
            .ok()
            .map(|name| ParsedKey::Topic(name.to_owned())),
        INCARNATION => std::str::from_utf8(&key[1..])
            .ok()
            .map(|name| ParsedKey::Incarnation(name.to_owned())),
        STATE if key.len() == 9 => Some(ParsedKey::State(PartitionKey {
            topic_id: u32_at(1)?,
            partition: u32_at(5)?,
        })),
        kind @ (CATCHUP | LIVE) if key.len() == 17 => {
            let lane = if kind == CATCHUP {
                Lane::Catchup
            } else {
                Lane::Live
            };
            let part = PartitionKey {
                topic_id: u32_at(1)?,
                partition: u32_at(5)?,
            };
            let first = u64::from_be_bytes(key[9..17].try_into().ok()?);
            Some(ParsedKey::Chunk(lane, part, first))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_keys_sort_by_partition_then_offset() {
        let p = |topic_id, partition| PartitionKey {
            topic_id,
            partition,
        };
        let mut keys = [
            chunk(Lane::Live, p(1, 0), 5),
            chunk(Lane::Catchup, p(1, 1), 0),
            chunk(Lane::Catchup, p(1, 0), 256),
            chunk(Lane::Catchup, p(1, 0), 2),
            chunk(Lane::Catchup, p(0, 7), u64::MAX),
        ];
        keys.sort();
        let parsed: Vec<_> = keys.iter().map(|k| parse(k)).collect();
        assert_eq!(
            parsed,
            vec![
                Some(ParsedKey::Chunk(Lane::Catchup, p(0, 7), u64::MAX)),
                Some(ParsedKey::Chunk(Lane::Catchup, p(1, 0), 2)),
                Some(ParsedKey::Chunk(Lane::Catchup, p(1, 0), 256)),
                Some(ParsedKey::Chunk(Lane::Catchup, p(1, 1), 0)),
                Some(ParsedKey::Chunk(Lane::Live, p(1, 0), 5)),
            ]
        );
    }

    #[test]
    fn parse_round_trips_and_rejects_foreign_keys() {
        let part = PartitionKey {
            topic_id: 3,
            partition: 9,
        };
        assert_eq!(parse(&state(part)), Some(ParsedKey::State(part)));
        assert_eq!(
            parse(&topic("orders")),
            Some(ParsedKey::Topic("orders".into()))
        );
        assert_eq!(parse(META), Some(ParsedKey::Meta));
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"S\x00"), None);
        assert_eq!(parse(b"Cshort"), None);
        assert_eq!(parse(b"Z123"), None);
    }
}
