//! The byte budget as a pause policy: which partitions a fetcher pauses and resumes.

use std::collections::{BTreeMap, BTreeSet};

use crate::store::Lane;

/// A lane stops reading ahead of the reader once it is its share divided by this ahead, or
/// one fetch of a partition within half its share, where that is more ([`read_ahead_share`];
/// decided once a round: the round that crosses it may poll one queue's worth more).
pub const READ_AHEAD_DIVISOR: u64 = 8;

/// A lane's read-ahead: an eighth of its share of the budget (`limit` over `slots`,
/// [`READ_AHEAD_DIVISOR`]), but at least what one fetch may bring of a partition
/// (`fetch_bytes`), and at most half the share.
///
/// * A read-ahead under one fetch held the lane after each fetch: at 64 partitions the
///   default budget gave 256 KiB, a quarter of librdkafka's 1 MiB, and a held lane in a
///   shared queue is paused, which drops what librdkafka fetched for it meanwhile
///   (`docs/performance.md`).
/// * Half the share keeps a hold ahead of the budget's pause (bytes not taken are never
///   more than bytes not acknowledged: a read-ahead of the whole share would pause the lane
///   in the round it is held, dropping its prefetch), and bounds what all lanes read ahead
///   together to half the budget.
pub fn read_ahead_share(limit: u64, slots: usize, fetch_bytes: u64) -> u64 {
    let share = limit / slots.max(1) as u64;
    (share / READ_AHEAD_DIVISOR).max(fetch_bytes).min(share / 2)
}

/// Bytes a lane that is not held may still poll this round: what is left of its read-ahead
/// (`read_ahead` bytes, `None` before the budget was first measured: no bound) once `ahead`
/// bytes are fetched and not taken — at least one, so a read-ahead of 0 (a budget under a
/// few bytes a lane) slows the lane to a message a round instead of stopping it for good.
pub fn read_ahead_room(read_ahead: Option<u64>, ahead: u64) -> u64 {
    read_ahead.map_or(u64::MAX, |read_ahead| {
        read_ahead.saturating_sub(ahead).max(1)
    })
}

/// Who fetches into one of a consumer's fetch queues, as a round takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueOwner {
    /// One partition alone, `held` to its read-ahead or with `room` bytes left of it
    /// ([`read_ahead_room`]; `u64::MAX` for a fetcher without a budget).
    Sole { held: bool, room: u64 },
    /// Several partitions.
    Shared,
}

/// What a round takes from one fetch queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueTake {
    /// Entries at most.
    pub most: usize,
    /// Bytes of records at most (`u64::MAX`: no bound).
    pub room: u64,
}

/// What a round takes from a fetch queue that holds `queued` entries now: nothing from a
/// queue of one held partition (what waits there stays, in order, and librdkafka stops
/// fetching once it is full); up to `per_round` entries and the partition's room from a
/// queue of one that is not held; what a shared queue holds, whatever anyone's room (a held
/// partition there is paused: [`PausedHolds`](super::PausedHolds), and librdkafka drops what
/// it prefetched of it, so what is left behind in the queue would be fetched again).
pub fn queue_take(owner: QueueOwner, queued: usize, per_round: usize) -> Option<QueueTake> {
    match owner {
        QueueOwner::Sole { held: true, .. } => None,
        QueueOwner::Sole { held: false, room } => Some(QueueTake {
            most: per_round,
            room,
        }),
        QueueOwner::Shared => Some(QueueTake {
            most: queued,
            room: u64::MAX,
        }),
    }
}

/// How many entries the next call takes from a queue taken up to `room` bytes (`u64::MAX`:
/// no bound, `most_per_call` each): one first, to tell a record's size, then as many as the
/// room left holds at the average size of the `taken` so far (`bytes`), between one and
/// `most_per_call`.
pub fn next_run(room: u64, taken: usize, bytes: u64, most_per_call: usize) -> usize {
    if room == u64::MAX {
        return most_per_call;
    }
    if taken == 0 {
        return 1;
    }
    let average = (bytes / taken as u64).max(1);
    usize::try_from(room / average)
        .unwrap_or(usize::MAX)
        .clamp(1, most_per_call)
}

/// Bytes of a partition's `lane` that count against its read-ahead: what the lane fetched
/// and the reader has not taken (`undelivered`), if the reader could take it now. In an
/// in-order mode (`fresh_first` false) a live lane whose backlog is not handed out yet
/// (`backlog_handed_out` false) waits by design — the budget's share bounds it, and sled is
/// where it waits — so it counts none and is never held.
pub fn read_ahead_bytes(
    lane: Lane,
    fresh_first: bool,
    backlog_handed_out: bool,
    undelivered: u64,
) -> u64 {
    let waits_behind_backlog = lane == Lane::Live && !fresh_first && !backlog_handed_out;
    if waits_behind_backlog { 0 } else { undelivered }
}

