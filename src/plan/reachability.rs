//! Whether the brokers can be reached, from what the consumer's clients report. librdkafka
//! reports "all brokers are down" once per state change of each client, through that
//! client's queue, which is served only when the client polls: a paused catch-up consumer or
//! an idle side-log client can serve a report seconds after the brokers came back and other
//! requests got through them (a clean-clone run saw one 6 s late). Taken as the last word,
//! such a late report announces an outage that is over, and with no outage to end, nothing
//! announces its end until the next probe. So once any request has got through, a report is
//! only a suspicion: the consumer keeps probing, and the next probe that fails confirms it
//! (an outage is announced one probe later, at most `fetch::PROBE_EVERY` and the probe's
//! timeout). Before anything got through there is nothing a report could be late behind.

/// What the consumer announced about the brokers, and what it suspects.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reachability {
    /// Announced: the brokers cannot be reached (until a request gets through).
    unreachable: bool,
    /// A report that came after a request got through: believed once a probe fails.
    suspected: bool,
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
    /// A client reported that no broker can be reached.
    pub fn all_down(&mut self) -> Announce {
        if self.unreachable {
            return Announce::Nothing;
        }
        if self.ever_reached {
            self.suspected = true;
            Announce::Nothing
        } else {
            self.announce_unreachable()
        }
    }

    /// A request got through.
    pub fn reached(&mut self) -> Announce {
        self.ever_reached = true;
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
        use Announce::*;
        // (step, expected announcement, unreachable after, in doubt after)
        type Step = fn(&mut Reachability) -> Announce;
        type Case = (&'static str, &'static [(Step, Announce, bool, bool)]);
        const DOWN: Step = Reachability::all_down;
        const REACHED: Step = Reachability::reached;
        const PROBE_FAILED: Step = Reachability::probe_failed;
        let cases: &[Case] = &[
            (
                "a first report is believed: nothing got through yet",
                &[(DOWN, Unreachable, true, true)],
            ),
            (
                "one announcement per outage, one per recovery",
                &[
                    (DOWN, Unreachable, true, true),
                    (DOWN, Nothing, true, true),
                    (REACHED, Reachable, false, false),
                    (REACHED, Nothing, false, false),
                ],
            ),
            (
                // However long after: the CI run that found it served the report 6 s late.
                "a late report after a request got through is suspected, then dropped",
                &[
                    (DOWN, Unreachable, true, true),
                    (REACHED, Reachable, false, false),
                    (DOWN, Nothing, false, true),
                    (REACHED, Nothing, false, false),
                ],
            ),
            (
                "a suspected report is believed once a probe fails",
                &[
                    (REACHED, Nothing, false, false),
                    (DOWN, Nothing, false, true),
                    (PROBE_FAILED, Unreachable, true, true),
                    (PROBE_FAILED, Nothing, true, true),
                    (REACHED, Reachable, false, false),
                ],
            ),
            (
                "a second outage is announced by the probe that confirms it",
                &[
                    (DOWN, Unreachable, true, true),
                    (REACHED, Reachable, false, false),
                    (DOWN, Nothing, false, true),
                    (PROBE_FAILED, Unreachable, true, true),
                    (REACHED, Reachable, false, false),
                ],
            ),
            (
                "a failed probe with nothing suspected announces nothing",
                &[(PROBE_FAILED, Nothing, false, false)],
            ),
        ];
        for (name, steps) in cases {
            let mut reachability = Reachability::default();
            for (index, (step, announce, unreachable, in_doubt)) in steps.iter().enumerate() {
                assert_eq!(step(&mut reachability), *announce, "{name}: step {index}");
                assert_eq!(
                    (reachability.unreachable(), reachability.in_doubt()),
                    (*unreachable, *in_doubt),
                    "{name}: after step {index}"
                );
            }
        }
    }
}
