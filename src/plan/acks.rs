//! Which offsets of a lane are processed: deliveries in order, acknowledgements in any order,
//! and the committable offset — the first delivered offset not yet acknowledged.

use std::collections::VecDeque;

/// One delivery not yet known processed: its offset, whether it is acked, its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outstanding {
    offset: i64,
    acked: bool,
    bytes: usize,
}

/// Tracks deliveries and acks of one lane of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckTracker {
    /// Everything below is processed.
    committable: i64,
    /// Delivered and not yet below `committable`, by increasing offset (deliveries come in
    /// order: a queue, no allocation per record; an ack finds its entry by binary search).
    outstanding: VecDeque<Outstanding>,
    /// Where the next delivery's range starts (the offset after the last delivered, or after
    /// a gap the reader skipped).
    delivered_next: i64,
    /// Bytes acknowledged so far, in all.
    acked_bytes: u64,
    /// Of `acked_bytes`, those no longer waiting for a commit ([`commit_landed`]).
    ///
    /// [`commit_landed`]: Self::commit_landed
    landed_bytes: u64,
}

impl AckTracker {
    /// Nothing delivered; everything below `start` is processed.
    pub fn new(start: i64) -> Self {
        Self {
            committable: start,
            outstanding: VecDeque::new(),
            delivered_next: start,
            acked_bytes: 0,
            landed_bytes: 0,
        }
    }

    /// Records that `offset` (of `bytes` bytes) was handed to the application. Offsets must
    /// increase; offsets between deliveries (compaction, markers) count as processed once
    /// everything before them is. Whether it was recorded (an offset below the last one
    /// delivered is not).
    pub fn delivered(&mut self, offset: i64, bytes: usize) -> bool {
        if offset < self.delivered_next {
            return false;
        }
        self.outstanding.push_back(Outstanding {
            offset,
            acked: false,
            bytes,
        });
        self.delivered_next = offset + 1;
        true
    }

    /// Marks the lane read through `next` (exclusive) even where no record was delivered.
    pub fn read_through(&mut self, next: i64) {
        self.delivered_next = self.delivered_next.max(next);
        self.advance();
    }

    /// Acknowledges `offset`; returns the bytes it frees once committed (0 if unknown).
    pub fn ack(&mut self, offset: i64) -> usize {
        // Most acks come in delivery order: the oldest outstanding delivery is the one, and
        // it leaves the queue at once, without a search.
        if let Some(first) = self.outstanding.front()
            && first.offset == offset
            && !first.acked
        {
            let bytes = first.bytes;
            self.outstanding.pop_front();
            self.advance();
            self.acked_bytes += bytes as u64;
            return bytes;
        }
        let bytes = match self
            .outstanding
            .binary_search_by_key(&offset, |entry| entry.offset)
        {
            Ok(index) => match self.outstanding.get_mut(index) {
                Some(entry) if !entry.acked => {
                    entry.acked = true;
                    entry.bytes
                }
                _ => 0,
            },
            Err(_) => 0,
        };
        self.advance();
        self.acked_bytes += bytes as u64;
        bytes
    }

    fn advance(&mut self) {
        while let Some(first) = self.outstanding.front() {
            if !first.acked {
                self.committable = self.committable.max(first.offset);
                return;
            }
            self.outstanding.pop_front();
        }
        self.committable = self.committable.max(self.delivered_next);
    }

    /// The offset Kafka may hold: every offset below it is processed.
    pub fn committable(&self) -> i64 {
        self.committable
    }

    /// Delivered records not acknowledged yet.
    pub fn unacked(&self) -> usize {
        self.outstanding.iter().filter(|entry| !entry.acked).count()
    }

    /// The offset after the last delivered record (or read-through point).
    pub fn delivered_next(&self) -> i64 {
        self.delivered_next
    }

    /// Bytes acknowledged so far, in all: what a commit planned now covers, to be handed to
    /// [`commit_landed`](Self::commit_landed) once it is in Kafka.
    pub fn acked_bytes(&self) -> u64 {
        self.acked_bytes
    }

    /// A commit planned when [`acked_bytes`](Self::acked_bytes) was `covered` is in Kafka,
    /// or its plan had nothing to write: those bytes wait for no commit any more. Also the
    /// acknowledgements the commit could not cover (behind an unacknowledged delivery, a
    /// live lane whose side entry is not written yet): they wait for the application or the
    /// partition's state, which no further commit of the same plan changes.
    pub fn commit_landed(&mut self, covered: u64) {
        self.landed_bytes = self.landed_bytes.max(covered.min(self.acked_bytes));
    }