/// A pause or resume the fetcher must apply to its consumer (and report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseChange<K> {
    /// The partition.
    pub partition: K,
    /// `true`: pause it; `false`: resume it.
    pub paused: bool,
    /// The partition's unacknowledged bytes in this fetcher's lane.
    pub buffered_bytes: u64,
    /// The share of the budget the partition was measured against.
    pub share: u64,
}

/// Keeps the buffer within its byte budget, one partition at a time.
///
/// The budget is divided evenly over the *slots* — the lanes being fetched, over all
/// partitions and both fetchers — so the buffer as a whole stays within it. A fetcher pauses a
/// partition whose bytes in its lane exceed one share and resumes it at half a share. A
/// partition is paused only for its own bytes: in `Ordered` mode a split partition whose live
/// records cannot be delivered before its backlog pauses its own live lane, never the
/// others'.
#[derive(Debug, Clone, Default)]
pub struct PausePolicy<K> {
    paused: BTreeSet<K>,
}

impl<K: Ord + Clone> PausePolicy<K> {
    /// Nothing paused.
    pub fn new() -> Self {
        Self {
            paused: BTreeSet::new(),
        }
    }

    /// Whether `partition` is paused.
    pub fn is_paused(&self, partition: &K) -> bool {
        self.paused.contains(partition)
    }

    /// Whether any partition is paused.
    pub fn any_paused(&self) -> bool {
        !self.paused.is_empty()
    }

    /// Decides the changes for this round. `usage` holds every partition the fetcher fetches
    /// with its unacknowledged bytes; a partition no longer in it is forgotten (its consumer
    /// assignment is gone, and so is the pause).
    pub fn decide(
        &mut self,
        limit: u64,
        slots: usize,
        usage: &BTreeMap<K, u64>,
    ) -> Vec<PauseChange<K>> {
        self.decide_share(limit / slots.max(1) as u64, usage)
    }

