//! One lane of one assignment of a partition: which offsets are processed ([`AckTracker`])
//! and the bytes the lane holds against the byte budget — fetched and not acknowledged, and
//! of those, fetched and not handed out yet (what a lane reads ahead).
//!
//! Three threads move its bytes: a fetcher counts what it appended, the reader what it handed
//! out, the application what it acknowledged (planning a commit, recording it and reading
//! through gaps move none). They do not take turns: the reader may hand out and
//! the application acknowledge a record before its fetcher has counted the append that stored
//! it. So the counters are signed, and a hand-out or an ack subtracts what the append adds,
//! whichever comes first; each is read as zero while below it.
//!
//! The buffer may hold records from before the assignment (reused at reconciliation). They
//! were never counted, so handing them out or acknowledging them frees nothing: the counts
//! start at the lane's fetched position when the assignment began. An append counted late —
//! the catch-up fetcher counts on its own thread, and the partition may have been assigned
//! again and laid out afresh in between — counts only under the layout it was made in: the
//! records it counts may be gone, and fetched again into the new layout (and counted there).

use super::{AckTracker, CommitPlan};
use crate::store::LayoutId;

/// One lane's acknowledgements and byte counts, for one assignment of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneAccount {
    acks: AckTracker,
    /// Bytes appended and not acknowledged.
    unacked: i64,
    /// Of `unacked`, the bytes handed out (so the rest is fetched and not handed out).
    handed: i64,
    /// The lane's fetched position when the assignment began: records below it are not
    /// counted.
    counted_from: i64,
    /// The partition's layout in this assignment: appends made in another are not counted.
    layout: LayoutId,
}

impl LaneAccount {
    /// A lane of a partition laid out as `layout`, whose records below `committed_next` are
    /// processed and whose buffer holds records up to `fetched_next`, none of them counted.
    pub fn new(layout: LayoutId, committed_next: i64, fetched_next: i64) -> Self {
        Self {
            acks: AckTracker::new(committed_next),
            unacked: 0,
            handed: 0,
            counted_from: fetched_next,
            layout,
        }
    }

    /// An append of `bytes` bytes, made in `layout`, that left the lane fetched up to
    /// `fetched_next`.
    pub fn appended(&mut self, layout: LayoutId, fetched_next: i64, bytes: u64) {
        if self.counts(layout, fetched_next) {
            self.unacked += bytes as i64;
        }
    }

    /// Whether an append made in `layout` that left the lane fetched up to `fetched_next`
    /// counts here: one of this assignment's layout, past what the lane held when it began.
    pub fn counts(&self, layout: LayoutId, fetched_next: i64) -> bool {
        layout == self.layout && fetched_next > self.counted_from
    }

    /// `offset`, of `bytes` bytes, is handed to the application. Offsets must increase; one
    /// below the last handed out is not recorded (see [`AckTracker::delivered`]).
    pub fn hand_out(&mut self, offset: i64, bytes: usize) {
        if self.acks.delivered(offset, bytes) && offset >= self.counted_from {
            self.handed += bytes as i64;
        }
    }

    /// The application acknowledges `offset`: the bytes this frees once committed (0 for
    /// an offset not handed out, or acknowledged before).
    pub fn acknowledge(&mut self, offset: i64) -> u64 {
        let freed = self.acks.ack(offset);
        if offset >= self.counted_from {
            self.unacked -= freed as i64;
            self.handed -= freed as i64;
        }
        freed as u64
    }

    /// Bytes appended and not acknowledged (what the byte budget pauses a lane for).
    pub fn unacked_bytes(&self) -> u64 {
        self.unacked.max(0) as u64
    }

    /// Bytes appended and not handed out (what the lane read ahead).
    pub fn undelivered_bytes(&self) -> u64 {
        (self.unacked - self.handed).max(0) as u64
    }

    /// Bytes handed out beyond those counted appended: the appends that stored them are still
    /// to be counted (a catch-up fetcher counts after the buffer took its append). Zero once
    /// every count came; above what the counts still to come add, a count was lost.
    pub fn counted_behind(&self) -> u64 {
        (self.handed - self.unacked).max(0) as u64
    }

    /// Whether the counts are back to zero, neither above nor below: what a lane must show
    /// once every record it counted is handed out and acknowledged and no count is still to
    /// come (a count lost or made twice leaves it off for the rest of the assignment).
    pub fn balanced(&self) -> bool {
        self.unacked == 0 && self.handed == 0
    }

    /// The lane's acknowledgements.
    pub fn acks(&self) -> &AckTracker {
        &self.acks
    }

    /// Marks the lane read through `next` (exclusive), past offsets that hold no record (see
    /// [`AckTracker::read_through`]): they move no bytes.
    pub fn read_through(&mut self, next: i64) {
        self.acks.read_through(next);
    }

    /// A commit planned when the lane had acknowledged `covered` bytes is in Kafka (see
    /// [`AckTracker::commit_landed`]).
    pub fn commit_landed(&mut self, covered: u64) {
        self.acks.commit_landed(covered);
    }
}

/// A partition's commit is planned as `plan`, its lanes (catch-up, live) `lanes`: the bytes
/// each lane had acknowledged, which wait for no commit once this one lands
/// ([`commit_landed`]). A plan that writes nothing lands at once (`None`): nothing
/// acknowledged waits for a commit of it.
pub fn commit_planned(lanes: [&mut LaneAccount; 2], plan: &CommitPlan) -> Option<[u64; 2]> {
    let acked = lanes.each_ref().map(|lane| lane.acks().acked_bytes());
    if *plan == CommitPlan::Nothing {
        commit_landed(lanes, acked);
        return None;
    }
    Some(acked)
}