    /// Bytes acknowledged whose commit has not landed: what the buffer keeps only until it
    /// does (see [`reader_waits_for_commits`]).
    pub fn awaiting_commit(&self) -> u64 {
        self.acked_bytes - self.landed_bytes
    }
}

/// Whether the reader holds back because `awaiting_commit` bytes the application
/// acknowledged (all partitions) wait for commits that have not landed, under a byte budget
/// of `budget_bytes`: from an eighth of it on, and never below [`COMMIT_WAIT_FLOOR`]. A
/// commit is due every 32nd of the budget, so this is reached only when commits fail, or
/// take longer than the reader needs for an eighth of the budget (a broker that stops
/// answering, a coordinator that moves); the buffer keeps those records until their commit
/// lands, and without the hold a fast reader had half the budget of them in memory within a
/// second (peak RSS above 256 MiB with the default budget). Unacknowledged deliveries never
/// count: an application that acknowledges a batch once it has all of it would wait for
/// good. While it holds back, the reader reads only the partitions [`may_read`] lets it.
pub fn reader_waits_for_commits(awaiting_commit: u64, budget_bytes: u64) -> bool {
    awaiting_commit >= commit_wait_limit(budget_bytes)
}

/// What may wait for commits under a byte budget of `budget_bytes`.
fn commit_wait_limit(budget_bytes: u64) -> u64 {
    (budget_bytes / 8).max(COMMIT_WAIT_FLOOR)
}

/// Whether the reader may read a partition of which `partition_awaiting` acknowledged bytes
/// wait for a commit, while `total_awaiting` do of all `partitions`: always, unless the
/// reader holds back ([`reader_waits_for_commits`]), and then only below the partition's
/// even share of what may wait. A partition whose commits fail (a side topic it may not
/// write, say) waits once it holds its share; the others go on, each up to its share per
/// commit of theirs that lands — where waiting until nothing of theirs waited gave them one
/// read per commit. What waits stays within the limit and one read per partition.
pub fn may_read(
    partition_awaiting: u64,
    total_awaiting: u64,
    partitions: usize,
    budget_bytes: u64,
) -> bool {
    let limit = commit_wait_limit(budget_bytes);
    let share = limit / partitions.max(1) as u64;
    total_awaiting < limit || partition_awaiting == 0 || partition_awaiting < share
}

