//! When one client adds its bootstrap servers again (`kafka::Rebootstrap`), and when it asks
//! the brokers itself whether it reaches them.
//!
//! A client left with no broker to connect to (librdkafka issue 5301: a metadata answer
//! naming no broker, from a broker shutting down in a rolling restart) stays so until its
//! servers are added again, which is done once the brokers have been unreachable for
//! [`REBOOTSTRAP_AFTER`]. The consumer announces an outage from all its clients' reports
//! (`plan::Reachability`) and drops a suspicion once the group member's probe gets through.
//! That probe speaks for the group member's client only: a catch-up consumer stuck alone
//! would never be counted unreachable, never add its servers again, and its lane would never
//! drain. So a client's own report that no broker can be reached also counts for that client,
//! until a request of its own gets through: it probes while its report stands (a report can
//! be served late, after the brokers came back), and adds its servers again after
//! [`REBOOTSTRAP_AFTER`] as in an announced outage.

use std::time::{Duration, Instant};

/// How long the brokers may stay unreachable for a client before its bootstrap servers are
/// added again (and again every as long while that lasts).
pub const REBOOTSTRAP_AFTER: Duration = Duration::from_secs(10);

/// How often a client whose own report of "all brokers down" stands asks the brokers.
pub const OWN_PROBE_EVERY: Duration = Duration::from_secs(2);

/// One client's view of an outage: the consumer's announcement, and its own report.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClientOutage {
    /// The client reported that no broker can be reached, and no request of its own got
    /// through since.
    own_report: bool,
    /// When the client last asked the brokers while its report stood.
    last_probe: Option<Instant>,
    /// Unreachable (announced or reported) since.
    since: Option<Instant>,
    /// When the servers were last added again.
    last_added: Option<Instant>,
    /// How many times they were added in this outage.
    times_added: u32,
}

impl ClientOutage {
    /// The client itself reported that no broker can be reached.
    pub fn reported_down(&mut self) {
        self.own_report = true;
    }

    /// Whether the client should ask the brokers at `now`: its report stands, and it did not
    /// ask within [`OWN_PROBE_EVERY`].
    pub fn probe_due(&self, now: Instant) -> bool {
        self.own_report
            && self
                .last_probe
                .is_none_or(|at| now.saturating_duration_since(at) >= OWN_PROBE_EVERY)
    }

    /// The client asked the brokers at `now`; whether the request got through (which ends
    /// its report).
    pub fn probed(&mut self, got_through: bool, now: Instant) {
        if got_through {
            self.own_report = false;
            self.last_probe = None;
        } else {
            self.last_probe = Some(now);
        }
    }

    /// Whether the client's report stands.
    pub fn reported(&self) -> bool {
        self.own_report
    }

    /// Whether to add the client's servers again at `now`, the consumer having announced the
    /// brokers unreachable or not: after [`REBOOTSTRAP_AFTER`] of an outage announced or
    /// reported by the client, and every [`REBOOTSTRAP_AFTER`] while it lasts.
    pub fn rebootstrap_due(&mut self, announced_unreachable: bool, now: Instant) -> bool {
        if !announced_unreachable && !self.own_report {
            self.since = None;
            self.last_added = None;
            self.times_added = 0;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        let from = self.last_added.unwrap_or(since);
        if now.saturating_duration_since(from) < REBOOTSTRAP_AFTER {
            return false;
        }
        self.last_added = Some(now);
        self.times_added += 1;
        true
    }

    /// How many times the servers were added again in this outage.
    pub fn times_added(&self) -> u32 {
        self.times_added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a case, at a second.
    #[derive(Clone, Copy)]
    enum Step {
        /// The consumer announces an outage or not; whether a rebootstrap is due then.
        Look(bool, bool),
        /// The client reports all brokers down.
        Report,
        /// Whether a probe is due; whether it got through (when due).
        Probe(bool, bool),
    }
    use Step::*;

    const ANNOUNCED: bool = true;
    const QUIET: bool = false;
    const DUE: bool = true;
    const NOT_DUE: bool = false;
    const THROUGH: bool = true;
    const FAILED: bool = false;

    #[test]
    fn client_outage_table() {
        let cases: &[(&str, &[(u64, Step)])] = &[
            (
                "an announced outage: added after 10 s, then every 10 s, until it ends",
                &[
                    (0, Look(ANNOUNCED, NOT_DUE)),
                    (1, Look(QUIET, NOT_DUE)),
                    (2, Look(ANNOUNCED, NOT_DUE)),
                    (11, Look(ANNOUNCED, NOT_DUE)),
                    (12, Look(ANNOUNCED, DUE)),
                    (16, Look(ANNOUNCED, NOT_DUE)),
                    (22, Look(ANNOUNCED, DUE)),
                    (23, Look(QUIET, NOT_DUE)),
                    (24, Look(ANNOUNCED, NOT_DUE)),
                    (34, Look(ANNOUNCED, DUE)),
                ],
            ),
            (
                // The case the consumer's announcement misses: the group member's probe got
                // through, so nothing is announced, but this client reaches no broker.
                "the client's own report, not disproved, counts as an outage for it",
                &[
                    (0, Report),
                    (0, Probe(DUE, FAILED)),
                    (0, Look(QUIET, NOT_DUE)),
                    (1, Probe(NOT_DUE, FAILED)),
                    (2, Probe(DUE, FAILED)),
                    (9, Look(QUIET, NOT_DUE)),
                    (10, Look(QUIET, DUE)),
                    (14, Probe(DUE, FAILED)),
                    (19, Look(QUIET, NOT_DUE)),
                    (20, Look(QUIET, DUE)),
                    (21, Probe(DUE, THROUGH)),
                    (21, Probe(NOT_DUE, FAILED)),
                    (31, Look(QUIET, NOT_DUE)),
                ],
            ),
            (
                "a late report that a probe disproves at once adds nothing",
                &[
                    (0, Report),
                    (0, Probe(DUE, THROUGH)),
                    (0, Look(QUIET, NOT_DUE)),
                    (30, Look(QUIET, NOT_DUE)),
                    (30, Probe(NOT_DUE, FAILED)),
                ],
            ),
            (
                "a new report after one disproved is probed at once",
                &[
                    (0, Report),
                    (0, Probe(DUE, THROUGH)),
                    (1, Report),
                    (1, Probe(DUE, FAILED)),
                    (2, Probe(NOT_DUE, FAILED)),
                    (3, Probe(DUE, FAILED)),
                ],
            ),
            (
                "an announced outage ending does not end the client's own report",
                &[
                    (0, Report),
                    (0, Look(ANNOUNCED, NOT_DUE)),
                    (5, Look(QUIET, NOT_DUE)),
                    (10, Look(QUIET, DUE)),
                ],
            ),
        ];
        let start = Instant::now();
        for (name, steps) in cases {
            let mut outage = ClientOutage::default();
            for (index, &(second, step)) in steps.iter().enumerate() {
                let now = start + Duration::from_secs(second);
                match step {
                    Look(announced, due) => assert_eq!(
                        outage.rebootstrap_due(announced, now),
                        due,
                        "{name}: step {index} (at {second} s)"
                    ),
                    Report => outage.reported_down(),
                    Probe(due, got_through) => {
                        assert_eq!(
                            outage.probe_due(now),
                            due,
                            "{name}: step {index} (at {second} s)"
                        );
                        if due {
                            outage.probed(got_through, now);
                        }
                    }
                }
            }
        }
    }
}