    /// As [`decide`](Self::decide), against a `share` given for each partition.
    pub fn decide_share(&mut self, share: u64, usage: &BTreeMap<K, u64>) -> Vec<PauseChange<K>> {
        self.paused
            .retain(|partition| usage.contains_key(partition));
        let mut changes = Vec::new();
        for (partition, &bytes) in usage {
            let paused = self.paused.contains(partition);
            let change = if !paused && bytes > share {
                Some(true)
            } else if paused && bytes <= share / 2 {
                Some(false)
            } else {
                None
            };
            if let Some(pause) = change {
                if pause {
                    self.paused.insert(partition.clone());
                } else {
                    self.paused.remove(partition);
                }
                changes.push(PauseChange {
                    partition: partition.clone(),
                    paused: pause,
                    buffered_bytes: bytes,
                    share,
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_taken_by_who_fetches_into_it() {
        let sole = |held, room| QueueOwner::Sole { held, room };
        let take = |most, room| Some(QueueTake { most, room });
        let cases = [
            (sole(true, 4096), 50, None),
            (sole(false, 4096), 50, take(2000, 4096)),
            (sole(false, u64::MAX), 50, take(2000, u64::MAX)),
            // Shared: what it holds now, a held partition's entries included.
            (QueueOwner::Shared, 50, take(50, u64::MAX)),
            (QueueOwner::Shared, 0, take(0, u64::MAX)),
        ];
        for (owner, queued, expected) in cases {
            assert_eq!(
                queue_take(owner, queued, 2000),
                expected,
                "{owner:?}, {queued}"
            );
        }
    }

    #[test]
    fn runs_are_sized_to_the_room_left() {
        // (room, taken, bytes) → next run, at most 256 a call
        for (room, taken, bytes, expected) in [
            (u64::MAX, 0, 0, 256),
            (u64::MAX, 500, 50_000, 256),
            (10_000, 0, 0, 1),
            (10_000, 1, 100, 100),
            (100_000, 10, 1_000, 256),
            (50, 4, 400, 1),
            (0, 4, 400, 1),
        ] {
            assert_eq!(
                next_run(room, taken, bytes, 256),
                expected,
                "room {room}, {taken} taken, {bytes} bytes"
            );
        }
    }

    #[test]
    fn pauses_above_a_share_and_resumes_below_half() {
        let mut policy = PausePolicy::new();
        let usage = |a, b| BTreeMap::from([("a", a), ("b", b)]);
        // 1000 bytes over 4 slots: 250 each.
        assert_eq!(policy.decide(1000, 4, &usage(100, 200)), vec![]);
        let changes = policy.decide(1000, 4, &usage(251, 200));
        assert_eq!(changes.len(), 1);
        assert_eq!((changes[0].partition, changes[0].paused), ("a", true));
        assert!(policy.is_paused(&"a"));
        assert!(policy.any_paused());
        // Still above half a share: stays paused; the other partition is not affected.
        assert_eq!(policy.decide(1000, 4, &usage(200, 240)), vec![]);
        let changes = policy.decide(1000, 4, &usage(125, 240));
        assert_eq!((changes[0].partition, changes[0].paused), ("a", false));
        assert!(!policy.any_paused());
    }

    #[test]
    fn a_read_ahead_is_an_eighth_of_a_share_and_at_least_one_fetch_within_half_the_share() {
        const MIB: u64 = 1 << 20;
        // (budget, slots, one fetch of a partition) -> read-ahead.
        let table = [
            // 8 partitions, both lanes, the default budget: an eighth of 16 MiB.
            ((256 * MIB, 16, MIB), 2 * MIB),
            // 64 partitions: an eighth of a share (2 MiB) is 256 KiB; one fetch instead.
            ((256 * MIB, 128, MIB), MIB),
            // A larger fetch, within half the share.
            ((256 * MIB, 128, 3 * MIB / 4), 3 * MIB / 4),
            ((256 * MIB, 128, 4 * MIB), MIB),
            // 128 partitions: one fetch is the whole share; half of it.
            ((256 * MIB, 256, MIB), MIB / 2),
            // A small budget at 8 partitions: half of the 1 MiB share, never all of it.
            ((16 * MIB, 16, MIB), MIB / 2),
            // A budget of a few bytes (`tests/tiny_budget.rs`).
            ((40, 4, MIB), 5),
            ((0, 4, MIB), 0),
            // No slot yet counts as one.
            ((8 * MIB, 0, MIB), MIB),
        ];
        for ((limit, slots, fetch_bytes), expected) in table {
            assert_eq!(
                read_ahead_share(limit, slots, fetch_bytes),
                expected,
                "budget {limit}, {slots} slots, fetch {fetch_bytes}"
            );
        }
    }

    #[test]
    fn a_share_given_decides_as_the_budget_divided() {
        let usage = BTreeMap::from([("a", 300), ("b", 100)]);
        let (mut divided, mut given) = (PausePolicy::new(), PausePolicy::new());
        assert_eq!(
            divided.decide(1000, 4, &usage),
            given.decide_share(250, &usage)
        );
        assert!(given.is_paused(&"a") && !given.is_paused(&"b"));
    }

    #[test]
    fn a_lane_not_held_polls_what_is_left_of_its_read_ahead_and_at_least_one_byte() {
        // (read-ahead, bytes ahead) -> room.
        let table = [
            ((None, 0), u64::MAX),
            ((None, 5_000), u64::MAX),
            ((Some(2_000), 0), 2_000),
            ((Some(2_000), 1_500), 500),
            ((Some(2_000), 2_000), 1),
            ((Some(2_000), 9_000), 1),
            ((Some(0), 0), 1),
        ];
        for ((read_ahead, ahead), room) in table {
            assert_eq!(
                read_ahead_room(read_ahead, ahead),
                room,
                "read-ahead {read_ahead:?}, {ahead} bytes ahead"
            );
        }
    }

    #[test]
    fn only_a_live_lane_behind_its_backlog_in_order_reads_ahead_nothing() {
        // (lane, fresh first, backlog handed out) -> counted bytes of 100 undelivered.
        let table = [
            ((Lane::Live, false, false), 0),
            ((Lane::Live, false, true), 100),
            ((Lane::Live, true, false), 100),
            ((Lane::Live, true, true), 100),
            ((Lane::Catchup, false, false), 100),
            ((Lane::Catchup, false, true), 100),
            ((Lane::Catchup, true, false), 100),
            ((Lane::Catchup, true, true), 100),
        ];
        for ((lane, fresh_first, handed_out), counted) in table {
            assert_eq!(
                read_ahead_bytes(lane, fresh_first, handed_out, 100),
                counted,
                "{lane:?}, fresh first {fresh_first}, backlog handed out {handed_out}"
            );
        }
    }

    #[test]
    fn a_partition_that_leaves_is_forgotten() {
        let mut policy = PausePolicy::new();
        policy.decide(100, 1, &BTreeMap::from([("a", 500)]));
        assert!(policy.is_paused(&"a"));
        assert_eq!(policy.decide(100, 1, &BTreeMap::new()), vec![]);
        assert!(!policy.is_paused(&"a"));
    }
}
