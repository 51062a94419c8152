//! One poll round of a consumer that fetches several partitions, as their lanes must be told
//! it (`docs/design.md`, "The lane fetcher"). The client hands out messages in runs of one
//! partition, and some of its errors name no partition at all (the group member's
//! out-of-range error, an error on the catch-up consumer's main queue): such an error may be
//! any partition's, so it ends the chain of every lane, at the point it was polled. Both
//! fetchers and the simulation collect a round here and feed it with [`Round::feed`].

use std::collections::BTreeMap;

use super::PollErrorKind;
use super::lane::{LanePartition, Polled};
use crate::store::Record;

/// What one round of polls brought, in the order polled.
#[derive(Debug)]
pub struct Round<K> {
    /// `None`: an event that names no partition.
    polled: Vec<(Option<K>, Polled)>,
    /// The next record starts a run of its own (see [`Round::seal_run`]).
    sealed: bool,
}

impl<K> Default for Round<K> {
    fn default() -> Self {
        Self {
            polled: Vec::new(),
            sealed: false,
        }
    }
}

impl<K: Ord + Clone> Round<K> {
    /// An empty round.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing was polled.
    pub fn is_empty(&self) -> bool {
        self.polled.is_empty()
    }

    /// A polled message of the partition `is_key` recognises: it joins the run polled just
    /// before it when that run is the same partition's, else starts one under `key()` (so a
    /// key is built once per run, not per message).
    pub fn push_record(
        &mut self,
        record: Record,
        is_key: impl FnOnce(&K) -> bool,
        key: impl FnOnce() -> K,
    ) {
        if let (false, Some((Some(last), Polled::Messages(run)))) =
            (self.sealed, self.polled.last_mut())
        {
            if is_key(last) {
                run.push(record);
                return;
            }
        }
        self.sealed = false;
        self.polled
            .push((Some(key()), Polled::Messages(vec![record])));
    }

    /// The next record starts a new run, under a key built afresh: the consumer's
    /// assignment changed during the round, and a key that carries the assignment (a
    /// generation) must not be carried over from the run before.
    pub fn seal_run(&mut self) {
        self.sealed = true;
    }

    /// What a poll brought for the partition `key`, or (`None`) for whichever partition it
    /// was: such an event reaches every lane.
    pub fn push(&mut self, key: Option<K>, polled: Polled) {
        match (polled, self.polled.last_mut()) {
            (Polled::Messages(records), Some((Some(last), Polled::Messages(run))))
                if key.as_ref() == Some(last) =>
            {
                run.extend(records)
            }
            (polled, _) => self.polled.push((key, polled)),
        }
    }

    /// An error polled from a consumer queue (`key` `None`: it names no partition) or taken
    /// in `key`'s run, naming offset `named` there (the batch call moved the position past
    /// it), as [`classify_poll_error`](super::classify_poll_error) classified it: what it
    /// means for the lanes ([`Polled::from_error`]) joins the round. Whether it ends the
    /// queue's turn: every error does but an end of partition polled from a consumer queue,
    /// which moved nothing.
    pub fn push_error(&mut self, key: Option<K>, kind: PollErrorKind, named: Option<i64>) -> bool {
        match (key, Polled::from_error(kind, named)) {
            (None, Some(Polled::EndOfPartition { .. })) => false,
            (key, Some(polled)) => {
                self.push(key, polled);
                true
            }
            (_, None) => true,
        }
    }

