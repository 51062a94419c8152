//! One partition of a fetcher's lane, as both fetchers and the simulation drive it: the chain
//! of proof of the consumer's current positioning ([`FetchCursor`]), the ranges a catch-up
//! lane must fetch, and the decisions around them that used to live in each adapter — what an
//! out-of-range error means once the watermarks are read, how long a partition past the log
//! end waits, when a failed move is worth reporting (`docs/design.md`, "The lane fetcher").
//!
//! The adapters feed it what the client reported and carry out what it asks, in this order
//! every round:
//!
//! 1. [`handle_polled`](LanePartition::handle_polled) for what each poll brought, then
//!    [`handle_position`](LanePartition::handle_position) with the consumer's position;
//! 2. [`poll_append`](LanePartition::poll_append): hand the append to the buffer, then
//!    [`handle_appended`](LanePartition::handle_appended) with its answer;
//! 3. [`poll_watermarks`](LanePartition::poll_watermarks): read them, then
//!    [`handle_watermarks`](LanePartition::handle_watermarks) (which may ask for a second
//!    append: the offsets retention deleted, recorded covered);
//! 4. [`poll_move`](LanePartition::poll_move): move the consumer there, then
//!    [`handle_moved`](LanePartition::handle_moved).
//!
//! Nothing here does I/O or reads the clock: `now` is passed in.

use std::time::{Duration, Instant};

use super::cursor::{AppendResult, FetchCursor, PendingAppend};
use super::hold::{Hold, Standing, standing};
use super::poll_error::PollErrorKind;
use crate::store::{LayoutId, OffsetRange, Record};

/// What polling brought for one partition, in the order polled.
#[derive(Debug, Clone)]
pub enum Polled {
    /// A run of messages.
    Messages(Vec<Record>),
    /// The consumer reached the end of the partition; `at`: the offset its fetch stood at,
    /// when the adapter can read it (librdkafka's event names it, rust-rdkafka's error
    /// does not).
    EndOfPartition {
        /// Where the fetch stood.
        at: Option<i64>,
    },
    /// The position is out of range: the partition stopped fetching.
    OutOfRange,
    /// An error that may have skipped messages: the chain of proof ends here.
    BreaksChain,
}

impl Polled {
    /// What an error polled for a partition means for its lane (`None`: nothing), as
    /// [`classify_poll_error`](super::classify_poll_error) classified it. `named`: the offset
    /// the error's entry names when it was taken in a run (librdkafka's batch call), which
    /// moves the position one past it (librdkafka issue 4844) — past an offset never fetched.
    /// An end of partition bounds what the position proves by it; an error that skipped
    /// nothing breaks the chain there, since nothing bounds the position it leaves.
    pub fn from_error(kind: PollErrorKind, named: Option<i64>) -> Option<Polled> {
        match kind {
            PollErrorKind::EndOfPartition => Some(Polled::EndOfPartition { at: named }),
            PollErrorKind::Transient => named.map(|_| Polled::BreaksChain),
            PollErrorKind::OutOfRange => Some(Polled::OutOfRange),
            PollErrorKind::BreaksChain => Some(Polled::BreaksChain),
        }
    }
}

/// What the watermarks read after an out-of-range error decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterOutOfRange {
    /// Retention deleted `[from, to)` of what the lane still needed: report it, and append
    /// `append` (no records: the offsets are recorded covered), then answer it.
    Truncated {
        /// The first offset lost.
        from: i64,
        /// Past the last offset lost that this lane owns.
        to: i64,
        /// What records them covered.
        append: PendingAppend,
    },
    /// The log ends below the position: the partition waits `wait` before it is fetched
    /// there again.
    PastLogEnd {
        /// The position.
        at: i64,
        /// The log end.
        high: i64,
        /// How long it waits.
        wait: Duration,
    },
    /// The position is inside the log: the error was another partition's; it moves now.
    InsideLog,
    /// The watermarks could not be read: the partition waits `wait`, then moves back to its
    /// position as after any broken chain (a real out-of-range error simply comes again).
    Unknown {
        /// Why they could not be read.
        reason: String,
        /// How long it waits.
        wait: Duration,
    },
}

/// One partition of a lane.
#[derive(Debug, Clone)]
pub struct LanePartition {
    cursor: FetchCursor,
    /// Catch-up: the ranges to fetch (the partition leaves once the last one is); live: none.
    ranges: Vec<OffsetRange>,
    /// An out-of-range error was polled: the watermarks decide before anything moves.
    out_of_range: bool,
    hold: Hold,
    move_failures: u32,
}

