//! One fetcher's view of one partition: what it has polled since its consumer was last
//! positioned, and what that proves.

use crate::store::{AppendOutcome, LayoutId, Record, StoreError};

/// What a fetcher has proven about one partition since it positioned its consumer there.
///
/// The life of a cursor: the adapter positions its consumer at the lane's `fetched_next`
/// (assign or seek) and creates the cursor there, or calls [`repositioned`](Self::repositioned).
/// Polled messages and ends of partition go in; [`take_append`](Self::take_append) says what
/// to append, [`appended`](Self::appended) takes the buffer's answer, and
/// [`reposition`](Self::reposition) says where the consumer must be moved when the chain of
/// proof broke. Records polled while the chain is broken are dropped: they are refetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchCursor {
    /// The layout the fetcher was positioned under; every append names it.
    layout: LayoutId,
    /// Where the lane stands in the buffer, as the last append (or the positioning) left it.
    stored_next: i64,
    /// Bumped at every positioning: what an older one polled proves nothing now.
    generation: u64,
    /// Everything below this is proven fetched in this generation (past the last polled
    /// record, or further where a position of this generation showed offsets without records).
    polled_next: i64,
    /// Whether this generation has polled anything (a message or an end of partition). Until
    /// then the client may still report the position of an earlier assignment.
    heard: bool,
    /// The chain of proof broke: append what was polled before, then reposition.
    broken: bool,
    /// The offset the last end of partition named, when nothing was polled after it: a
    /// position read now proves nothing beyond it, and the next message must be at it.
    /// librdkafka's batch call moves the position one past it (librdkafka issue 4844), over
    /// an offset it never fetched, and a paused partition resumes from the position.
    end_named: Option<i64>,
    /// Polled records not yet appended, in offset order.
    pending: Vec<Record>,
    /// An append was taken and its result is not known yet.
    in_flight: bool,
    /// Records dropped because they arrived while the chain was broken.
    dropped: u64,
}

/// An append to make, with the proof the buffer checks: the buffer's own batch type, so that
/// its records move into the buffer ([`Buffer::append_owned`](crate::store::Buffer::append_owned)).
pub type PendingAppend = crate::store::FetchedBatch;

/// What the buffer said to an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendResult {
    /// Stored; the lane now stands at `fetched_next` (normalized: the next range's start).
    Stored {
        /// The lane's position after the append.
        fetched_next: i64,
    },
    /// Refused as discontinuous: the lane stands at `fetched_next`.
    Refused {
        /// Where the lane stands.
        fetched_next: i64,
    },
    /// The write failed (I/O); the lane did not move.
    Failed,
}

impl AppendResult {
    /// What the buffer's answer to an append means for the cursor that made it; `None` when
    /// the append was fetched under a layout that is gone: that writer is stale and stops.
    pub fn from_store(result: &Result<AppendOutcome, StoreError>) -> Option<Self> {
        match result {
            Ok(outcome) => Some(AppendResult::Stored {
                fetched_next: outcome.fetched_next,
            }),
            Err(StoreError::StaleLayout { .. }) => None,
            Err(StoreError::Discontinuous { fetched_next, .. }) => Some(AppendResult::Refused {
                fetched_next: *fetched_next,
            }),
            Err(_) => Some(AppendResult::Failed),
        }
    }
}

/// The failed write an append's answer carries, for the fetcher to act on as on any failed
/// write (an I/O failure stops writing): the append's own error, or the memory tier's spill
/// after an append that was made ([`AppendOutcome::relief_failed`]). A stale layout is no
/// failure: that writer leaves.
pub fn write_failure(result: &Result<AppendOutcome, StoreError>) -> Option<&StoreError> {
    match result {
        Ok(outcome) => outcome.relief_failed.as_ref(),
        Err(StoreError::StaleLayout { .. }) => None,
        Err(err) => Some(err),
    }
}

impl FetchCursor {
    /// A cursor for a consumer just positioned at `at`, the lane's `fetched_next` under
    /// `layout`.
    pub fn new(layout: LayoutId, at: i64) -> Self {
        Self {
            layout,
            stored_next: at,
            generation: 0,
            polled_next: at,
            heard: false,
            broken: false,
            end_named: None,
            pending: Vec::new(),
            in_flight: false,
            dropped: 0,
        }
    }