    /// Feeds the round to `lanes`: each lane gets what was polled for it and every event
    /// that named no partition, in the order polled. What was polled under a key no lane
    /// has (a partition revoked during the round, or assigned again under a new generation,
    /// or never ours) is dropped.
    pub fn feed<'a>(self, lanes: impl IntoIterator<Item = (K, &'a mut LanePartition)>) {
        let mut named: BTreeMap<K, Vec<(usize, Polled)>> = BTreeMap::new();
        let mut unnamed: Vec<(usize, Polled)> = Vec::new();
        for (index, (key, polled)) in self.polled.into_iter().enumerate() {
            match key {
                Some(key) => named.entry(key).or_default().push((index, polled)),
                None => unnamed.push((index, polled)),
            }
        }
        for (key, lane) in lanes {
            let own = named.remove(&key).unwrap_or_default();
            let mut own = own.into_iter().peekable();
            for (index, event) in &unnamed {
                while let Some((_, polled)) = own.next_if(|(at, _)| at < index) {
                    lane.handle_polled(polled);
                }
                lane.handle_polled(event.clone());
            }
            own.for_each(|(_, polled)| lane.handle_polled(polled));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::AppendResult;
    use crate::store::LayoutId;

    use crate::fetch::test_record as record;

    fn lanes(count: i32) -> BTreeMap<i32, LanePartition> {
        (0..count)
            .map(|partition| (partition, LanePartition::live(LayoutId(1), 0)))
            .collect()
    }

    /// Each lane's proven append after the round, as (from, to) of what it covers.
    fn appends(lanes: &mut BTreeMap<i32, LanePartition>) -> Vec<Option<(i64, i64)>> {
        lanes
            .values_mut()
            .map(|lane| {
                let append = lane.poll_append()?;
                let covered = (append.continues_from, append.next);
                lane.handle_appended(AppendResult::Stored {
                    fetched_next: append.next,
                });
                Some(covered)
            })
            .collect()
    }

    #[test]
    fn messages_reach_their_own_partition_in_runs() {
        let mut round = Round::new();
        for (partition, offset) in [(0, 0), (0, 1), (1, 0), (0, 2)] {
            round.push_record(record(offset), |key| *key == partition, || partition);
        }
        assert_eq!(round.polled.len(), 3, "runs of one partition");
        let mut lanes = lanes(3);
        round.feed(lanes.iter_mut().map(|(key, lane)| (*key, lane)));
        assert_eq!(appends(&mut lanes), vec![Some((0, 3)), Some((0, 1)), None]);
    }

    #[test]
    fn an_unnamed_error_ends_every_chain_where_it_was_polled() {
        // Partition 0 polled 0 and 1, then an error naming no partition, then 2 (which the
        // error may have skipped something before); partition 1 polled nothing.
        let mut round = Round::new();
        round.push(Some(0), Polled::Messages(vec![record(0), record(1)]));
        round.push(None, Polled::BreaksChain);
        round.push(Some(0), Polled::Messages(vec![record(2)]));
        let mut lanes = lanes(2);
        round.feed(lanes.iter_mut().map(|(key, lane)| (*key, lane)));
        // What came before the error is proven; nothing after it is, on any lane.
        assert_eq!(appends(&mut lanes), vec![Some((0, 2)), None]);
        for lane in lanes.values() {
            assert!(lane.cursor().reposition().is_some(), "every chain ended");
        }
    }

    #[test]
    fn an_unnamed_out_of_range_error_asks_every_lane_for_its_watermarks() {
        let mut round: Round<i32> = Round::new();
        round.push(None, Polled::OutOfRange);
        let mut lanes = lanes(3);
        round.feed(lanes.iter_mut().map(|(key, lane)| (*key, lane)));
        let now = std::time::Instant::now();
        assert!(lanes.values().all(|lane| lane.poll_watermarks(now)));
    }

    /// The group member's partitions' queues are taken in runs, and the batch call moves a
    /// position one past an error taken there (librdkafka issue 4844): a transient error
    /// breaks its partition's chain, so the position past it proves nothing.
    #[test]
    fn an_error_taken_in_a_run_breaks_its_own_chain_past_which_the_position_proves_nothing() {
        let mut round = Round::new();
        round.push(Some(0), Polled::Messages(vec![record(0), record(1)]));
        assert!(round.push_error(Some(0), PollErrorKind::Transient, Some(2)));
        let mut lanes = lanes(2);
        round.feed(lanes.iter_mut().map(|(key, lane)| (*key, lane)));
        if let Some(lane) = lanes.get_mut(&0) {
            lane.handle_position(3);
        }
        assert_eq!(appends(&mut lanes), vec![Some((0, 2)), None]);
        assert!(lanes[&0].cursor().reposition().is_some(), "moved back");
        assert!(lanes[&1].cursor().reposition().is_none());
    }

    #[test]
    fn every_error_but_an_unnamed_end_of_partition_ends_its_queues_turn() {
        // (where it was taken, what it was, the offset its entry named) -> ends the turn,
        // joins the round
        let cases = [
            (None, PollErrorKind::EndOfPartition, None, false, false),
            (None, PollErrorKind::Transient, None, true, false),
            (None, PollErrorKind::BreaksChain, None, true, true),
            (None, PollErrorKind::OutOfRange, None, true, true),
            (Some(0), PollErrorKind::EndOfPartition, Some(5), true, true),
            (Some(0), PollErrorKind::Transient, Some(5), true, true),
            (Some(0), PollErrorKind::BreaksChain, Some(5), true, true),
        ];
        for (key, kind, named, ends_turn, joins) in cases {
            let mut round: Round<i32> = Round::new();
            let case = format!("{key:?} {kind:?} {named:?}");
            assert_eq!(round.push_error(key, kind, named), ends_turn, "{case}");
            assert_eq!(!round.is_empty(), joins, "{case}");
        }
    }

    #[test]
    fn a_named_error_ends_only_its_own_chain() {
        let mut round = Round::new();
        round.push(Some(1), Polled::BreaksChain);
        round.push(Some(0), Polled::Messages(vec![record(0)]));
        let mut lanes = lanes(2);
        round.feed(lanes.iter_mut().map(|(key, lane)| (*key, lane)));
        assert!(lanes[&0].cursor().reposition().is_none());
        assert!(lanes[&1].cursor().reposition().is_some());
    }

    #[test]
    fn a_sealed_run_is_not_joined_across_a_change_of_assignment() {
        // Partition 0 under generation 1, then (the assignment changed during the round)
        // under generation 2: the records polled under 1 reach no lane of generation 2.
        let mut round = Round::new();
        let mut generation = 1;
        for offset in [500, 501] {
            round.push_record(record(offset), |(p, _)| *p == 0, || (0, generation));
        }
        round.seal_run();
        generation = 2;
        round.push_record(record(0), |(p, _)| *p == 0, || (0, generation));
        let mut lane = LanePartition::live(LayoutId(1), 0);
        round.feed([((0, 2), &mut lane)]);
        let append = lane.poll_append().expect("generation 2's record");
        assert_eq!((append.continues_from, append.next), (0, 1));
        assert_eq!(append.records.len(), 1);
    }

    #[test]
    fn what_was_polled_for_a_partition_without_a_lane_is_dropped() {
        let mut round = Round::new();
        round.push(Some(7), Polled::Messages(vec![record(0)]));
        let mut lanes = lanes(1);
        round.feed(lanes.iter_mut().map(|(key, lane)| (*key, lane)));
        assert_eq!(appends(&mut lanes), vec![None]);
    }
}