impl LanePartition {
    /// The live lane of a partition whose consumer was positioned at `at`, its `fetched_next`
    /// under `layout`.
    pub fn live(layout: LayoutId, at: i64) -> Self {
        Self::catchup(layout, at, Vec::new())
    }

    /// The catch-up lane of a partition positioned at `at`, with the `ranges` it must fetch.
    pub fn catchup(layout: LayoutId, at: i64, ranges: Vec<OffsetRange>) -> Self {
        Self {
            cursor: FetchCursor::new(layout, at),
            ranges,
            out_of_range: false,
            hold: Hold::default(),
            move_failures: 0,
        }
    }

    /// The chain of proof (its layout, where the lane stands).
    pub fn cursor(&self) -> &FetchCursor {
        &self.cursor
    }

    /// Whether every range is fetched (never, for a lane without ranges).
    pub fn is_fetched(&self) -> bool {
        self.ranges
            .last()
            .is_some_and(|range| self.cursor.stored_next() >= range.end)
    }

    /// Feeds what one poll brought.
    pub fn handle_polled(&mut self, polled: Polled) {
        match polled {
            Polled::Messages(records) => self.cursor.messages(records),
            Polled::EndOfPartition { at } => self.cursor.end_of_partition(at),
            Polled::OutOfRange => {
                self.cursor.break_chain();
                self.out_of_range = true;
            }
            Polled::BreaksChain => self.cursor.break_chain(),
        }
    }

    /// The consumer's position of the partition, read after the round's polls.
    pub fn handle_position(&mut self, position: i64) {
        self.cursor.position(position);
    }

    /// The chain ends without an error of its own (a reassignment, an error of another
    /// partition that may have been this one's).
    pub fn break_chain(&mut self) {
        self.cursor.break_chain();
    }

    /// What to append to the buffer now.
    pub fn poll_append(&mut self) -> Option<PendingAppend> {
        self.cursor.take_append()
    }

    /// The buffer's answer to the last append.
    pub fn handle_appended(&mut self, answer: AppendResult) {
        self.cursor.appended(answer);
    }

    /// Whether the watermarks must be read now (after an out-of-range error, before the
    /// partition moves).
    pub fn poll_watermarks(&self, now: Instant) -> bool {
        self.out_of_range && self.cursor.reposition().is_some() && !self.hold.holds(now)
    }

    /// The watermarks `(low, high)` read after an out-of-range error, or why they could not
    /// be.
    pub fn handle_watermarks(
        &mut self,
        watermarks: Result<(i64, i64), String>,
        now: Instant,
    ) -> AfterOutOfRange {
        let Some(at) = self.cursor.reposition() else {
            return AfterOutOfRange::InsideLog;
        };
        let (low, high) = match watermarks {
            Ok(watermarks) => watermarks,
            Err(reason) => {
                // Reading them again and again could block for good while their leader is
                // down: move after the hold instead.
                self.out_of_range = false;
                return AfterOutOfRange::Unknown {
                    reason,
                    wait: self.hold.hold(now),
                };
            }
        };
        self.out_of_range = false;
        match standing(at, low, high) {
            Standing::PastLogEnd => {
                self.out_of_range = true; // judged again once the hold ends
                AfterOutOfRange::PastLogEnd {
                    at,
                    high,
                    wait: self.hold.hold(now),
                }
            }
            Standing::InsideLog => {
                self.hold.release();
                AfterOutOfRange::InsideLog
            }
            Standing::BelowLogStart => {
                self.hold.release();
                match self.cursor.log_starts_at(low) {
                    // What the catch-up lane lost ends at its last range; the rest is the
                    // live lane's.
                    Some(append) => AfterOutOfRange::Truncated {
                        from: at,
                        to: self.ranges.last().map_or(low, |range| low.min(range.end)),
                        append,
                    },
                    None => AfterOutOfRange::InsideLog,
                }
            }
        }
    }

    /// Where to move the consumer now: the chain is broken, everything polled before the
    /// break is stored, no watermarks are awaited and the partition is not held.
    pub fn poll_move(&self, now: Instant) -> Option<i64> {
        if self.out_of_range || self.hold.holds(now) {
            return None;
        }
        self.cursor.reposition()
    }

    /// How moving the consumer to `at` went; a failure worth reporting comes back (the first
    /// of a run and every 100th after: it is retried every round).
    pub fn handle_moved(&mut self, at: i64, moved: Result<(), String>) -> Option<String> {
        match moved {
            Ok(()) => {
                self.cursor.repositioned(at);
                self.move_failures = 0;
                None
            }
            Err(reason) => {
                let report = self.move_failures % 100 == 0;
                self.move_failures = self.move_failures.saturating_add(1);
                report.then_some(reason)
            }
        }
    }

