//! The value format of the buffer: one version byte, a CRC32C, then a bincode 2 body.
//!
//! ```text
//! +---------+----------+---------------------------+
//! | version | crc32c   | bincode body (standard,   |
//! | u8 = 1  | u32 LE   | varint, little endian)    |
//! +---------+----------+---------------------------+
//! ```
//!
//! The checksum covers the version byte and the body, so a flipped version byte is caught as
//! damage rather than read as "a newer format". bincode is pinned and unmaintained; the
//! version byte is what lets a later release switch codecs without a migration tool.

use bincode::{Decode, Encode};

/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u8 = 1;

const HEADER_LEN: usize = 5;

/// The most bytes one decode may claim: above any chunk `append` stores (it refuses a
/// larger one) and above any record librdkafka can hand out (`receive.message.max.bytes` is
/// at most 1,000,000,000). It bounds what a length prefix can make us allocate — one that
/// passed the checksum, so written that way (the limit was once 64 MiB, and a
/// larger record, possible with a raised `message.max.bytes`, encoded but never decoded).
pub const DECODE_LIMIT: usize = 1 << 30;

/// bincode 2 with a fixed configuration.
fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<DECODE_LIMIT>()
}

/// Why a stored value could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The value is shorter than its header.
    #[error("value is {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    Truncated {
        /// Length of the value found.
        len: usize,
    },
    /// The checksum does not match: the bytes were damaged on disk.
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        /// The checksum stored in the header.
        stored: u32,
        /// The checksum of the bytes found.
        computed: u32,
    },
    /// Written by a newer catchup; this build cannot read it.
    #[error("format version {found} is newer than the supported version {FORMAT_VERSION}")]
    NewerVersion {
        /// The version byte found.
        found: u8,
    },
    /// The version byte is one no release ever wrote.
    #[error("unknown format version {found}")]
    UnknownVersion {
        /// The version byte found.
        found: u8,
    },
    /// The checksum holds but the body does not decode as the expected type.
    #[error("body does not decode: {0}")]
    Body(String),
}

/// Encodes `value` as version byte + CRC32C + bincode body.
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_into(value, &mut out);
    out
}

/// Encodes into `out` (cleared first), reusing its allocation.
pub fn encode_into<T: Encode>(value: &T, out: &mut Vec<u8>) {
    out.clear();
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&[0; 4]);
    // Writing into a Vec cannot fail, and every type we encode is plain data.
    if let Err(err) = bincode::encode_into_std_write(value, out, config()) {
        // Unreachable in practice; keep the value decodable-as-damaged instead of panicking.
        tracing::error!(%err, "bincode failed to encode a buffer value");
    }
    let crc = checksum(out);
    out[1..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

fn checksum(value: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&value[..1]);
    crc32c::crc32c_append(crc, &value[HEADER_LEN..])
}

/// Checks the header and the checksum; returns the body.
fn checked_body(value: &[u8]) -> Result<&[u8], CodecError> {
    if value.len() < HEADER_LEN {
        return Err(CodecError::Truncated { len: value.len() });
    }
    let mut stored = [0; 4];
    stored.copy_from_slice(&value[1..HEADER_LEN]);
    let stored = u32::from_le_bytes(stored);
    let computed = checksum(value);
    if stored != computed {
        return Err(CodecError::Checksum { stored, computed });
    }
    match value[0] {
        FORMAT_VERSION => Ok(&value[HEADER_LEN..]),
        found if found > FORMAT_VERSION => Err(CodecError::NewerVersion { found }),
        found => Err(CodecError::UnknownVersion { found }),
    }
}

/// Checks the header and checksum and decodes the whole body.
pub fn decode<T: Decode<()>>(value: &[u8]) -> Result<T, CodecError> {
    let body = checked_body(value)?;
    let (decoded, used) = bincode::decode_from_slice(body, config())
        .map_err(|err| CodecError::Body(err.to_string()))?;
    if used != body.len() {
        return Err(CodecError::Body(format!(
            "{} trailing bytes after the body",
            body.len() - used
        )));
    }
    Ok(decoded)
}

/// Checks the header and checksum and decodes only the leading fields of the body (a type
/// whose fields are a prefix of the stored type's), leaving the rest unread.
pub fn decode_prefix<T: Decode<()>>(value: &[u8]) -> Result<T, CodecError> {
    let body = checked_body(value)?;
    bincode::decode_from_slice(body, config())
        .map(|(decoded, _)| decoded)
        .map_err(|err| CodecError::Body(err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Encode, Decode, Debug, PartialEq)]
    struct Sample {
        offset: i64,
        payload: Option<Vec<u8>>,
    }

    fn sample() -> Sample {
        Sample {
            offset: 70,
            payload: Some(b"hello".to_vec()),
        }
    }

    #[test]
    fn round_trips() {
        let bytes = encode(&sample());
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<Sample>(&bytes), Ok(sample()));
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let bytes = encode(&sample());
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode::<Sample>(&damaged).is_err(),
                "bit {bit} flip went unnoticed"
            );
        }
    }

    #[test]
    fn truncation_is_an_error() {
        let bytes = encode(&sample());
        for len in 0..bytes.len() {
            assert!(
                decode::<Sample>(&bytes[..len]).is_err(),
                "truncated to {len} decoded"
            );
        }
    }

    #[test]
    fn newer_version_is_reported_as_such() {
        let mut bytes = encode(&sample());
        bytes[0] = FORMAT_VERSION + 1;
        let crc = checksum(&bytes);
        bytes[1..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode::<Sample>(&bytes),
            Err(CodecError::NewerVersion {
                found: FORMAT_VERSION + 1
            })
        );
    }

    #[test]
    fn a_value_above_64_mib_decodes() {
        let large = Sample {
            offset: 1,
            payload: Some(vec![7; 65 << 20]),
        };
        assert_eq!(decode::<Sample>(&encode(&large)), Ok(large));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&sample());
        bytes.push(0);
        let crc = checksum(&bytes);
        bytes[1..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode::<Sample>(&bytes), Err(CodecError::Body(_))));
    }
}
