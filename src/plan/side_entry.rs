//! The side entry: live-lane progress of a split partition, kept in the compacted side topic.
//!
//! Key `group/topic/partition` (UTF-8); value a versioned text line
//! `catchup-side/1 e=<epoch> b=<boundary> l=<live_next> r=<start>-<end>,...` — readable with
//! any Kafka tool. A tombstone (null value) deletes it.

use crate::store::OffsetRange;

const PREFIX: &str = "catchup-side/1 ";

/// Live progress of one split partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideEntry {
    /// The split epoch; must equal the token's for the entry to be trusted.
    pub epoch: u64,
    /// The boundary of the split.
    pub boundary: i64,
    /// The catch-up ranges still to process, in order.
    pub ranges: Vec<OffsetRange>,
    /// The first live offset not yet processed.
    pub live_next: i64,
}

/// The side-topic key of a partition of `topic` in `group`.
pub fn side_key(group: &str, topic: &str, partition: i32) -> String {
    format!("{group}/{topic}/{partition}")
}

/// Splits a side-topic key into (group, topic, partition). Group ids may contain `/`, topic
/// names may not, so the last two fields are split off from the right.
pub fn parse_side_key(key: &str) -> Option<(&str, &str, i32)> {
    let (rest, partition) = key.rsplit_once('/')?;
    let (group, topic) = rest.rsplit_once('/')?;
    Some((group, topic, partition.parse().ok()?))
}

impl SideEntry {
    /// The value written to the side topic.
    pub fn encode(&self) -> String {
        let ranges: Vec<String> = self
            .ranges
            .iter()
            .map(|r| format!("{}-{}", r.start, r.end))
            .collect();
        format!(
            "{PREFIX}e={} b={} l={} r={}",
            self.epoch,
            self.boundary,
            self.live_next,
            ranges.join(",")
        )
    }

    /// Parses a side-topic value; an error says why it is not a usable entry.
    pub fn decode(value: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(value).map_err(|_| "not UTF-8".to_string())?;
        let fields = text
            .strip_prefix(PREFIX)
            .ok_or_else(|| format!("unknown format: {:.40}", text))?;
        let (mut epoch, mut boundary, mut live_next, mut ranges) = (None, None, None, None);
        for field in fields.split(' ') {
            let (name, value) = field
                .split_once('=')
                .ok_or_else(|| format!("malformed field {field:?}"))?;
            let number = || {
                value
                    .parse::<i64>()
                    .map_err(|_| format!("{name}={value} is not a number"))
            };
            match name {
                "e" => {
                    epoch = Some(
                        value
                            .parse::<u64>()
                            .map_err(|_| format!("bad epoch {value:?}"))?,
                    )
                }
                "b" => boundary = Some(number()?),
                "l" => live_next = Some(number()?),
                "r" => ranges = Some(parse_ranges(value)?),
                _ => return Err(format!("unknown field {name:?}")),
            }
        }
        let entry = Self {
            epoch: epoch.ok_or("missing epoch")?,
            boundary: boundary.ok_or("missing boundary")?,
            ranges: ranges.ok_or("missing ranges")?,
            live_next: live_next.ok_or("missing live_next")?,
        };
        let mut previous_end = 0;
        for range in &entry.ranges {
            if range.start < previous_end || range.start >= range.end {
                return Err(format!(
                    "ranges not sorted and disjoint: {:?}",
                    entry.ranges
                ));
            }
            previous_end = range.end;
        }
        if entry.live_next < entry.boundary || previous_end > entry.boundary {
            return Err(format!("inconsistent offsets: {entry:?}"));
        }
        Ok(entry)
    }
}

fn parse_ranges(text: &str) -> Result<Vec<OffsetRange>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|range| {
            let (start, end) = range
                .split_once('-')
                .ok_or_else(|| format!("bad range {range:?}"))?;
            let parse = |n: &str| n.parse::<i64>().map_err(|_| format!("bad range {range:?}"));
            Ok(OffsetRange::new(parse(start)?, parse(end)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let entry = SideEntry {
            epoch: 7,
            boundary: 200,
            ranges: vec![OffsetRange::new(70, 120), OffsetRange::new(150, 200)],
            live_next: 230,
        };
        assert_eq!(
            entry.encode(),
            "catchup-side/1 e=7 b=200 l=230 r=70-120,150-200"
        );
        assert_eq!(SideEntry::decode(entry.encode().as_bytes()), Ok(entry));
        let done = SideEntry {
            epoch: 1,
            boundary: 5,
            ranges: vec![],
            live_next: 5,
        };
        assert_eq!(SideEntry::decode(done.encode().as_bytes()), Ok(done));
    }

    #[test]
    fn foreign_or_damaged_values_are_errors() {
        for value in [
            &b"\xff\xfe"[..],
            b"",
            b"catchup-side/2 e=1 b=5 l=5 r=",
            b"catchup-side/1 e=1 b=5 l=5",
            b"catchup-side/1 e=1 b=5 l=4 r=",
            b"catchup-side/1 e=1 b=5 l=5 r=3-9",
            b"catchup-side/1 e=1 b=9 l=9 r=5-3",
            b"catchup-side/1 e=1 b=9 l=9 r=1-4,2-6",
            b"catchup-side/1 e=x b=9 l=9 r=",
            b"catchup-side/1 e=1 b=9 l=9 r= z=1",
        ] {
            assert!(
                SideEntry::decode(value).is_err(),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn keys_round_trip_with_slashes_in_the_group() {
        let key = side_key("team/orders-app", "orders", 12);
        assert_eq!(
            parse_side_key(&key),
            Some(("team/orders-app", "orders", 12))
        );
        assert_eq!(parse_side_key("nogroup"), None);
        assert_eq!(parse_side_key("g/t/x"), None);
    }
}
