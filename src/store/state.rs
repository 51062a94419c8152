//! Per-partition state of the buffer and the pure rules that move it. No I/O here: the
//! buffer reads a state, asks these functions what to write, and writes it atomically with
//! the records it describes.

use std::ops::Range;

use bincode::{Decode, Encode};

use super::{Lane, Record};

/// A half-open offset range `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct OffsetRange {
    /// First offset in the range.
    pub start: i64,
    /// One past the last offset in the range.
    pub end: i64,
}

impl OffsetRange {
    /// The range `[start, end)`.
    pub fn new(start: i64, end: i64) -> Self {
        Self { start, end }
    }

    /// Whether `offset` lies inside.
    pub fn contains(&self, offset: i64) -> bool {
        self.start <= offset && offset < self.end
    }
}

/// How a partition's offsets are split between the lanes, decided at assignment.
///
/// The catch-up lane holds `catchup_ranges` (sorted, disjoint, all below `live_from`); the
/// live lane holds `[live_from, ∞)`. Without a split the ranges are empty and the live lane
/// starts at the group's committed offset.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PartitionLayout {
    /// Split epoch: the token's epoch while split, `0` when not split.
    pub epoch: u64,
    /// Offsets the catch-up lane must fetch, in order.
    pub catchup_ranges: Vec<OffsetRange>,
    /// First offset of the live lane: the boundary `B` while split.
    pub live_from: i64,
}

impl PartitionLayout {
    /// No split: every offset from `from` goes through the live lane.
    pub fn plain(from: i64) -> Self {
        Self {
            epoch: 0,
            catchup_ranges: Vec::new(),
            live_from: from,
        }
    }

    /// A split: `[from, boundary)` through the catch-up lane, `[boundary, ∞)` live.
    pub fn split(epoch: u64, from: i64, boundary: i64) -> Self {
        let catchup_ranges = if from < boundary {
            vec![OffsetRange::new(from, boundary)]
        } else {
            Vec::new()
        };
        Self {
            epoch,
            catchup_ranges,
            live_from: boundary,
        }
    }

    /// The boundary `B` while split, `None` otherwise.
    pub fn boundary(&self) -> Option<i64> {
        (!self.catchup_ranges.is_empty()).then_some(self.live_from)
    }

    /// One past the last catch-up offset, `None` without catch-up ranges.
    pub fn catchup_end(&self) -> Option<i64> {
        self.catchup_ranges.last().map(|range| range.end)
    }

    /// Checks the shape rules; the message says which one is broken.
    pub fn validate(&self) -> Result<(), String> {
        if self.live_from < 0 {
            return Err(format!("live_from {} is negative", self.live_from));
        }
        let mut previous_end = 0;
        for range in &self.catchup_ranges {
            if range.start < previous_end || range.start >= range.end {
                return Err(format!(
                    "catch-up ranges must be non-empty, sorted and disjoint from offset 0: {:?}",
                    self.catchup_ranges
                ));
            }
            previous_end = range.end;
        }
        if previous_end > self.live_from {
            return Err(format!(
                "catch-up ranges {:?} reach past live_from {}",
                self.catchup_ranges, self.live_from
            ));
        }
        Ok(())
    }

    /// The position after `offset` in the catch-up lane: the end of one range — or any
    /// offset between two ranges — is the start of the next, because the offsets between
    /// two ranges were already processed.
    pub fn normalize_catchup(&self, offset: i64) -> i64 {
        for pair in self.catchup_ranges.windows(2) {
            if (pair[0].end..pair[1].start).contains(&offset) {
                return pair[1].start;
            }
        }
        offset
    }

    fn catchup_range_at(&self, offset: i64) -> Option<OffsetRange> {
        self.catchup_ranges
            .iter()
            .copied()
            .find(|range| range.contains(offset))
    }
}

/// Progress of one lane of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct LaneState {
    /// Lowest offset the lane's chunks still cover; everything below was committed and
    /// deleted.
    pub retained_from: i64,
    /// Where fetching resumes: the lane holds every offset of its range below this.
    pub fetched_next: i64,
    /// Offsets below this are committed to Kafka (main log or side log).
    pub committed_next: i64,
}

impl LaneState {
    fn at(offset: i64) -> Self {
        Self {
            retained_from: offset,
            fetched_next: offset,
            committed_next: offset,
        }
    }
}

/// Everything the buffer knows about one partition; stored atomically with its records.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PartitionState {
    /// The split decided at assignment.
    pub layout: PartitionLayout,
    /// Progress of the catch-up lane.
    pub catchup: LaneState,
    /// Progress of the live lane.
    pub live: LaneState,
}