    /// The layout this cursor appends under.
    pub fn layout(&self) -> LayoutId {
        self.layout
    }

    /// Where the lane stands in the buffer, as far as this cursor knows.
    pub fn stored_next(&self) -> i64 {
        self.stored_next
    }

    /// How many times the consumer was repositioned.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the chain of proof is broken (waiting to be repositioned).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Records dropped because they were polled while the chain was broken.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// A run of polled messages, in the order polled. Offsets must increase within a
    /// generation; a message that does not breaks the chain there (librdkafka never does
    /// this; if it did, nothing is trusted): what came before it stays, it and what follows
    /// are dropped. A run is taken whole when it all holds — the first one of an append
    /// becomes the append, without moving a record. The first message after an end of
    /// partition that named an offset must be at that offset: one past it breaks the chain,
    /// since librdkafka resumes a paused partition at the position, which the batch call
    /// moved one past the end it handed out — what lies between was never fetched.
    pub fn messages(&mut self, mut run: Vec<Record>) {
        let resumed_past_end = self
            .end_named
            .zip(run.first())
            .is_some_and(|(end, first)| first.offset > end);
        if resumed_past_end {
            self.break_chain();
        }
        if self.broken {
            self.dropped += run.len() as u64;
            return;
        }
        let mut next = self.polled_next;
        let in_order = run
            .iter()
            .take_while(|record| {
                let follows = record.offset >= next;
                if follows {
                    next = record.offset + 1;
                }
                follows
            })
            .count();
        if in_order < run.len() {
            self.dropped += (run.len() - in_order) as u64;
            run.truncate(in_order);
            self.break_chain();
        }
        if run.is_empty() {
            return;
        }
        self.heard = true;
        self.end_named = None;
        self.polled_next = next;
        if self.pending.is_empty() {
            self.pending = run;
        } else {
            self.pending.append(&mut run);
        }
    }

    /// An end of partition polled in this generation, naming the offset the client's fetch
    /// stood at (`at`) when the adapter can read it. It proves no offset by itself (a new
    /// leader may briefly report a lower high watermark), but it means this generation has
    /// been heard from, so its position can be trusted — up to `at`, until a message comes
    /// after it. An end named further on than the last, with no message between, breaks the
    /// chain: the fetch moved past the earlier one without handing anything out — resumed
    /// after a pause at the position one past it, or past a transaction marker, which a
    /// refetch proves.
    pub fn end_of_partition(&mut self, at: Option<i64>) {
        if self
            .end_named
            .zip(at)
            .is_some_and(|(earlier, later)| later > earlier)
        {
            self.break_chain();
        }
        if !self.broken {
            self.heard = true;
            // One that names nothing (polled one at a time) leaves a bound standing.
            self.end_named = at.or(self.end_named);
        }
    }

    /// The consumer's position for this partition, read after a poll round. librdkafka
    /// moves it only past what it handed to the application, transaction markers included,
    /// so once this generation has been heard from it proves every offset below it: those
    /// without a record are compaction gaps or markers. Before that it may belong to an
    /// earlier assignment (the reset after an unassign is asynchronous) and proves nothing.
    pub fn position(&mut self, position: i64) {
        let position = self.end_named.map_or(position, |end| position.min(end));
        if !self.broken && self.heard && position > self.polled_next {
            self.polled_next = position;
        }
    }

    /// The chain of proof ends here (a poll error that may have skipped messages, an
    /// out-of-range reset): what was polled before stays valid; nothing after is trusted.
    pub fn break_chain(&mut self) {
        self.broken = true;
    }

    /// The append this cursor needs now, if any: the polled records and proven gaps since
    /// the lane's position.
    pub fn take_append(&mut self) -> Option<PendingAppend> {
        if self.in_flight || (self.pending.is_empty() && self.polled_next <= self.stored_next) {
            return None;
        }
        self.in_flight = true;
        Some(PendingAppend {
            layout: self.layout,
            continues_from: self.stored_next,
            records: std::mem::take(&mut self.pending),
            next: self.polled_next,
        })
    }

