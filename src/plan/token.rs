//! The split token: what the main log's commit metadata says while a partition is split.
//!
//! Text, small and versioned: `catchup/1 e=<epoch> f=<from> b=<boundary>`. Anything else in
//! the metadata — empty, another tool's, a newer version, damaged — decodes as "no token",
//! which reconciliation treats as the safe path (reprocess from the committed offset).

use std::fmt;

const PREFIX: &str = "catchup/1 ";

/// Kafka's limit on commit metadata, which the token must stay far below.
pub const MAX_METADATA_BYTES: usize = 4096;

/// The split a partition is in: its epoch, where catch-up started and the boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitToken {
    /// Increases with every new split of the partition; ties the token to its side entry.
    pub epoch: u64,
    /// The committed offset when the split began.
    pub from: i64,
    /// The boundary `B`: the log end when the split began.
    pub boundary: i64,
}

impl fmt::Display for SplitToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}e={} f={} b={}",
            self.epoch, self.from, self.boundary
        )
    }
}

impl SplitToken {
    /// The metadata string committed with the offset (well under 4 KiB, UTF-8).
    pub fn encode(&self) -> String {
        self.to_string()
    }

    /// Parses commit metadata; `None` for anything that is not a token of this version.
    pub fn decode(metadata: &str) -> Option<Self> {
        let fields = metadata.strip_prefix(PREFIX)?;
        let mut epoch = None;
        let mut from = None;
        let mut boundary = None;
        for field in fields.split(' ') {
            let (name, value) = field.split_once('=')?;
            let slot = match name {
                "e" => {
                    epoch = Some(value.parse::<u64>().ok()?);
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
        };
        (token.epoch > 0 && 0 <= token.from && token.from <= token.boundary).then_some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_stays_small() {
        let token = SplitToken {
            epoch: u64::MAX,
            from: i64::MAX - 1,
            boundary: i64::MAX,
        };
        let text = token.encode();
        assert!(text.len() < 100 && text.len() < MAX_METADATA_BYTES);
        assert_eq!(SplitToken::decode(&text), Some(token));
        let token = SplitToken {
            epoch: 3,
            from: 70,
            boundary: 120,
        };
        assert_eq!(token.encode(), "catchup/1 e=3 f=70 b=120");
    }

    #[test]
    fn anything_foreign_is_no_token() {
        for metadata in [
            "",
            "catchup/1",
            "catchup/1 ",
            "catchup/2 e=1 f=0 b=5",
            "catchup/1 e=1 f=0",
            "catchup/1 e=1 f=0 b=5 x=1",
            "catchup/1 e=1 f=0 b=5 b=6",
            "catchup/1 e=0 f=0 b=5",
            "catchup/1 e=1 f=9 b=5",
            "catchup/1 e=1 f=-1 b=5",
            "catchup/1 e=-1 f=0 b=5",
            "catchup/1 e=1 f=0 b=99999999999999999999",
            "{\"parallel-consumer\": \"...\"}",
            "catchup/1 e=1  f=0 b=5",
        ] {
            assert_eq!(SplitToken::decode(metadata), None, "{metadata:?}");
        }
    }
}