/// Which records of a batch to store and the offsets the new chunk covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AppendPlan {
    /// Index range of the records to keep.
    pub keep: Range<usize>,
    /// First offset covered: the lane's `fetched_next` before the append.
    pub first: i64,
    /// One past the last offset covered.
    pub next: i64,
}

impl PartitionState {
    /// The state of a freshly laid out partition: nothing fetched, nothing committed.
    pub fn new(layout: PartitionLayout) -> Self {
        let catchup_start = layout
            .catchup_ranges
            .first()
            .map_or(layout.live_from, |r| r.start);
        let live = LaneState::at(layout.live_from);
        Self {
            catchup: LaneState::at(catchup_start),
            live,
            layout,
        }
    }

    /// The progress of `lane`.
    pub fn lane(&self, lane: Lane) -> &LaneState {
        match lane {
            Lane::Catchup => &self.catchup,
            Lane::Live => &self.live,
        }
    }

    pub(crate) fn lane_mut(&mut self, lane: Lane) -> &mut LaneState {
        match lane {
            Lane::Catchup => &mut self.catchup,
            Lane::Live => &mut self.live,
        }
    }

    /// The position after `offset` in `lane` (see [`PartitionLayout::normalize_catchup`]).
    pub fn normalize(&self, lane: Lane, offset: i64) -> i64 {
        match lane {
            Lane::Catchup => self.layout.normalize_catchup(offset),
            Lane::Live => offset,
        }
    }

    /// Whether the catch-up lane has fetched all its ranges (trivially so without a split).
    pub fn catchup_fetched(&self) -> bool {
        self.layout
            .catchup_end()
            .is_none_or(|end| self.catchup.fetched_next >= end)
    }

    /// Whether the catch-up lane is fully committed: the split is over.
    pub fn catchup_committed(&self) -> bool {
        self.layout
            .catchup_end()
            .is_none_or(|end| self.catchup.committed_next >= end)
    }

    /// Decides what an append of `records`, fetched up to position `next_offset`, stores.
    ///
    /// Records the lane already holds (below `fetched_next`) and, in the catch-up lane,
    /// records past the current range's end are dropped: that is what makes a refetch
    /// idempotent and keeps the lanes disjoint. `Ok(None)`: nothing to store.
    pub(crate) fn plan_append(
        &self,
        lane: Lane,
        records: &[Record],
        next_offset: i64,
    ) -> Result<Option<AppendPlan>, String> {
        for pair in records.windows(2) {
            if pair[0].offset >= pair[1].offset {
                return Err(format!(
                    "offsets must strictly increase, found {} then {}",
                    pair[0].offset, pair[1].offset
                ));
            }
        }
        if let Some(last) = records.last() {
            if last.offset >= next_offset {
                return Err(format!(
                    "next offset {next_offset} must be past the last record's offset {}",
                    last.offset
                ));
            }
        }
        let first = self.lane(lane).fetched_next;
        let limit = match lane {
            Lane::Live => i64::MAX,
            Lane::Catchup => match self.layout.catchup_range_at(first) {
                Some(range) => range.end,
                None => return Ok(None), // every catch-up range is fetched
            },
        };
        let next = next_offset.min(limit);
        if next <= first {
            return Ok(None);
        }
        let lo = records.partition_point(|r| r.offset < first);
        let hi = records.partition_point(|r| r.offset < next);
        Ok(Some(AppendPlan {
            keep: lo..hi,
            first,
            next,
        }))
    }

