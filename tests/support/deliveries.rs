//! What a catchup consumer delivered from one topic, and the checks the tests make on it:
//! every produced record delivered with its payload, order within an assignment, duplicates.

use std::collections::{BTreeMap, HashMap};

use catchup::{Delivery, DeliveryLane, Mode};

use super::Produced;

/// Every delivery of one topic, recorded as it was handed out.
#[derive(Debug, Clone, Default)]
pub struct Deliveries {
    /// `Concurrent`: order is checked per lane.
    pub mode: Mode,
    /// Deliveries recorded.
    pub count: u64,
    /// `(partition, offset)` → (times delivered, payload of the first delivery).
    pub records: HashMap<(i32, i64), (u32, Vec<u8>)>,
    /// Per partition: every offset below this was delivered (the log has no gaps).
    pub covered: BTreeMap<i32, i64>,
    /// The last offset per partition, [`Delivery::assignment`] and (`Concurrent`) lane.
    pub last: HashMap<(i32, u64, Option<DeliveryLane>), i64>,
    /// Deliveries whose offset did not increase within their assignment (and lane), described.
    pub disorder: Vec<String>,
    /// Offsets delivered again with another payload than the first time.
    pub payload_changed: Vec<(i32, i64)>,
}

impl Deliveries {
    /// Nothing delivered yet by a consumer in `mode`.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Records `d`; returns whether it is the first delivery of its partition's assignment.
    ///
    /// Order is checked within an assignment, not over the consumer's lifetime: after a
    /// revocation (a lost one included) the next assignment may start again at the group's
    /// committed offset (DESIGN §4, invariant 2).
    pub fn record(&mut self, d: &Delivery) -> bool {
        let (at, payload) = (
            (d.partition, d.offset),
            d.payload.as_deref().unwrap_or_default(),
        );
        self.count += 1;
        let entry = self.records.entry(at).or_insert((0, payload.to_vec()));
        entry.0 += 1;
        if entry.1 != payload {
            self.payload_changed.push(at);
        }
        let lane = (self.mode == Mode::Concurrent).then_some(d.lane);
        let key = (d.partition, d.assignment(), lane);
        let previous = self.last.insert(key, d.offset);
        if let Some(previous) = previous.filter(|previous| d.offset <= *previous) {
            self.disorder.push(format!(
                "partition {} assignment {} ({}): offset {} after {previous}",
                d.partition,
                d.assignment(),
                d.lane.as_str(),
                d.offset
            ));
        }
        let covered = self.covered.entry(d.partition).or_default();
        while self.records.contains_key(&(d.partition, *covered)) {
            *covered += 1;
        }
        previous.is_none()
    }

    /// Whether every offset below `ends[partition]` of every partition was delivered.
    pub fn covers(&self, ends: &[i64]) -> bool {
        (0..)
            .zip(ends)
            .all(|(p, end)| self.covered.get(&p).is_some_and(|c| c >= end))
    }

    /// The records of `produced` never delivered.
    pub fn never_delivered<'a>(&self, produced: &'a [Produced]) -> Vec<&'a Produced> {
        produced
            .iter()
            .filter(|r| !self.records.contains_key(&(r.partition, r.offset)))
            .collect()
    }

    /// The records of `produced` delivered with another payload, the first time or later.
    pub fn wrong_payload<'a>(&self, produced: &'a [Produced]) -> Vec<&'a Produced> {
        produced
            .iter()
            .filter(|r| {
                let at = (r.partition, r.offset);
                self.records
                    .get(&at)
                    .is_some_and(|(_, first)| *first != r.payload)
                    || self.payload_changed.contains(&at)
            })
            .collect()
    }

    /// The offsets of `partition` delivered more than once, as `(first, last)` ranges.
    pub fn duplicates(&self, partition: i32) -> Vec<(i64, i64)> {
        let mut offsets: Vec<i64> = self
            .records
            .iter()
            .filter(|(at, (times, _))| at.0 == partition && *times > 1)
            .map(|(at, _)| at.1)
            .collect();
        offsets.sort_unstable();
        let mut ranges: Vec<(i64, i64)> = Vec::new();
        for offset in offsets {
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == offset => *end = offset,
                _ => ranges.push((offset, offset)),
            }
        }
        ranges
    }
}