    /// The consumer was positioned afresh at `at` by an assignment of everything (an eager
    /// protocol): nothing polled before counts.
    pub fn restarted_at(&mut self, at: i64) {
        self.cursor.break_chain();
        self.cursor.repositioned(at);
        self.out_of_range = false;
        self.move_failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fetch::test_record as record;

    fn stored(next: i64) -> AppendResult {
        AppendResult::Stored { fetched_next: next }
    }

    #[test]
    fn what_an_error_means_for_the_lane_table() {
        use PollErrorKind::*;
        // (kind, offset named in a run, what the lane is fed)
        let cases: [(PollErrorKind, Option<i64>, Option<&str>); 8] = [
            (EndOfPartition, None, Some("EndOfPartition { at: None }")),
            (
                EndOfPartition,
                Some(7),
                Some("EndOfPartition { at: Some(7) }"),
            ),
            // Polled one at a time, or from a queue naming no partition: nothing moved.
            (Transient, None, None),
            // Taken in a run: the position stands one past an offset never fetched.
            (Transient, Some(7), Some("BreaksChain")),
            (OutOfRange, None, Some("OutOfRange")),
            (OutOfRange, Some(7), Some("OutOfRange")),
            (BreaksChain, None, Some("BreaksChain")),
            (BreaksChain, Some(7), Some("BreaksChain")),
        ];
        for (kind, named, expected) in cases {
            let fed = Polled::from_error(kind, named).map(|polled| format!("{polled:?}"));
            assert_eq!(fed.as_deref(), expected, "{kind:?} named {named:?}");
        }
    }

    #[test]
    fn a_transient_error_taken_in_a_run_refetches_from_the_lane() {
        let mut lane = LanePartition::catchup(LayoutId(1), 10, vec![OffsetRange::new(10, 50)]);
        lane.handle_polled(Polled::Messages((10..20).map(record).collect()));
        let error = Polled::from_error(PollErrorKind::Transient, Some(20)).expect("fed");
        lane.handle_polled(error);
        lane.handle_position(21); // the batch call's, past offset 20
        let append = lane.poll_append().expect("what came before");
        assert_eq!(append.next, 20, "offset 20 is not proven");
        lane.handle_appended(stored(20));
        assert_eq!(lane.cursor().reposition(), Some(20));
    }

    /// Polls `offsets` in one generation and stores what they prove.
    fn fetch(lane: &mut LanePartition, offsets: std::ops::Range<i64>) {
        lane.handle_polled(Polled::Messages(offsets.clone().map(record).collect()));
        lane.handle_position(offsets.end);
        let append = lane.poll_append().expect("an append");
        assert_eq!(append.continues_from, offsets.start);
        lane.handle_appended(stored(offsets.end));
    }

    #[test]
    fn a_catchup_lane_is_fetched_at_the_end_of_its_last_range() {
        let ranges = vec![
            OffsetRange { start: 0, end: 10 },
            OffsetRange { start: 20, end: 30 },
        ];
        let mut lane = LanePartition::catchup(LayoutId(1), 0, ranges);
        fetch(&mut lane, 0..10);
        assert!(!lane.is_fetched());
        lane.handle_polled(Polled::Messages(vec![record(20), record(29)]));
        lane.handle_position(30);
        assert!(lane.poll_append().is_some());
        lane.handle_appended(stored(30));
        assert!(lane.is_fetched());
        let mut live = LanePartition::live(LayoutId(1), 0);
        fetch(&mut live, 0..30);
        assert!(!live.is_fetched(), "a live lane never is");
    }

    #[test]
    fn out_of_range_waits_for_the_watermarks_before_moving() {
        let now = Instant::now();
        let mut lane = LanePartition::live(LayoutId(1), 0);
        fetch(&mut lane, 0..5);
        lane.handle_polled(Polled::OutOfRange);
        assert_eq!(lane.poll_append(), None);
        assert!(lane.poll_watermarks(now));
        assert_eq!(
            lane.poll_move(now),
            None,
            "not before the watermarks are read"
        );

        // Retention deleted [5, 50): recorded covered, then the lane moves to 50.
        let AfterOutOfRange::Truncated { from, to, append } =
            lane.handle_watermarks(Ok((50, 80)), now)
        else {
            panic!("expected a truncation");
        };
        assert_eq!(
            (from, to, append.continues_from, append.next),
            (5, 50, 5, 50)
        );
        lane.handle_appended(stored(50));
        assert!(!lane.poll_watermarks(now));
        assert_eq!(lane.poll_move(now), Some(50));
        assert_eq!(lane.handle_moved(50, Ok(())), None);
        assert_eq!(lane.poll_move(now), None);
    }

    #[test]
    fn what_a_catchup_lane_lost_ends_at_its_last_range() {
        let now = Instant::now();
        let mut lane =
            LanePartition::catchup(LayoutId(1), 0, vec![OffsetRange { start: 0, end: 40 }]);
        lane.handle_polled(Polled::OutOfRange);
        let after = lane.handle_watermarks(Ok((60, 90)), now);
        assert!(
            matches!(
                after,
                AfterOutOfRange::Truncated {
                    from: 0,
                    to: 40,
                    ..
                }
            ),
            "{after:?}"
        );
    }

    #[test]
    fn a_position_past_the_log_end_is_held_and_judged_again() {
        let now = Instant::now();
        let mut lane = LanePartition::live(LayoutId(1), 0);
        fetch(&mut lane, 0..100);
        lane.handle_polled(Polled::OutOfRange);
        // An unclean election left the log ending at 60.
        assert_eq!(
            lane.handle_watermarks(Ok((0, 60)), now),
            AfterOutOfRange::PastLogEnd {
                at: 100,
                high: 60,
                wait: Duration::from_secs(1)
            }
        );
        assert!(!lane.poll_watermarks(now), "held");
        assert_eq!(lane.poll_move(now), None, "held");
        let later = now + Duration::from_secs(1);
        assert!(lane.poll_watermarks(later), "judged again after the hold");
        // Still short: the wait doubles.
        assert!(matches!(
            lane.handle_watermarks(Ok((0, 70)), later),
            AfterOutOfRange::PastLogEnd { wait, .. } if wait == Duration::from_secs(2)
        ));
        // The log grew back past the position: it moves, and the next hold starts short.
        let grown = later + Duration::from_secs(2);
        assert_eq!(
            lane.handle_watermarks(Ok((0, 120)), grown),
            AfterOutOfRange::InsideLog
        );
        assert_eq!(lane.poll_move(grown), Some(100));
    }

    #[test]
    fn another_partitions_error_moves_it_at_once_and_unknown_watermarks_hold_it() {
        let now = Instant::now();
        let mut lane = LanePartition::live(LayoutId(1), 0);
        fetch(&mut lane, 0..10);
        lane.handle_polled(Polled::OutOfRange);
        assert_eq!(
            lane.handle_watermarks(Ok((0, 50)), now),
            AfterOutOfRange::InsideLog
        );
        assert_eq!(lane.poll_move(now), Some(10));

        let mut unknown = LanePartition::live(LayoutId(1), 0);
        unknown.handle_polled(Polled::OutOfRange);
        assert!(matches!(
            unknown.handle_watermarks(Err("timed out".into()), now),
            AfterOutOfRange::Unknown { .. }
        ));
        assert!(!unknown.poll_watermarks(now));
        assert_eq!(unknown.poll_move(now), None, "held");
        let later = now + Duration::from_secs(1);
        assert!(!unknown.poll_watermarks(later), "not read again and again");
        assert_eq!(
            unknown.poll_move(later),
            Some(0),
            "moves back after the hold"
        );
    }

    #[test]
    fn failed_moves_are_reported_on_the_first_and_every_hundredth() {
        let mut lane = LanePartition::live(LayoutId(1), 0);
        lane.handle_polled(Polled::BreaksChain);
        let reported: Vec<usize> = (0..250)
            .filter(|_| lane.handle_moved(0, Err("refused".into())).is_some())
            .collect();
        assert_eq!(reported.len(), 3, "the 1st, 101st and 201st");
        assert_eq!(lane.handle_moved(0, Ok(())), None);
        assert!(lane.handle_moved(0, Err("refused".into())).is_some());
    }

    #[test]
    fn a_restart_of_everything_starts_a_new_chain() {
        let now = Instant::now();
        let mut lane = LanePartition::live(LayoutId(1), 0);
        fetch(&mut lane, 0..10);
        lane.handle_polled(Polled::Messages(vec![record(10)]));
        lane.restarted_at(10);
        assert_eq!(
            lane.poll_append(),
            None,
            "what was polled before counts for nothing"
        );
        assert_eq!(lane.poll_move(now), None);
        fetch(&mut lane, 10..12);
        assert_eq!(lane.cursor().stored_next(), 12);
    }
}