    /// Decides the new `committed_next` of `lane` when Kafka holds `committed_next`.
    /// `Ok(None)`: nothing changes (an older or equal commit).
    pub(crate) fn plan_commit(
        &self,
        lane: Lane,
        committed_next: i64,
    ) -> Result<Option<i64>, String> {
        let committed = self.normalize(lane, committed_next);
        let state = self.lane(lane);
        if committed > state.fetched_next {
            return Err(format!(
                "commit of {committed_next} is ahead of what the {lane} lane fetched ({})",
                state.fetched_next
            ));
        }
        Ok((committed > state.committed_next).then_some(committed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Timestamp;

    fn records(offsets: &[i64]) -> Vec<Record> {
        offsets
            .iter()
            .map(|&offset| Record {
                offset,
                timestamp: Timestamp::NotAvailable,
                key: None,
                payload: None,
                headers: Vec::new(),
            })
            .collect()
    }

    fn resplit() -> PartitionState {
        // After a crash during a split: [70, 120) and [150, 200) still to do, live from 200.
        PartitionState::new(PartitionLayout {
            epoch: 2,
            catchup_ranges: vec![OffsetRange::new(70, 120), OffsetRange::new(150, 200)],
            live_from: 200,
        })
    }

    #[test]
    fn layouts_are_validated() {
        let bad = [
            PartitionLayout {
                epoch: 1,
                catchup_ranges: vec![OffsetRange::new(5, 5)],
                live_from: 9,
            },
            PartitionLayout {
                epoch: 1,
                catchup_ranges: vec![OffsetRange::new(5, 10)],
                live_from: 9,
            },
            PartitionLayout {
                epoch: 1,
                catchup_ranges: vec![OffsetRange::new(5, 10), OffsetRange::new(8, 12)],
                live_from: 20,
            },
            PartitionLayout::plain(-1),
        ];
        for layout in bad {
            assert!(layout.validate().is_err(), "{layout:?} passed");
        }
        assert_eq!(PartitionLayout::split(1, 70, 120).validate(), Ok(()));
        assert_eq!(resplit().layout.validate(), Ok(()));
        assert_eq!(PartitionLayout::split(1, 120, 120).boundary(), None);
    }

    #[test]
    fn append_table() {
        let split = PartitionState::new(PartitionLayout::split(1, 70, 120));
        // (lane, fetched offsets, next offset) -> (kept offsets, first, next)
        type Case = (Lane, Vec<i64>, i64, Option<(Vec<i64>, i64, i64)>);
        let cases: Vec<Case> = vec![
            (
                Lane::Catchup,
                vec![70, 71, 72],
                73,
                Some((vec![70, 71, 72], 70, 73)),
            ),
            // overshoot past the boundary: the live lane owns those offsets
            (
                Lane::Catchup,
                vec![118, 119, 120, 121],
                122,
                Some((vec![118, 119], 70, 120)),
            ),
            // compaction gap at the start: the chunk still covers from fetched_next
            (Lane::Catchup, vec![90], 91, Some((vec![90], 70, 91))),
            // transaction markers only: an empty chunk moves the position
            (Lane::Catchup, vec![], 75, Some((vec![], 70, 75))),
            (
                Lane::Live,
                vec![120, 121],
                122,
                Some((vec![120, 121], 120, 122)),
            ),
            // a refetch below fetched_next is dropped
            (Lane::Live, vec![100, 101], 102, None),
        ];
        for (lane, offsets, next_offset, expected) in cases {
            let batch = records(&offsets);
            let plan = split
                .plan_append(lane, &batch, next_offset)
                .expect("valid batch");
            let got = plan.map(|p| {
                let kept: Vec<i64> = batch[p.keep.clone()].iter().map(|r| r.offset).collect();
                (kept, p.first, p.next)
            });
            assert_eq!(got, expected, "{lane} {offsets:?} next {next_offset}");
        }
    }

    #[test]
    fn append_rejects_malformed_batches() {
        let state = PartitionState::new(PartitionLayout::plain(0));
        assert!(state.plan_append(Lane::Live, &records(&[3, 3]), 4).is_err());
        assert!(state.plan_append(Lane::Live, &records(&[5, 4]), 6).is_err());
        assert!(state.plan_append(Lane::Live, &records(&[5]), 5).is_err());
    }

    #[test]
    fn refetch_after_partial_append_keeps_only_the_new_part() {
        let mut state = PartitionState::new(PartitionLayout::plain(10));
        state.live.fetched_next = 13;
        let batch = records(&[10, 11, 12, 13, 14]);
        let plan = state
            .plan_append(Lane::Live, &batch, 15)
            .expect("valid")
            .expect("something new");
        assert_eq!(
            plan,
            AppendPlan {
                keep: 3..5,
                first: 13,
                next: 15
            }
        );
    }

    #[test]
    fn catchup_moves_from_range_to_range_and_stops() {
        let mut state = resplit();
        state.catchup.fetched_next = state.normalize(Lane::Catchup, 120);
        assert_eq!(state.catchup.fetched_next, 150);
        assert!(!state.catchup_fetched());
        state.catchup.fetched_next = state.normalize(Lane::Catchup, 200);
        assert!(state.catchup_fetched());
        assert_eq!(
            state.plan_append(Lane::Catchup, &records(&[200]), 201),
            Ok(None)
        );
    }

    #[test]
    fn commit_table() {
        let mut state = resplit();
        state.catchup.fetched_next = 160;
        state.catchup.committed_next = 80;
        assert_eq!(state.plan_commit(Lane::Catchup, 100), Ok(Some(100)));
        assert_eq!(state.plan_commit(Lane::Catchup, 120), Ok(Some(150)));
        assert_eq!(state.plan_commit(Lane::Catchup, 80), Ok(None));
        assert_eq!(state.plan_commit(Lane::Catchup, 60), Ok(None));
        assert!(state.plan_commit(Lane::Catchup, 161).is_err());
        assert!(!state.catchup_committed());
        state.catchup.fetched_next = 200;
        state.catchup.committed_next = 200;
        assert!(state.catchup_committed());
    }
}
