//! The side entry: live-lane progress of a split partition, kept in the compacted side topic.
//!
//! Key `group/topic/partition` (UTF-8); value a versioned text line
//! `catchup-side/2 e=<epoch> b=<boundary> l=<live_next> r=<start>-<end>,... m=<mac>` —
//! readable with any Kafka tool. `m` is the MAC of the key and everything before ` m=` under
//! the split's secret ([`SplitSecret::mac`]): an entry is trusted only when it verifies
//! against the token in the group's own commit. A tombstone (null value) deletes it. Entries
//! of version 1 (no MAC) do not decode: they are stale.

use super::SplitSecret;
use super::secret::{MAC_BYTES, from_hex, to_hex};
use crate::store::OffsetRange;

const PREFIX: &str = "catchup-side/2 ";

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

/// Partitions of a side topic catchup creates: each group's entries live in the one
/// [`side_partition`] names, so an assignment reads its own group's entries and about 1/64
/// of the others' — not every entry of every group sharing the topic.
pub const SIDE_PARTITIONS: i32 = 64;

/// The partition of a side topic of `partitions` partitions that holds `group`'s entries: a
/// stable hash of the group id (FNV-1a, 32 bits), so every member and every version agrees.
/// A topic created with one partition (before this layout) keeps everything in it.
pub fn side_partition(group: &str, partitions: i32) -> i32 {
    let hash = group.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    (hash % partitions.max(1) as u32) as i32
}

/// Splits a side-topic key into (group, topic, partition). Group ids may contain `/`, topic
/// names may not, so the last two fields are split off from the right.
pub fn parse_side_key(key: &str) -> Option<(&str, &str, i32)> {
    let (rest, partition) = key.rsplit_once('/')?;
    let (group, topic) = rest.rsplit_once('/')?;
    Some((group, topic, partition.parse().ok()?))
}

/// A side entry as read from the side topic: its contents and MAC, not yet authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSideEntry {
    entry: SideEntry,
    body: String,
    mac: [u8; MAC_BYTES],
}

impl SealedSideEntry {
    /// Parses a side-topic value; an error says why it is not a usable entry.
    pub fn decode(value: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(value).map_err(|_| "not UTF-8".to_string())?;
        if !text.starts_with(PREFIX) {
            return Err(format!("unknown format: {:.40}", text));
        }
        let (body, mac) = text
            .rsplit_once(" m=")
            .ok_or_else(|| "no MAC (m=)".to_string())?;
        let mac = from_hex(mac).ok_or_else(|| format!("malformed MAC {mac:.40?}"))?;
        Ok(Self {
            entry: SideEntry::decode_body(body)?,
            body: body.to_owned(),
            mac,
        })
    }

    /// The contents, unauthenticated: only for messages and offline inspection.
    pub fn unverified(&self) -> &SideEntry {
        &self.entry
    }

    /// The contents, if the MAC verifies for `key` under `secret`.
    pub fn open(&self, key: &str, secret: &SplitSecret) -> Option<&SideEntry> {
        secret
            .verifies(key, &self.body, &self.mac)
            .then_some(&self.entry)
    }
}

impl SideEntry {
    /// The value written to the side topic under `key`: the contents and their MAC under the
    /// split's secret.
    pub fn seal(&self, key: &str, secret: &SplitSecret) -> String {
        let body = self.body();
        let mac = to_hex(&secret.mac(key, &body));
        format!("{body} m={mac}")
    }

