//! Whether the brokers can be reached, from what the consumer's clients report. librdkafka
//! reports "all brokers are down" once per state change of each client, through that
//! client's queue, which is served when the client polls: a report can reach the consumer
//! after a request of another client has already got through the brokers that came back.
//! Taken as the last word, such a late report announces an outage that is over (and the
//! next probe announces the end of it again). So a report that comes within
//! [`STALE_AFTER_REACHED`] of a request that got through is only a suspicion: the consumer
//! keeps probing, and the next probe that fails confirms it.

use std::time::{Duration, Instant};

/// How soon after a request got through an "all brokers are down" report is suspected of
/// being late, rather than believed. The probe runs this often while anything is in doubt.
pub const STALE_AFTER_REACHED: Duration = Duration::from_secs(2);

/// What the consumer announced about the brokers, and what it suspects.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reachability {
    /// Announced: the brokers cannot be reached (until a request gets through).
    unreachable: bool,
    /// A report that came right after a request got through: believed once a probe fails.
    suspected: bool,
    /// When a request last got through.
    last_reached: Option<Instant>,
}

/// What to announce after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announce {
    /// Nothing changes for the operator.
    Nothing,
    /// The brokers cannot be reached.
    Unreachable,
    /// They can again.
    Reachable,
}

impl Reachability {
    /// A client reported at `now` that no broker can be reached.
    pub fn all_down(&mut self, now: Instant) -> Announce {
        if self.unreachable {
            return Announce::Nothing;
        }
        let late = self
            .last_reached
            .is_some_and(|reached| now.saturating_duration_since(reached) < STALE_AFTER_REACHED);
        if late {
            self.suspected = true;
            Announce::Nothing
        } else {
            self.announce_unreachable()
        }
    }

    /// A request got through at `now`.
    pub fn reached(&mut self, now: Instant) -> Announce {
        self.last_reached = Some(now);
        self.suspected = false;
        if std::mem::take(&mut self.unreachable) {
            Announce::Reachable
        } else {
            Announce::Nothing
        }
    }

    /// A probe of the brokers failed: a suspected report is believed.
    pub fn probe_failed(&mut self) -> Announce {
        if self.suspected && !self.unreachable {
            self.announce_unreachable()
        } else {
            Announce::Nothing
        }
    }

    /// Announced: the brokers cannot be reached.
    pub fn unreachable(&self) -> bool {
        self.unreachable
    }

    /// Whether anything is in doubt: the brokers are unreachable, or suspected to be (the
    /// consumer probes them until it knows).
    pub fn in_doubt(&self) -> bool {
        self.unreachable || self.suspected
    }

    fn announce_unreachable(&mut self) -> Announce {
        self.unreachable = true;
        self.suspected = false;
        Announce::Unreachable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reachability_table() {
        let start = Instant::now();
        let at = |millis: u64| start + Duration::from_millis(millis);
        use Announce::*;
        // (step, expected announcement, unreachable after, in doubt after)
        type Step = fn(&mut Reachability, &dyn Fn(u64) -> Instant) -> Announce;
        type Case = (&'static str, &'static [(Step, Announce, bool, bool)]);
        let cases: &[Case] = &[
            (
                "a first report is believed: nothing got through yet",
                &[(|r, at| r.all_down(at(0)), Unreachable, true, true)],
            ),
            (
                "one announcement per outage, one per recovery",
                &[
                    (|r, at| r.all_down(at(0)), Unreachable, true, true),
                    (|r, at| r.all_down(at(100)), Nothing, true, true),
                    (|r, at| r.reached(at(5_000)), Reachable, false, false),
                    (|r, at| r.reached(at(5_100)), Nothing, false, false),
                ],
            ),
            (
                "a late report after a request got through is suspected, then dropped",
                &[
                    (|r, at| r.all_down(at(0)), Unreachable, true, true),
                    (|r, at| r.reached(at(5_000)), Reachable, false, false),
                    (|r, at| r.all_down(at(5_300)), Nothing, false, true),
                    (|r, at| r.reached(at(7_000)), Nothing, false, false),
                ],
            ),
            (
                "a suspected report is believed once a probe fails",
                &[
                    (|r, at| r.reached(at(0)), Nothing, false, false),
                    (|r, at| r.all_down(at(1_999)), Nothing, false, true),
                    (|r, _| r.probe_failed(), Unreachable, true, true),
                    (|r, _| r.probe_failed(), Nothing, true, true),
                    (|r, at| r.reached(at(9_000)), Reachable, false, false),
                ],
            ),
            (
                "a report long after the last request got through is believed",
                &[
                    (|r, at| r.reached(at(0)), Nothing, false, false),
                    (|r, at| r.all_down(at(2_000)), Unreachable, true, true),
                ],
            ),
            (
                "a failed probe with nothing suspected announces nothing",
                &[(|r, _| r.probe_failed(), Nothing, false, false)],
            ),
        ];
        for (name, steps) in cases {
            let mut reachability = Reachability::default();
            for (index, (step, announce, unreachable, in_doubt)) in steps.iter().enumerate() {
                assert_eq!(
                    step(&mut reachability, &at),
                    *announce,
                    "{name}: step {index}"
                );
                assert_eq!(
                    (reachability.unreachable(), reachability.in_doubt()),
                    (*unreachable, *in_doubt),
                    "{name}: after step {index}"
                );
            }
        }
    }
}
