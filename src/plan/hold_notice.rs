//! What the log says of the reader's holds for commits (`reader_waits_for_commits`). A hold
//! shorter than a commit's round trip is the reader keeping pace with its commits: a budget
//! small beside the reader's speed (its floor, 1 MiB, is taken between two commits) holds at
//! every cycle, and a warning and an info each time said nothing but that. A hold that lasts
//! is news: commits are not landing. So a hold is warned of once it has lasted
//! [`HOLD_WARN_AFTER`], and its end is told only if it was. This is the reader's hold as a
//! whole: a partition held back alone (its commits fail for good while the others' land,
//! `may_read`) keeps the total below the limit and says nothing here; each of its failed
//! commits is an `Event::Error` already.

use std::time::{Duration, Instant};

/// How long the reader holds back before the log warns of it: far beyond a commit's round
/// trip on a healthy cluster, soon enough for an operator looking at a consumer that stopped.
pub const HOLD_WARN_AFTER: Duration = Duration::from_secs(1);

/// What the log says at one look at the reader's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldNotice {
    /// Nothing above debug: no hold, one too short to tell, or one already told.
    Quiet,
    /// A warning: the reader has held back for `held`, commits not landing.
    Warn {
        /// How long it has held back.
        held: Duration,
    },
    /// An info: the hold warned of ended after `held`.
    Ended {
        /// How long it held back in all.
        held: Duration,
    },
}

/// The reader's hold as the log sees it: when it started, and whether it was warned of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldLog {
    /// When the current hold started (`None`: the reader does not hold back).
    since: Option<Instant>,
    /// Whether the current hold was warned of.
    warned: bool,
}

impl HoldLog {
    /// A look at `now`: whether the reader holds back (`waits`). Returns what to log.
    pub fn look(&mut self, waits: bool, now: Instant) -> HoldNotice {
        match (self.since, waits) {
            (None, false) => HoldNotice::Quiet,
            (None, true) => {
                *self = HoldLog {
                    since: Some(now),
                    warned: false,
                };
                HoldNotice::Quiet
            }
            (Some(since), true) => {
                let held = now.saturating_duration_since(since);
                if self.warned || held < HOLD_WARN_AFTER {
                    return HoldNotice::Quiet;
                }
                self.warned = true;
                HoldNotice::Warn { held }
            }
            (Some(since), false) => {
                let warned = std::mem::take(self).warned;
                match warned {
                    true => HoldNotice::Ended {
                        held: now.saturating_duration_since(since),
                    },
                    false => HoldNotice::Quiet,
                }
            }
        }
    }

    /// Whether the reader holds back, as of the last look.
    pub fn holding(&self) -> bool {
        self.since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_warned_of_once_it_lasts_and_its_end_told_only_then() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let warn_ms = HOLD_WARN_AFTER.as_millis() as u64;
        // (milliseconds, the reader waits) -> what the log says
        let looks: &[(u64, bool, HoldNotice)] = &[
            (0, false, HoldNotice::Quiet),
            // A hold shorter than the warning's wait: a reader keeping pace with its commits.
            (10, true, HoldNotice::Quiet),
            (200, true, HoldNotice::Quiet),
            (300, false, HoldNotice::Quiet),
            // At every cycle again: still quiet.
            (1_300, true, HoldNotice::Quiet),
            (1_400, false, HoldNotice::Quiet),
            // One that lasts: warned of once, its end told.
            (2_000, true, HoldNotice::Quiet),
            (2_000 + warn_ms - 1, true, HoldNotice::Quiet),
            (
                2_000 + warn_ms,
                true,
                HoldNotice::Warn {
                    held: HOLD_WARN_AFTER,
                },
            ),
            (2_000 + warn_ms + 500, true, HoldNotice::Quiet),
            (9_000, true, HoldNotice::Quiet),
            (
                9_500,
                false,
                HoldNotice::Ended {
                    held: Duration::from_millis(7_500),
                },
            ),
            (9_600, false, HoldNotice::Quiet),
            // The next hold starts afresh.
            (10_000, true, HoldNotice::Quiet),
            (
                10_000 + warn_ms,
                true,
                HoldNotice::Warn {
                    held: HOLD_WARN_AFTER,
                },
            ),
        ];
        let mut log = HoldLog::default();
        for &(ms, waits, expected) in looks {
            assert_eq!(
                log.look(waits, at(ms)),
                expected,
                "at {ms} ms, waits {waits}"
            );
            assert_eq!(log.holding(), waits, "at {ms} ms");
        }
    }

    #[test]
    fn an_instant_before_the_holds_start_warns_of_nothing() {
        // Looks are serialized (the callers hold the partitions' lock) and read the clock
        // under it, so this is not expected; the durations saturate rather than panic.
        let start = Instant::now() + Duration::from_secs(5);
        let mut log = HoldLog::default();
        assert_eq!(log.look(true, start), HoldNotice::Quiet);
        assert_eq!(
            log.look(true, start - Duration::from_secs(1)),
            HoldNotice::Quiet
        );
        assert_eq!(
            log.look(false, start - Duration::from_secs(1)),
            HoldNotice::Quiet
        );
    }
}