/// What may wait for commits whatever the budget: with a tiny budget an eighth of it would
/// hold the reader at every commit's round trip (commits are at most every 20 ms), where it
/// only has to stop running away from commits that do not land.
pub const COMMIT_WAIT_FLOOR: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committable_is_the_first_unacked_delivery() {
        let mut acks = AckTracker::new(70);
        for offset in [70, 71, 72, 75] {
            acks.delivered(offset, 10);
        }
        assert_eq!(acks.committable(), 70);
        assert_eq!(acks.ack(71), 10);
        assert_eq!(acks.committable(), 70, "70 is still unacked");
        acks.ack(70);
        assert_eq!(acks.committable(), 72);
        acks.ack(75);
        assert_eq!(acks.committable(), 72);
        acks.ack(72);
        assert_eq!(
            acks.committable(),
            76,
            "the gap 73..75 is covered once 72 and 75 are done"
        );
        assert_eq!(acks.ack(72), 0, "a second ack frees nothing");
        assert_eq!(acks.unacked(), 0);
    }

    #[test]
    fn acknowledged_bytes_wait_for_the_commit_planned_after_them() {
        let mut acks = AckTracker::new(0);
        for offset in 0..4 {
            acks.delivered(offset, 10);
        }
        acks.ack(0);
        acks.ack(2);
        assert_eq!(acks.awaiting_commit(), 20, "out of order counts too");
        let planned = acks.acked_bytes();
        acks.ack(1);
        acks.commit_landed(planned);
        assert_eq!(
            acks.awaiting_commit(),
            10,
            "acked after the plan: still waits"
        );
        acks.commit_landed(planned);
        acks.commit_landed(0);
        assert_eq!(
            acks.awaiting_commit(),
            10,
            "an older commit lands nothing more"
        );
        acks.commit_landed(u64::MAX);
        assert_eq!(
            acks.awaiting_commit(),
            0,
            "never more than was acknowledged"
        );
        acks.ack(3);
        assert_eq!(acks.awaiting_commit(), 10);
        acks.ack(3);
        assert_eq!(acks.awaiting_commit(), 10, "a second ack adds nothing");
    }

    #[test]
    fn the_reader_waits_from_an_eighth_of_the_budget_awaiting_commits_or_the_floor() {
        // (awaiting commit, budget) → the reader waits
        let table = [
            (0, 256 << 20, false),
            (8 << 20, 256 << 20, false),
            ((32 << 20) - 1, 256 << 20, false),
            (32 << 20, 256 << 20, true),
            // Small budgets: the floor.
            (0, 0, false),
            (64 << 10, 0, false),
            ((1 << 20) - 1, 64 << 10, false),
            (1 << 20, 64 << 10, true),
            (1 << 20, 8 << 20, true),
        ];
        for (awaiting, budget, waits) in table {
            assert_eq!(
                reader_waits_for_commits(awaiting, budget),
                waits,
                "{awaiting} bytes awaiting, budget {budget}"
            );
        }
    }

    #[test]
    fn a_partition_below_its_share_is_read_while_the_reader_holds_back() {
        const LIMIT: u64 = 32 << 20;
        const BUDGET: u64 = 8 * LIMIT;
        // (this partition's awaiting, all partitions', partitions) → may read
        let table = [
            (0, 0, 8, true),
            (LIMIT - 1, LIMIT - 1, 1, true),
            (LIMIT, LIMIT, 1, false),
            // Eight partitions: a share of 4 MiB each.
            (0, LIMIT, 8, true),
            ((4 << 20) - 1, LIMIT, 8, true),
            (4 << 20, LIMIT, 8, false),
            (LIMIT, LIMIT, 8, false),
            ((4 << 20) - 1, 10 * LIMIT, 8, true),
            // More partitions than bytes in the limit: only those with nothing waiting.
            (0, LIMIT, usize::MAX, true),
            (1, LIMIT, usize::MAX, false),
        ];
        for (partition, total, partitions, may) in table {
            assert_eq!(
                may_read(partition, total, partitions, BUDGET),
                may,
                "{partition} of {total} awaiting over {partitions} partitions"
            );
        }
    }

    #[test]
    fn read_through_covers_gaps_at_the_end() {
        let mut acks = AckTracker::new(0);
        acks.delivered(0, 1);
        acks.read_through(10);
        assert_eq!(acks.committable(), 0);
        acks.ack(0);
        assert_eq!(acks.committable(), 10);
        assert!(!acks.delivered(5, 1), "below delivered_next: ignored");
        assert_eq!(acks.committable(), 10);
    }

    proptest::proptest! {
        /// In order, out of order, twice or unknown: the committable offset is always the
        /// first delivered offset not acknowledged (or the end of what was delivered), and
        /// each delivery's bytes are freed once.
        #[test]
        fn acks_in_any_order_match_a_model(
            gaps in proptest::collection::vec(0i64..3, 1..40),
            order in proptest::collection::vec(0usize..64, 0..80),
        ) {
            let mut acks = AckTracker::new(100);
            let mut offsets = Vec::new();
            let mut next = 100;
            for gap in gaps {
                next += gap;
                proptest::prop_assert!(acks.delivered(next, next as usize));
                offsets.push(next);
                next += 1;
            }
            let mut done = std::collections::BTreeSet::new();
            for pick in order {
                // Every other pick acks the oldest outstanding one: the in-order path.
                let offset = if pick % 2 == 0 {
                    offsets.iter().copied().find(|o| !done.contains(o)).unwrap_or(next)
                } else {
                    offsets[pick % offsets.len()]
                };
                let expected = if offsets.contains(&offset) && done.insert(offset) {
                    offset as usize
                } else {
                    0
                };
                proptest::prop_assert_eq!(acks.ack(offset), expected);
                let first_open = offsets.iter().copied().find(|o| !done.contains(o));
                proptest::prop_assert_eq!(acks.committable(), first_open.unwrap_or(next));
                proptest::prop_assert_eq!(acks.unacked(), offsets.len() - done.len());
            }
        }
    }
}
