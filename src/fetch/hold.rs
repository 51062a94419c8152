//! What an out-of-range error means for one partition, and how long a partition whose
//! position lies past the log end waits before it is fetched there again.
//!
//! An out-of-range error stops the partition's fetch (the consumers run with
//! `auto.offset.reset=error`, so librdkafka never jumps by itself). Once the partition's
//! watermarks are read, either retention deleted offsets the lane still needed (continue at
//! the log start, reporting the truncation), or the log ends below the position (an unclean
//! leader election truncated it: only waiting for it to grow back helps), or the position is
//! inside the log after all (the error was about another partition, or the log grew back).

use std::time::{Duration, Instant};

/// The first wait of a partition whose position lies past the log end.
pub const HOLD_FIRST: Duration = Duration::from_secs(1);
/// The longest wait: a log that stays short is looked at twice a minute.
pub const HOLD_MAX: Duration = Duration::from_secs(30);

/// Where a position stands against the log, read after an out-of-range error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Retention deleted `[at, low)`: record them covered and continue at `low`.
    BelowLogStart,
    /// The log ends below the position: wait, then fetch there again.
    PastLogEnd,
    /// Inside the log: fetch there again now.
    InsideLog,
}

/// Where position `at` stands in a log that spans `[low, high)`.
pub fn standing(at: i64, low: i64, high: i64) -> Standing {
    if at < low {
        Standing::BelowLogStart
    } else if at > high {
        Standing::PastLogEnd
    } else {
        Standing::InsideLog
    }
}

/// A partition's wait before it is repositioned again: after each [`hold`](Self::hold) the
/// wait doubles, from [`HOLD_FIRST`] up to [`HOLD_MAX`]; [`release`](Self::release) ends it
/// and starts the next run of waits from the first again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hold {
    until: Option<Instant>,
    next_wait: Option<Duration>,
}

impl Hold {
    /// Holds the partition from `now` for the next wait; returns that wait.
    pub fn hold(&mut self, now: Instant) -> Duration {
        let wait = self.next_wait.unwrap_or(HOLD_FIRST);
        self.until = Some(now + wait);
        self.next_wait = Some((wait * 2).min(HOLD_MAX));
        wait
    }

    /// Whether the partition must not be repositioned at `now`.
    pub fn holds(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// How long the hold lasts from `now` (zero when it does not hold).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.until
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
    }

    /// The position is inside the log again: no wait, and the next hold starts short.
    pub fn release(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standing_table() {
        for (at, low, high, expected) in [
            (10, 50, 100, Standing::BelowLogStart),
            (49, 50, 100, Standing::BelowLogStart),
            (50, 50, 100, Standing::InsideLog),
            (100, 50, 100, Standing::InsideLog), // the log end: waiting for the next record
            (101, 50, 100, Standing::PastLogEnd),
            (0, 0, 0, Standing::InsideLog),
            (7, 0, 0, Standing::PastLogEnd), // truncated to nothing
        ] {
            assert_eq!(standing(at, low, high), expected, "{at} in [{low}, {high})");
        }
    }

    #[test]
    fn holds_double_up_to_the_longest_and_start_over_after_a_release() {
        let start = Instant::now();
        let mut hold = Hold::default();
        assert!(!hold.holds(start));
        let waits: Vec<u64> = (0..7).map(|_| hold.hold(start).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert!(hold.holds(start + Duration::from_secs(29)));
        assert_eq!(
            hold.remaining(start + Duration::from_secs(29)),
            Duration::from_secs(1)
        );
        assert_eq!(hold.remaining(start + HOLD_MAX), Duration::ZERO);
        assert!(!hold.holds(start + HOLD_MAX));
        hold.release();
        assert!(!hold.holds(start));
        assert_eq!(hold.hold(start), HOLD_FIRST);
    }
}
