//! When refused credentials stop the consumer. librdkafka retries a failed authentication
//! for ever, and some failures pass: a broker that has not caught up with a new SCRAM
//! credential, an identity provider that failed one token refresh while the current token
//! is still valid. So a refusal is final only once authentication kept failing for
//! [`REFUSAL_GRACE`] with no request succeeding in between; then the consumer stops with
//! `Error::Refused` rather than retry silently for ever.

use std::time::{Duration, Instant};

/// How long authentication may keep failing before the consumer stops.
pub const REFUSAL_GRACE: Duration = Duration::from_secs(10);

/// Authentication failures of a consumer's clients and whether they are final yet.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Since when authentication keeps failing, and the failure that began it (closer to
    /// the cause than the later ones: a token hook's error, then brokers refusing the
    /// expired token).
    failing: Option<(Instant, String)>,
    /// Set once the failures lasted the grace: what the consumer reports, for good.
    final_reason: Option<String>,
}

impl Refusal {
    /// A client's authentication failed at `now`. Whether a run of failures begins (worth
    /// a word to the operator).
    pub fn failed(&mut self, now: Instant, reason: &str) -> bool {
        if self.failing.is_some() {
            return false;
        }
        self.failing = Some((now, reason.to_owned()));
        self.final_reason.is_none()
    }

    /// The application's own source of credentials failed (a token hook's error) at `now`:
    /// that is the cause to report, whatever the brokers said before it (a session ended by
    /// the expired token may be refused before the hook is asked for a new one). The run of
    /// failures keeps its start. Whether a run begins.
    pub fn source_failed(&mut self, now: Instant, reason: &str) -> bool {
        match &mut self.failing {
            Some((_, cause)) => {
                *cause = reason.to_owned();
                false
            }
            None => self.failed(now, reason),
        }
    }

    /// A request got through: the credentials are accepted (a final refusal stays). Whether
    /// a run of failures ended.
    pub fn succeeded(&mut self) -> bool {
        self.final_reason.is_none() && self.failing.take().is_some()
    }

    /// Whether failures are being seen (a request that succeeds would end them).
    pub fn failing(&self) -> bool {
        self.failing.is_some() || self.final_reason.is_some()
    }

    /// The refusal, once final at `now`.
    pub fn check(&mut self, now: Instant) -> Option<String> {
        if self.final_reason.is_none() {
            if let Some((since, reason)) = &self.failing {
                if now.saturating_duration_since(*since) >= REFUSAL_GRACE {
                    self.final_reason = Some(reason.clone());
                }
            }
        }
        self.final_reason.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_table() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        enum Step {
            Fail(&'static str),
            SourceFail(&'static str),
            Succeed,
            Check,
        }
        use Step::*;
        // (what, at second, what `failed`/`succeeded` return, what `check` says then)
        type Steps = Vec<(Step, u64, bool, Option<&'static str>)>;
        let cases: Vec<(&str, Steps)> = vec![
            (
                "a failure that lasts the grace is final, named by its first reason",
                vec![
                    (Fail("bad password"), 0, true, None),
                    (Check, 9, false, None),
                    (Fail("expired token"), 9, false, None),
                    (Check, 10, false, Some("bad password")),
                ],
            ),
            (
                "a success in between starts the clock again",
                vec![
                    (Fail("token refresh failed"), 0, true, None),
                    (Succeed, 5, true, None),
                    (Check, 12, false, None),
                    (Fail("token refresh failed"), 12, true, None),
                    (Check, 21, false, None),
                    (Check, 22, false, Some("token refresh failed")),
                ],
            ),
            (
                "final is for good",
                vec![
                    (Fail("denied"), 0, true, None),
                    (Check, 10, false, Some("denied")),
                    (Succeed, 11, false, Some("denied")),
                    (Fail("other"), 12, false, Some("denied")),
                ],
            ),
            (
                "the token hook's error is the cause, even after the brokers refused",
                vec![
                    (Fail("handshake failed"), 0, true, None),
                    (SourceFail("the identity provider is down"), 3, false, None),
                    (Fail("handshake failed"), 4, false, None),
                    (Check, 10, false, Some("the identity provider is down")),
                    (
                        SourceFail("later"),
                        11,
                        false,
                        Some("the identity provider is down"),
                    ),
                ],
            ),
            (
                "a success without failures changes nothing",
                vec![(Succeed, 0, false, None), (Check, 100, false, None)],
            ),
        ];
        for (name, steps) in cases {
            let mut refusal = Refusal::default();
            for (index, (step, secs, returned, expected)) in steps.into_iter().enumerate() {
                let now = at(secs);
                let got = match step {
                    Fail(reason) => refusal.failed(now, reason),
                    SourceFail(reason) => refusal.source_failed(now, reason),
                    Succeed => refusal.succeeded(),
                    Check => false,
                };
                assert_eq!(got, returned, "{name}, step {index}");
                assert_eq!(
                    refusal.check(now).as_deref(),
                    expected,
                    "{name}, step {index}"
                );
            }
        }
    }
}