/// A commit that [`commit_planned`] returned `covered` for is in Kafka.
pub fn commit_landed(lanes: [&mut LaneAccount; 2], covered: [u64; 2]) {
    for (lane, covered) in lanes.into_iter().zip(covered) {
        lane.commit_landed(covered);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step on one lane, as the fetcher, the reader and the application take them.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// An append of one record at this offset (100 bytes): the lane fetched past it.
        Append(i64),
        /// The same, made in an earlier layout of the partition and counted late.
        AppendInEarlierLayout(i64),
        HandOut(i64),
        Ack(i64),
    }
    use Step::{Ack, Append, AppendInEarlierLayout, HandOut};

    const LAYOUT: LayoutId = LayoutId(7);

    /// (what happens, the bytes unacknowledged and not handed out after it), for a lane
    /// assigned with records 0..10 processed and 10..12 in the buffer from before.
    #[test]
    fn counts_table() {
        let cases: &[(&str, &[Step], u64, u64)] = &[
            ("nothing yet", &[], 0, 0),
            ("fetched", &[Append(12), Append(13)], 200, 200),
            ("handed out", &[Append(12), HandOut(12)], 100, 0),
            ("acknowledged", &[Append(12), HandOut(12), Ack(12)], 0, 0),
            (
                "acknowledged before its append was counted",
                &[HandOut(12), Ack(12), Append(12)],
                0,
                0,
            ),
            (
                "handed out before its append was counted",
                &[HandOut(12), Append(12)],
                100,
                0,
            ),
            (
                "records from before the assignment are not counted",
                &[HandOut(10), HandOut(11), Ack(10), Append(12)],
                100,
                100,
            ),
            (
                "a late writer's append below the assignment's start is not counted",
                &[Append(11)],
                0,
                0,
            ),
            (
                "an append counted late from an earlier layout is not counted",
                &[AppendInEarlierLayout(12), AppendInEarlierLayout(13)],
                0,
                0,
            ),
            (
                "the same records fetched again into this layout are",
                &[AppendInEarlierLayout(12), Append(12), HandOut(12)],
                100,
                0,
            ),
            (
                "an ack twice frees once",
                &[Append(12), HandOut(12), Ack(12), Ack(12), Append(13)],
                100,
                100,
            ),
            (
                "an ack of what was never handed out frees nothing",
                &[Append(12), Ack(12)],
                100,
                100,
            ),
            (
                "acks in any order",
                &[
                    Append(12),
                    Append(13),
                    HandOut(12),
                    HandOut(13),
                    Ack(13),
                    Ack(12),
                ],
                0,
                0,
            ),
        ];
        for &(name, steps, unacked, undelivered) in cases {
            let mut account = LaneAccount::new(LAYOUT, 10, 12);
            for &step in steps {
                match step {
                    Append(offset) => account.appended(LAYOUT, offset + 1, 100),
                    AppendInEarlierLayout(offset) => account.appended(LayoutId(6), offset + 1, 100),
                    HandOut(offset) => account.hand_out(offset, 100),
                    Ack(offset) => {
                        account.acknowledge(offset);
                    }
                }
            }
            assert_eq!(account.unacked_bytes(), unacked, "{name}: unacknowledged");
            assert_eq!(
                account.undelivered_bytes(),
                undelivered,
                "{name}: not handed out"
            );
        }
    }

    #[test]
    fn an_ack_returns_the_bytes_it_frees_whether_counted_or_not() {
        let mut account = LaneAccount::new(LAYOUT, 10, 12);
        account.hand_out(11, 40);
        account.appended(LAYOUT, 13, 70);
        account.hand_out(12, 70);
        assert_eq!(account.acknowledge(11), 40, "from before the assignment");
        assert_eq!(account.acknowledge(12), 70);
        assert_eq!(account.acknowledge(12), 0, "once");
        assert_eq!(account.acks().committable(), 13);
        assert!(account.balanced());
        account.hand_out(13, 5);
        account.acknowledge(13);
        assert!(
            !account.balanced(),
            "acknowledged, its append not counted yet"
        );
        assert_eq!(account.unacked_bytes(), 0, "read as zero meanwhile");
        assert_eq!(account.counted_behind(), 5, "its count still to come");
        account.appended(LAYOUT, 14, 5);
        assert!(account.balanced());
        assert_eq!(account.counted_behind(), 0);
        assert!(!account.counts(LAYOUT, 12), "held when assigned");
        assert!(!account.counts(LayoutId(6), 20), "another layout's");
        assert!(account.counts(LAYOUT, 13));
    }

    #[test]
    fn a_plan_that_writes_nothing_lands_at_once_and_a_commit_lands_what_it_covered() {
        let mut lanes = [
            LaneAccount::new(LAYOUT, 0, 0),
            LaneAccount::new(LAYOUT, 100, 100),
        ];
        lanes[0].hand_out(0, 10);
        lanes[1].hand_out(100, 20);
        lanes[0].acknowledge(0);
        lanes[1].acknowledge(100);
        let plan = CommitPlan::Plain { offset: 101 };
        let covered = commit_planned(lanes.each_mut(), &plan);
        assert_eq!(covered, Some([10, 20]));
        lanes[1].hand_out(101, 5);
        lanes[1].acknowledge(101);
        commit_landed(lanes.each_mut(), covered.unwrap_or_default());
        let awaiting = lanes.each_ref().map(|lane| lane.acks().awaiting_commit());
        assert_eq!(awaiting, [0, 5], "acknowledged after the plan: waits");
        assert_eq!(commit_planned(lanes.each_mut(), &CommitPlan::Nothing), None);
        let awaiting = lanes.each_ref().map(|lane| lane.acks().awaiting_commit());
        assert_eq!(awaiting, [0, 0]);
    }
}
