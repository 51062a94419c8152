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
}

impl AckTracker {
    /// Nothing delivered; everything below `start` is processed.
    pub fn new(start: i64) -> Self {
        Self {
            committable: start,
            outstanding: VecDeque::new(),
            delivered_next: start,
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
}

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
