//! The split token: what the main log's commit metadata says while a partition is split.
//!
//! Text, small and versioned: `catchup/2 e=<epoch> f=<from> b=<boundary> k=<secret>`, the
//! secret 32 hex digits (see [`SplitSecret`]). Anything else in the metadata — empty, another
//! tool's, a newer version, damaged — decodes as "no token", which reconciliation treats as
//! the safe path (reprocess from the committed offset). Version 1 tokens (no secret) are
//! recognised only to be replaced: their side entries cannot be authenticated.

use std::fmt;

use super::SplitSecret;

const PREFIX: &str = "catchup/2 ";
/// What every catchup token starts with, whatever its version.
const ANY_VERSION: &str = "catchup/";

/// Kafka's limit on commit metadata, which the token must stay far below.
pub const MAX_METADATA_BYTES: usize = 4096;

/// The split a partition is in: its epoch, where catch-up started, the boundary, and the
/// secret that authenticates its side entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitToken {
    /// Increases with every new split of the partition; names the split in events and logs.
    pub epoch: u64,
    /// The committed offset when the split began.
    pub from: i64,
    /// The boundary `B`: the log end when the split began.
    pub boundary: i64,
    /// Chosen at random at the split; a side entry is trusted only with a MAC under it.
    pub secret: SplitSecret,
}

impl fmt::Display for SplitToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}e={} f={} b={} k={}",
            self.epoch,
            self.from,
            self.boundary,
            self.secret.to_hex()
        )
    }
}

impl SplitToken {
    /// The metadata string committed with the offset (well under 4 KiB, UTF-8).
    pub fn encode(&self) -> String {
        self.to_string()
    }

    /// Whether `metadata` is a catchup token of any version, this one or another: a token
    /// this version cannot use is still replaced rather than left in the main log.
    pub fn is_any_version(metadata: &str) -> bool {
        metadata.starts_with(ANY_VERSION)
    }

    /// `metadata` with the value of any `k=` field (the secret) replaced: fit for logs.
    pub fn redacted(metadata: &str) -> String {
        metadata
            .split(' ')
            .map(|field| {
                if field.starts_with("k=") {
                    "k=<redacted>"
                } else {
                    field
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Parses commit metadata; `None` for anything that is not a token of this version.
    pub fn decode(metadata: &str) -> Option<Self> {
        let fields = metadata.strip_prefix(PREFIX)?;
        let mut epoch = None;
        let mut from = None;
        let mut boundary = None;
        let mut secret = None;
        for field in fields.split(' ') {
            let (name, value) = field.split_once('=')?;
            let slot = match name {
                "e" if epoch.is_none() => {
                    epoch = Some(value.parse::<u64>().ok()?);
                    continue;
                }
                "k" if secret.is_none() => {
                    secret = Some(SplitSecret::from_hex(value)?);
                    continue;
                }
                "f" => &mut from,
                "b" => &mut boundary,
                _ => return None,
            };
            if slot.is_some() {
                return None; // a field twice: not ours
            }
            *slot = Some(value.parse::<i64>().ok()?);
        }
        let token = Self {
            epoch: epoch?,
            from: from?,
            boundary: boundary?,
            secret: secret?,
        };
        (token.epoch > 0 && 0 <= token.from && token.from <= token.boundary).then_some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "000102030405060708090a0b0c0d0e0f";

    fn secret() -> SplitSecret {
        SplitSecret::from_bytes([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
    }

    #[test]
    fn round_trips_and_stays_small() {
        let token = SplitToken {
            epoch: u64::MAX,
            from: i64::MAX - 1,
            boundary: i64::MAX,
            secret: secret(),
        };
        let text = token.encode();
        assert!(text.len() < 120 && text.len() < MAX_METADATA_BYTES);
        assert_eq!(SplitToken::decode(&text), Some(token));
        let token = SplitToken {
            epoch: 3,
            from: 70,
            boundary: 120,
            secret: secret(),
        };
        assert_eq!(token.encode(), format!("catchup/2 e=3 f=70 b=120 k={K}"));
        assert_eq!(
            SplitToken::redacted(&token.encode()),
            "catchup/2 e=3 f=70 b=120 k=<redacted>"
        );
        assert!(SplitToken::is_any_version(&token.encode()));
    }

    #[test]
    fn anything_foreign_is_no_token() {
        let foreign = [
            "",
            "catchup/2",
            "catchup/2 ",
            "catchup/2 e=1 f=0 b=5",
            "catchup/2 e=1 f=0 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1 f=0 b=5 k=000102030405060708090a0b0c0d0e0f x=1",
            "catchup/2 e=1 f=0 b=5 b=6 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1 e=2 f=0 b=5 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1 f=0 b=5 k=000102030405060708090a0b0c0d0e0f k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1 f=0 b=5 k=000102030405060708090a0b0c0d0e",
            "catchup/2 e=1 f=0 b=5 k=000102030405060708090a0b0c0d0e0z",
            "catchup/2 e=0 f=0 b=5 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1 f=9 b=5 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1 f=-1 b=5 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=-1 f=0 b=5 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1 f=0 b=99999999999999999999 k=000102030405060708090a0b0c0d0e0f",
            "catchup/2 e=1  f=0 b=5 k=000102030405060708090a0b0c0d0e0f",
            "catchup/3 e=1 f=0 b=5 k=000102030405060708090a0b0c0d0e0f",
            "{\"parallel-consumer\": \"...\"}",
        ];
        for metadata in foreign {
            assert_eq!(SplitToken::decode(metadata), None, "{metadata:?}");
        }
    }

    #[test]
    fn tokens_of_other_versions_are_recognised_but_not_trusted() {
        // Version 1 had no secret: its side entries cannot be authenticated.
        for metadata in ["catchup/1 e=3 f=70 b=120", "catchup/3 anything"] {
            assert!(SplitToken::is_any_version(metadata));
            assert_eq!(SplitToken::decode(metadata), None);
        }
        assert!(!SplitToken::is_any_version(""));
        assert!(!SplitToken::is_any_version("{\"parallel-consumer\": 1}"));
    }
}
