//! Whether the brokers can be reached, from what the consumer's clients report. librdkafka
//! reports "all brokers are down" once per state change of each client, through that
//! client's queue, which is served only when the client polls: a paused catch-up consumer or
//! an idle side-log client can serve a report seconds after the brokers came back and other
//! requests got through them (a clean-clone run saw one 6 s late). Taken as the last word,
//! such a late report announces an outage that is over, and with no outage to end, nothing
//! announces its end until the next probe. So once any request has got through, a report is
//! only a suspicion: the live thread probes the brokers, and a probe that fails confirms it,
//! one that gets through drops it. The live thread can be held in a request for up to 30 s
//! (a commit, a rebalance, watermarks) while the brokers are away, and its probe with it: a
//! suspicion that stood [`CONFIRM_AFTER`] with no probe getting through is believed too.
//! Before anything got through there is nothing a report could be late behind: believed.

use std::time::{Duration, Instant};

/// How long a suspected report stands before it is believed with no probe having got
/// through: a probe is due every `fetch::PROBE_EVERY` (2 s) while anything is in doubt, and
/// gives up after 1 s, so a live thread that is free has answered by then.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(5);

/// What the consumer announced about the brokers, and what it suspects.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reachability {
    /// Announced: the brokers cannot be reached (until a request gets through).
    unreachable: bool,
    /// Since when a report that came after a request got through is suspected: believed
    /// once a probe fails, or once it stood [`CONFIRM_AFTER`].
    suspected_since: Option<Instant>,
    /// Whether a request ever got through (a report may be late behind it).
    ever_reached: bool,
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
        if !self.ever_reached {
            return self.announce_unreachable();
        }
        // The first report of a run starts the clock: later ones do not push it back.
        self.suspected_since.get_or_insert(now);
        self.check(now)
    }

    /// A request got through.
    pub fn reached(&mut self) -> Announce {
        self.ever_reached = true;
        self.suspected_since = None;
        if std::mem::take(&mut self.unreachable) {
            Announce::Reachable
        } else {
            Announce::Nothing
        }
    }

    /// A probe of the brokers failed: a suspected report is believed.
    pub fn probe_failed(&mut self) -> Announce {
        if self.suspected_since.is_some() && !self.unreachable {
            self.announce_unreachable()
        } else {
            Announce::Nothing
        }
    }

    /// Looked at `now`: a suspicion that stood [`CONFIRM_AFTER`] with no probe getting
    /// through is believed.
    pub fn check(&mut self, now: Instant) -> Announce {
        let stood = self
            .suspected_since
            .is_some_and(|since| now.saturating_duration_since(since) >= CONFIRM_AFTER);
        if stood && !self.unreachable {
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
        self.unreachable || self.suspected_since.is_some()
    }

    fn announce_unreachable(&mut self) -> Announce {
        self.unreachable = true;
        self.suspected_since = None;
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
                    (|r, _| r.reached(), Reachable, false, false),
                    (|r, _| r.reached(), Nothing, false, false),
                ],
            ),
            (
                // However long after: the clean-clone run that found it served one 6 s late.
                "a late report after a request got through is suspected, then dropped",
                &[
                    (|r, at| r.all_down(at(0)), Unreachable, true, true),
                    (|r, _| r.reached(), Reachable, false, false),
                    (|r, at| r.all_down(at(6_000)), Nothing, false, true),
                    (|r, at| r.check(at(8_000)), Nothing, false, true),
                    (|r, _| r.reached(), Nothing, false, false),
                    (|r, at| r.check(at(20_000)), Nothing, false, false),
                ],
            ),
            (
                "a suspected report is believed once a probe fails",
                &[
                    (|r, _| r.reached(), Nothing, false, false),
                    (|r, at| r.all_down(at(1_999)), Nothing, false, true),
                    (|r, _| r.probe_failed(), Unreachable, true, true),
                    (|r, _| r.probe_failed(), Nothing, true, true),
                    (|r, _| r.reached(), Reachable, false, false),
                ],
            ),
            (
                "a suspicion no probe answered is believed once it stood CONFIRM_AFTER",
                &[
                    (|r, _| r.reached(), Nothing, false, false),
                    (|r, at| r.all_down(at(1_000)), Nothing, false, true),
                    (|r, at| r.all_down(at(4_000)), Nothing, false, true),
                    (|r, at| r.check(at(5_999)), Nothing, false, true),
                    (|r, at| r.check(at(6_000)), Unreachable, true, true),
                    (|r, at| r.check(at(9_000)), Nothing, true, true),
                    (|r, _| r.reached(), Reachable, false, false),
                ],
            ),
            (
                "a report that comes once the suspicion stood is believed at once",
                &[
                    (|r, _| r.reached(), Nothing, false, false),
                    (|r, at| r.all_down(at(0)), Nothing, false, true),
                    (|r, at| r.all_down(at(5_000)), Unreachable, true, true),
                ],
            ),
            (
                "a failed probe or a look with nothing suspected announces nothing",
                &[
                    (|r, _| r.probe_failed(), Nothing, false, false),
                    (|r, at| r.check(at(60_000)), Nothing, false, false),
                ],
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