    fn body(&self) -> String {
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

    fn decode_body(text: &str) -> Result<Self, String> {
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
                "e" if epoch.is_none() => {
                    epoch = Some(
                        value
                            .parse::<u64>()
                            .map_err(|_| format!("bad epoch {value:?}"))?,
                    )
                }
                "b" if boundary.is_none() => boundary = Some(number()?),
                "l" if live_next.is_none() => live_next = Some(number()?),
                "r" if ranges.is_none() => ranges = Some(parse_ranges(value)?),
                _ => return Err(format!("unknown or repeated field {name:?}")),
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

    #[test]
    fn each_group_has_one_stable_side_partition() {
        // Fixed values: a change of the hash would lose every split's live progress at an
        // upgrade (entries looked for in another partition).
        assert_eq!(side_partition("", SIDE_PARTITIONS), 5);
        assert_eq!(side_partition("orders-app", SIDE_PARTITIONS), 38);
        assert_eq!(side_partition("orders-app", 1), 0);
        let spread: std::collections::BTreeSet<i32> = (0..1000)
            .map(|n| side_partition(&format!("group-{n}"), SIDE_PARTITIONS))
            .collect();
        assert_eq!(
            spread.len(),
            SIDE_PARTITIONS as usize,
            "groups spread over all partitions"
        );
        assert!(spread.iter().all(|p| (0..SIDE_PARTITIONS).contains(p)));
        assert_eq!(
            side_partition("orders-app", SIDE_PARTITIONS),
            side_partition("orders-app", SIDE_PARTITIONS)
        );
        assert_eq!(side_partition("g", 0), 0, "no partitions: no panic");
    }

    use super::*;

    const KEY: &str = "g/t/0";

    fn secret() -> SplitSecret {
        SplitSecret::from_bytes([9; 16])
    }

    fn entry() -> SideEntry {
        SideEntry {
            epoch: 7,
            boundary: 200,
            ranges: vec![OffsetRange::new(70, 120), OffsetRange::new(150, 200)],
            live_next: 230,
        }
    }

    #[test]
    fn round_trips_and_verifies_only_under_its_key_and_secret() {
        let value = entry().seal(KEY, &secret());
        assert!(
            value.starts_with("catchup-side/2 e=7 b=200 l=230 r=70-120,150-200 m="),
            "{value}"
        );
        assert_eq!(
            value.len(),
            "catchup-side/2 e=7 b=200 l=230 r=70-120,150-200".len() + 35
        );
        let sealed = SealedSideEntry::decode(value.as_bytes()).map_err(|e| e.to_string());
        let sealed = sealed.as_ref();
        assert_eq!(sealed.map(|s| s.unverified()), Ok(&entry()));
        assert_eq!(sealed.map(|s| s.open(KEY, &secret())), Ok(Some(&entry())));
        assert_eq!(sealed.map(|s| s.open("g/t/1", &secret())), Ok(None));
        assert_eq!(sealed.map(|s| s.open("h/t/0", &secret())), Ok(None));
        let other = SplitSecret::from_bytes([10; 16]);
        assert_eq!(sealed.map(|s| s.open(KEY, &other)), Ok(None));

        let done = SideEntry {
            epoch: 1,
            boundary: 5,
            ranges: vec![],
            live_next: 5,
        };
        let sealed = SealedSideEntry::decode(done.seal(KEY, &secret()).as_bytes());
        assert_eq!(
            sealed.map(|s| s.open(KEY, &secret()).cloned()),
            Ok(Some(done))
        );
    }

    #[test]
    fn a_changed_field_breaks_the_mac() {
        let value = entry().seal(KEY, &secret());
        let tampered = value.replace("l=230", "l=999");
        let sealed = SealedSideEntry::decode(tampered.as_bytes());
        assert_eq!(sealed.as_ref().map(|s| s.unverified().live_next), Ok(999));
        assert_eq!(sealed.map(|s| s.open(KEY, &secret()).is_some()), Ok(false));
    }

    #[test]
    fn foreign_or_damaged_values_are_errors() {
        const M: &str = " m=00000000000000000000000000000000";
        let values: Vec<Vec<u8>> = [
            "catchup-side/1 e=1 b=5000 l=5000 r=4990-5000",
            "catchup-side/2 e=1 b=5 l=5 r=",
            "catchup-side/2 e=1 b=5 l=5 r= m=0000",
            "catchup-side/2 e=1 b=5 l=5 r= m=000000000000000000000000000000zz",
            "catchup-side/3 e=1 b=5 l=5 r=",
            "",
        ]
        .into_iter()
        .map(|v| v.as_bytes().to_vec())
        .chain(
            [
                "catchup-side/2 e=1 b=5 l=5",
                "catchup-side/2 e=1 b=5 l=4 r=",
                "catchup-side/2 e=1 b=5 l=5 r=3-9",
                "catchup-side/2 e=1 b=9 l=9 r=5-3",
                "catchup-side/2 e=1 b=9 l=9 r=1-4,2-6",
                "catchup-side/2 e=x b=9 l=9 r=",
                "catchup-side/2 e=1 b=9 l=9 r= z=1",
                "catchup-side/2 e=1 e=2 b=9 l=9 r=",
                "catchup-side/2 e=1 b=9 l=9 l=10 r=",
            ]
            .into_iter()
            .map(|v| format!("{v}{M}").into_bytes()),
        )
        .chain([b"\xff\xfe".to_vec()])
        .collect();
        for value in values {
            assert!(
                SealedSideEntry::decode(&value).is_err(),
                "{:?}",
                String::from_utf8_lossy(&value)
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