    /// The buffer's answer to the append [`take_append`](Self::take_append) returned.
    pub fn appended(&mut self, result: AppendResult) {
        self.in_flight = false;
        match result {
            AppendResult::Stored { fetched_next } => {
                self.stored_next = fetched_next;
                // The buffer stopped elsewhere than the consumer (a catch-up range ended and
                // the next starts further on, or the lane is complete): move the consumer.
                if fetched_next != self.polled_next {
                    self.broken = true;
                }
            }
            AppendResult::Refused { fetched_next } => {
                self.stored_next = fetched_next;
                self.broken = true;
            }
            AppendResult::Failed => self.broken = true,
        }
        if self.broken {
            // The chain is over: nothing it polled beyond the buffer's position is claimed.
            self.pending.clear();
            self.polled_next = self.stored_next;
        }
    }

    /// Where the consumer must be positioned, when the chain is broken and everything
    /// polled before the break was handed to the buffer.
    pub fn reposition(&self) -> Option<i64> {
        (self.broken && !self.in_flight && self.pending.is_empty()).then_some(self.stored_next)
    }

    /// The log now starts at `low` (read after an out-of-range error). When the cursor waits
    /// to be repositioned below it, retention deleted the offsets in between — they no longer
    /// exist in the log — and the returned append records them covered; the cursor then
    /// repositions at `low`. `None`: the position is not below the log start (the log may end
    /// below it instead, and only waiting helps).
    pub fn log_starts_at(&mut self, low: i64) -> Option<PendingAppend> {
        let at = self.reposition().filter(|&at| at < low)?;
        self.in_flight = true;
        Some(PendingAppend {
            layout: self.layout,
            continues_from: at,
            records: Vec::new(),
            next: low,
        })
    }

