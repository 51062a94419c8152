//! `Mode::Latest`: which records of a split partition are superseded — a newer record of the
//! same key is buffered or was delivered on that partition — and are skipped instead of
//! handed out.
//!
//! The index maps each key to the newest offset seen of it. An entry must name a record the
//! application has seen or will see (delivered already, or buffered and delivered in its
//! lane's order): a false "superseded" drops the latest value of a key, which is loss. Keys
//! are compared whole (never a hash of them), and the index lives only while the partition
//! is split: the live lane alone delivers in order and needs no index.
//!
//! A new assignment starts with an empty index, but the application may already have seen
//! live records of this split: from an earlier process (before a crash) or an earlier
//! assignment of this one. They lie in `[end of the first catch-up range, horizon)`, the
//! horizon being at or above the log end at assignment (nothing was delivered beyond the log
//! end). Until that range has been read again from Kafka (keys only) and noted, the catch-up
//! lane hands out nothing: an older value delivered after a newer one already seen would
//! become the application's final state. The live lane is not held.

use std::collections::HashMap;
use std::ops::Range;

use crate::store::PartitionState;

/// What becomes of one record of a split partition in `Mode::Latest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Handed to the application.
    Deliver,
    /// A newer record of its key is buffered or delivered: counted processed (it moves
    /// commits like an acknowledged record) and never handed out.
    Skip,
}

/// Roughly what an entry of the index costs beside its key's bytes: the map's slot (a boxed
/// slice and an offset, with the map's spare capacity) and the allocator's header of the key.
pub const ENTRY_OVERHEAD_BYTES: usize = 56;

/// The newest offset of each key on one split partition, and how far the rebuild of what
/// earlier processes delivered has come.
#[derive(Debug, Clone, Default)]
pub struct KeyIndex {
    newest: HashMap<Box<[u8]>, i64>,
    key_bytes: usize,
    /// Every record below this offset (from the rebuild's start) has been noted.
    rebuilt_next: i64,
    /// Where the rebuild is complete: live records below it may have been delivered before
    /// this index existed.
    horizon: i64,
}

impl KeyIndex {
    /// An index for a partition whose records in `[rebuild_from, horizon)` may have been
    /// handed out before this assignment (nothing to rebuild when the range is empty: a new
    /// split, whose live lane starts at the horizon).
    pub fn new(rebuild_from: i64, horizon: i64) -> Self {
        Self {
            newest: HashMap::new(),
            key_bytes: 0,
            rebuilt_next: rebuild_from,
            horizon,
        }
    }

    /// The index of a partition assigned with `state`; `None` unless it is split with
    /// backlog left. `seen_end` is the high watermark read at the assignment, or the offset
    /// after the last live record this process handed out of the partition if that is
    /// higher. What the application may have seen already lies in `[end of the first
    /// catch-up range, horizon)`: nothing was handed out beyond the log end, nor beyond what
    /// the live lane fetched.
    ///
    /// One window is left: a new leader can report a high watermark below the old one for a
    /// while, and a restarted process cannot know what its predecessor handed out beyond it.
    /// Those records lie at or beyond the live lane's checkpoint (the horizon is never below
    /// it: the live lane resumes there), so the live lane hands them out again: the
    /// application may see an older value in between, never end with one.
    pub fn for_assignment(state: &PartitionState, seen_end: i64) -> Option<Self> {
        if state.catchup_committed() {
            return None;
        }
        let first = state.layout.catchup_ranges.first()?;
        Some(Self::new(first.end, seen_end.max(state.live.fetched_next)))
    }

    /// Whether the split's backlog is all processed, `catchup_processed` being where the
    /// catch-up lane's acknowledgements have come: the index is no longer needed (the live
    /// lane alone delivers in order, and no backlog record waits in a reader's queue).
    pub fn done(catchup_end: Option<i64>, catchup_processed: i64) -> bool {
        catchup_end.is_none_or(|end| catchup_processed >= end)
    }

    /// Notes a record buffered, read by the rebuild or delivered: `offset` is the newest of
    /// `key` if no newer one was noted. A record without a key supersedes nothing.
    pub fn note(&mut self, key: Option<&[u8]>, offset: i64) {
        let Some(key) = key else {
            return;
        };
        match self.newest.get_mut(key) {
            Some(newest) => *newest = (*newest).max(offset),
            None => {
                self.key_bytes += key.len();
                self.newest.insert(key.into(), offset);
            }
        }
    }

    /// The rebuild has noted every record below `next`.
    pub fn rebuilt_to(&mut self, next: i64) {
        self.rebuilt_next = self.rebuilt_next.max(next);
    }

    /// What is left to read again from Kafka before the catch-up lane may hand out records;
    /// `None` once nothing is.
    pub fn rebuild_left(&self) -> Option<Range<i64>> {
        (self.rebuilt_next < self.horizon).then_some(self.rebuilt_next..self.horizon)
    }

    /// Whether the catch-up lane may hand out records: the index holds every key the
    /// application may have seen a newer record of.
    pub fn catchup_may_deliver(&self) -> bool {
        self.rebuild_left().is_none()
    }

    /// What becomes of the record at `offset` with `key`, about to be handed out; a record
    /// handed out is noted (it supersedes every older one of its key from now on).
    pub fn verdict(&mut self, key: Option<&[u8]>, offset: i64) -> Verdict {
        let Some(key) = key else {
            return Verdict::Deliver;
        };
        match self.newest.get(key) {
            Some(&newest) if newest > offset => Verdict::Skip,
            _ => {
                self.note(Some(key), offset);
                Verdict::Deliver
            }
        }
    }

    /// Whether a newer record of `key` than `offset` has been noted: asked again when a
    /// record read earlier is about to be handed out (a newer one may have come since).
    pub fn superseded(&self, key: Option<&[u8]>, offset: i64) -> bool {
        key.and_then(|key| self.newest.get(key))
            .is_some_and(|&newest| newest > offset)
    }

    /// How many keys the index holds.
    pub fn keys(&self) -> usize {
        self.newest.len()
    }

    /// About how many bytes of memory the index takes (see [`ENTRY_OVERHEAD_BYTES`]).
    pub fn cost_bytes(&self) -> usize {
        self.key_bytes + self.newest.len() * ENTRY_OVERHEAD_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_table() {
        /// Notes before, the record asked about (key, offset), its verdict.
        type Case<'a> = (&'a [(&'a [u8], i64)], Option<&'a [u8]>, i64, Verdict);
        let cases: &[Case] = &[
            (&[], Some(b"k"), 5, Verdict::Deliver),
            (&[(b"k", 9)], Some(b"k"), 5, Verdict::Skip),
            (&[(b"k", 5)], Some(b"k"), 5, Verdict::Deliver), // itself, noted at append
            (&[(b"k", 3)], Some(b"k"), 5, Verdict::Deliver),
            (&[(b"j", 9)], Some(b"k"), 5, Verdict::Deliver),
            (&[(b"k", 9)], None, 5, Verdict::Deliver), // no key: never skipped
            (&[(b"k", 9), (b"k", 2)], Some(b"k"), 5, Verdict::Skip), // newest kept
            (&[(b"", 9)], Some(b""), 5, Verdict::Skip), // an empty key is a key
            (&[(b"k\0", 9)], Some(b"k"), 5, Verdict::Deliver), // whole keys, not prefixes
        ];
        for (notes, key, offset, expected) in cases {
            let mut index = KeyIndex::new(0, 0);
            for (noted, at) in notes.iter() {
                index.note(Some(noted), *at);
            }
            assert_eq!(
                index.verdict(*key, *offset),
                *expected,
                "{notes:?} then {key:?}@{offset}"
            );
        }
    }

    #[test]
    fn a_delivered_record_supersedes_older_ones() {
        let mut index = KeyIndex::new(0, 0);
        assert_eq!(index.verdict(Some(b"k"), 10), Verdict::Deliver);
        assert_eq!(index.verdict(Some(b"k"), 4), Verdict::Skip);
        assert_eq!(index.verdict(Some(b"k"), 11), Verdict::Deliver);
        assert_eq!(index.verdict(Some(b"k"), 10), Verdict::Skip);
    }

    #[test]
    fn the_catchup_lane_waits_for_the_rebuild() {
        let index = KeyIndex::new(100, 100);
        assert!(
            index.catchup_may_deliver(),
            "a new split has nothing to rebuild"
        );

        let mut index = KeyIndex::new(100, 250);
        assert_eq!(index.rebuild_left(), Some(100..250));
        assert!(!index.catchup_may_deliver());
        index.note(Some(b"k"), 120);
        index.rebuilt_to(200);
        assert_eq!(index.rebuild_left(), Some(200..250));
        index.rebuilt_to(150); // never back
        assert_eq!(index.rebuild_left(), Some(200..250));
        index.rebuilt_to(260);
        assert!(index.catchup_may_deliver());
        assert!(index.superseded(Some(b"k"), 50));
        assert!(!index.superseded(Some(b"k"), 120));
        assert!(!index.superseded(None, 50));
        assert_eq!(index.verdict(Some(b"k"), 50), Verdict::Skip);
    }

    #[test]
    fn an_index_exists_while_a_backlog_is_left() {
        use crate::store::{OffsetRange, PartitionLayout};
        let mut state = PartitionState::new(PartitionLayout::plain(40));
        assert!(KeyIndex::for_assignment(&state, 90).is_none(), "not split");

        let mut layout = PartitionLayout::split(1, 10, 50);
        layout.catchup_ranges.push(OffsetRange::new(60, 70));
        layout.live_from = 80;
        state = PartitionState::new(layout);
        state.live.fetched_next = 95;
        let index = KeyIndex::for_assignment(&state, 90).expect("split");
        // The live records of the first split and everything after: up to what was fetched.
        assert_eq!(index.rebuild_left(), Some(50..95));

        state.catchup.committed_next = 70;
        assert!(
            KeyIndex::for_assignment(&state, 90).is_none(),
            "backlog committed"
        );
        assert!(KeyIndex::done(Some(70), 70));
        assert!(!KeyIndex::done(Some(70), 69));
        assert!(KeyIndex::done(None, 0));
    }

    #[test]
    fn cost_counts_keys_once() {
        let mut index = KeyIndex::new(0, 0);
        index.note(Some(b"abc"), 1);
        index.note(Some(b"abc"), 2);
        index.note(Some(b"de"), 3);
        index.note(None, 4);
        assert_eq!(index.keys(), 2);
        assert_eq!(index.cost_bytes(), 5 + 2 * ENTRY_OVERHEAD_BYTES);
    }
}