    /// The consumer was positioned at `at` (the position [`reposition`](Self::reposition)
    /// asked for, or a later one the buffer proved, such as a retention truncation).
    pub fn repositioned(&mut self, at: i64) {
        self.generation += 1;
        self.stored_next = at;
        self.polled_next = at;
        self.heard = false;
        self.broken = false;
        self.end_named = None;
        self.in_flight = false;
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fetch::test_record as record;

    fn offsets(append: &PendingAppend) -> Vec<i64> {
        append.records.iter().map(|r| r.offset).collect()
    }

    const LAYOUT: LayoutId = LayoutId(7);

    /// (the buffer's answer to an append, the failed write it carries)
    #[test]
    fn an_appends_failed_write_is_its_own_or_its_spills() {
        let io = || StoreError::Io {
            dir: "buf".into(),
            action: "writing".into(),
            error: std::io::Error::other("disk"),
        };
        let outcome = |relief_failed| AppendOutcome {
            stored: 1,
            stored_bytes: 10,
            fetched_next: 5,
            relief_failed,
        };
        let stale = StoreError::StaleLayout {
            dir: "buf".into(),
            topic: "t".into(),
            partition: 0,
            lane: crate::store::Lane::Catchup,
            fetched_under: LayoutId(1),
            current: LayoutId(2),
        };
        let cases: [(Result<AppendOutcome, StoreError>, bool); 4] = [
            (Ok(outcome(None)), false),
            (Ok(outcome(Some(io()))), true),
            (Err(stale), false),
            (Err(io()), true),
        ];
        for (result, failed) in cases {
            assert_eq!(write_failure(&result).is_some(), failed, "{result:?}");
        }
    }

    #[test]
    fn consecutive_messages_prove_the_gaps_between_them() {
        let mut cursor = FetchCursor::new(LAYOUT, 100);
        cursor.messages(vec![record(102), record(103)]);
        cursor.messages(vec![record(107)]);
        let append = cursor.take_append().expect("an append");
        assert_eq!(
            (append.continues_from, offsets(&append), append.next),
            (100, vec![102, 103, 107], 108)
        );
        cursor.appended(AppendResult::Stored { fetched_next: 108 });
        assert_eq!(cursor.take_append(), None);
        assert_eq!(cursor.reposition(), None);
    }

    #[test]
    fn an_error_keeps_what_was_polled_before_and_drops_what_came_after() {
        // F1: a poll error must never drop the batch, and must not let the next batch cover
        // the records the client may have skipped.
        let mut cursor = FetchCursor::new(LAYOUT, 1000);
        cursor.messages((1000..1500).map(record).collect());
        cursor.break_chain();
        cursor.messages((1600..1700).map(record).collect());
        let append = cursor.take_append().expect("an append");
        assert_eq!(
            (append.continues_from, append.records.len(), append.next),
            (1000, 500, 1500)
        );
        assert_eq!(cursor.dropped(), 100);
        assert_eq!(cursor.reposition(), None, "append first");
        cursor.appended(AppendResult::Stored { fetched_next: 1500 });
        assert_eq!(cursor.reposition(), Some(1500));
        cursor.repositioned(1500);
        assert_eq!(cursor.generation(), 1);
        cursor.messages(vec![record(1500)]);
        assert_eq!(cursor.take_append().map(|a| a.continues_from), Some(1500));
    }

    #[test]
    fn positions_count_only_once_the_generation_was_heard_from() {
        // F4b: right after a reposition the client may report the old assignment's position.
        let mut cursor = FetchCursor::new(LAYOUT, 90);
        cursor.messages((90..120).map(record).collect());
        cursor.appended(AppendResult::Stored { fetched_next: 125 });
        assert_eq!(cursor.reposition(), Some(125));
        cursor.repositioned(125);
        cursor.position(301); // stale: nothing polled in this generation yet
        assert_eq!(cursor.take_append(), None);
        cursor.end_of_partition(None);
        cursor.position(130);
        let append = cursor.take_append().expect("a proven gap");
        assert_eq!((append.continues_from, append.next), (125, 130));
        assert!(append.records.is_empty());
    }

    #[test]
    fn an_end_of_partition_proves_nothing_by_itself() {
        // F2/F11: an end of partition seen before a range change, or at a lowered high
        // watermark, must not mark the (next) range fetched.
        let mut cursor = FetchCursor::new(LAYOUT, 110);
        cursor.messages((110..450).map(record).collect());
        cursor.end_of_partition(None);
        let append = cursor.take_append().expect("append");
        assert_eq!(append.next, 450);
        // The buffer kept 110..119 and moved the lane to the next range's start.
        cursor.appended(AppendResult::Stored { fetched_next: 125 });
        assert_eq!(
            cursor.take_append(),
            None,
            "nothing of [125, 400) is proven"
        );
        assert_eq!(cursor.reposition(), Some(125));
    }

    #[test]
    fn a_position_past_the_named_end_of_partition_proves_only_up_to_it() {
        // librdkafka's batch call hands out the end of partition at 130 and moves the
        // position to 131: offset 130 was never fetched.
        let mut cursor = FetchCursor::new(LAYOUT, 100);
        cursor.messages((100..120).map(record).collect());
        cursor.end_of_partition(Some(130));
        cursor.position(131);
        let append = cursor.take_append().expect("append");
        assert_eq!(append.next, 130, "the gap [120, 130) is proven, 130 is not");
        cursor.appended(AppendResult::Stored { fetched_next: 130 });
        // A message after it: the position is the client's again.
        cursor.messages(vec![record(130), record(132)]);
        cursor.position(134);
        let append = cursor.take_append().expect("append");
        assert_eq!((append.continues_from, append.next), (130, 134));
        cursor.appended(AppendResult::Stored { fetched_next: 134 });
        // An end of partition the adapter cannot name (the group member's) bounds nothing.
        cursor.end_of_partition(None);
        cursor.position(136);
        assert_eq!(cursor.take_append().expect("append").next, 136);
    }

    #[test]
    fn a_message_past_the_named_end_of_partition_breaks_the_chain() {
        // The end of partition at 150 (a lowered high watermark) moved the position to 151;
        // the budget paused the partition, and librdkafka resumed it at 151.
        let mut cursor = FetchCursor::new(LAYOUT, 100);
        cursor.messages((100..150).map(record).collect());
        cursor.end_of_partition(Some(150));
        cursor.messages(vec![record(151), record(152)]);
        assert!(cursor.is_broken(), "offset 150 was never fetched");
        assert_eq!(cursor.dropped(), 2);
        let append = cursor.take_append().expect("what came before");
        assert_eq!(append.next, 150);
        cursor.appended(AppendResult::Stored { fetched_next: 150 });
        assert_eq!(cursor.reposition(), Some(150));
        // Refetched from 150 with no end of partition between: a gap is a gap again.
        cursor.repositioned(150);
        cursor.messages(vec![record(151)]);
        assert!(!cursor.is_broken(), "150 is a marker or compacted");
        // An end further on with no message between: 150 may have been skipped the same way.
        let mut cursor = FetchCursor::new(LAYOUT, 100);
        cursor.messages((100..150).map(record).collect());
        cursor.end_of_partition(Some(150));
        cursor.end_of_partition(Some(151));
        cursor.position(152);
        assert!(cursor.is_broken(), "offset 150 was never fetched");
        assert_eq!(cursor.take_append().expect("what came before").next, 150);
        // The same end again proves nothing new and breaks nothing.
        let mut cursor = FetchCursor::new(LAYOUT, 100);
        cursor.end_of_partition(Some(100));
        cursor.end_of_partition(Some(100));
        assert!(!cursor.is_broken());
        // A message at the named offset itself continues the chain.
        let mut cursor = FetchCursor::new(LAYOUT, 100);
        cursor.end_of_partition(Some(100));
        cursor.messages(vec![record(100), record(101)]);
        assert!(!cursor.is_broken());
    }

    #[test]
    fn a_refused_or_failed_append_refetches_from_the_buffer() {
        let mut cursor = FetchCursor::new(LAYOUT, 10);
        cursor.messages((10..20).map(record).collect());
        cursor.take_append().expect("append");
        cursor.appended(AppendResult::Failed);
        assert_eq!(cursor.reposition(), Some(10));
        cursor.repositioned(10);
        cursor.messages((10..20).map(record).collect());
        cursor.take_append().expect("append");
        cursor.appended(AppendResult::Refused { fetched_next: 15 });
        assert_eq!(cursor.reposition(), Some(15));
    }

    #[test]
    fn a_position_below_the_log_start_is_covered_then_repositioned() {
        let mut cursor = FetchCursor::new(LAYOUT, 400);
        cursor.break_chain(); // out of range
        assert_eq!(cursor.log_starts_at(300), None, "not below the log start");
        let append = cursor.log_starts_at(500).expect("a truncation to record");
        assert_eq!((append.continues_from, append.next), (400, 500));
        assert!(append.records.is_empty());
        assert_eq!(cursor.reposition(), None, "append first");
        cursor.appended(AppendResult::Stored { fetched_next: 500 });
        assert_eq!(cursor.reposition(), Some(500));
    }

    #[test]
    fn a_message_going_backwards_breaks_the_chain() {
        let mut cursor = FetchCursor::new(LAYOUT, 10);
        cursor.messages(vec![record(12)]);
        cursor.messages(vec![record(11)]);
        cursor.messages(vec![record(13)]);
        let append = cursor.take_append().expect("append");
        assert_eq!((offsets(&append), append.next), (vec![12], 13));
        assert!(cursor.is_broken());
        assert_eq!(cursor.dropped(), 2);

        // Within one run: the records before the step back stay.
        let mut cursor = FetchCursor::new(LAYOUT, 10);
        cursor.messages([10, 11, 14, 13, 15].map(record).to_vec());
        let append = cursor.take_append().expect("append");
        assert_eq!((offsets(&append), append.next), (vec![10, 11, 14], 15));
        assert!(cursor.is_broken());
        assert_eq!(cursor.dropped(), 2);
    }

    proptest::proptest! {
        /// How the polled messages are cut into runs changes nothing: the append, the break
        /// and the count dropped are those of the messages one at a time.
        #[test]
        fn runs_are_taken_as_their_messages_one_by_one(
            steps in proptest::collection::vec(-2i64..4, 1..60),
            cuts in proptest::collection::vec(1usize..8, 1..60),
        ) {
            let mut offset = 100;
            let polled: Vec<i64> = steps
                .iter()
                .map(|step| {
                    offset += step;
                    offset
                })
                .collect();
            let mut one_by_one = FetchCursor::new(LAYOUT, 100);
            polled.iter().for_each(|&o| one_by_one.messages(vec![record(o)]));
            let mut in_runs = FetchCursor::new(LAYOUT, 100);
            let mut rest = &polled[..];
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (run, after) = rest.split_at((*cut).min(rest.len()));
                in_runs.messages(run.iter().copied().map(record).collect());
                rest = after;
            }
            let summary = |cursor: &mut FetchCursor| {
                let append = cursor.take_append().map(|a| (offsets(&a), a.next));
                (append, cursor.is_broken(), cursor.dropped())
            };
            proptest::prop_assert_eq!(summary(&mut in_runs), summary(&mut one_by_one));
        }
    }
}
