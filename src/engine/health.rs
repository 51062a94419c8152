//! What catchup's clients tell about the brokers, as state the fetchers, the reader and the
//! public API share: whether the brokers can be reached, whether the credentials are refused,
//! and the application's hooks. The rdkafka side (`kafka::context`) classifies what librdkafka
//! reports and calls the transitions here; one WARN when no broker can be reached, one INFO
//! when they are back, not an ERROR at every retry of each client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::broadcast;

use super::telemetry;
use super::types::{ClientHooks, Event};
use crate::plan::{Announce, REFUSAL_GRACE, Reachability, Refusal};

/// Whether the brokers can be reached, as every client of one consumer reports it.
#[derive(Debug)]
pub(crate) struct BrokerHealth {
    /// What was announced, and what is suspected (`plan::Reachability`).
    reachability: std::sync::Mutex<Reachability>,
    /// `reachability.unreachable()`, read without the lock.
    unreachable: AtomicBool,
    /// `reachability.in_doubt()`, read without the lock (the live thread asks every turn;
    /// a suspicion may have stood long enough to be believed when next looked at).
    in_doubt: AtomicBool,
    /// The consumer's group, the label of its metrics.
    group: String,
    /// The last connection failure: it names the broker, which "all brokers are down" does
    /// not.
    last_failure: std::sync::Mutex<Option<String>>,
    events: OnceLock<broadcast::Sender<Event>>,
    /// The application's hooks, told by every client.
    hooks: Option<Arc<dyn ClientHooks>>,
    /// Authentication failures any client reported: lasting ones stop the consumer.
    refusal: std::sync::Mutex<Refusal>,
    /// Whether `refusal` has anything to say (read for every record handed out).
    refusing: AtomicBool,
}

impl BrokerHealth {
    /// The health of the clients of the consumer in `group`.
    pub fn new(group: &str, hooks: Option<Arc<dyn ClientHooks>>) -> Self {
        Self {
            reachability: std::sync::Mutex::new(Reachability::default()),
            unreachable: AtomicBool::new(false),
            in_doubt: AtomicBool::new(false),
            group: group.to_owned(),
            last_failure: std::sync::Mutex::new(None),
            events: OnceLock::new(),
            hooks,
            refusal: std::sync::Mutex::new(Refusal::default()),
            refusing: AtomicBool::new(false),
        }
    }

    /// The application's hooks, if it gave any.
    pub fn hooks(&self) -> Option<&dyn ClientHooks> {
        self.hooks.as_deref()
    }

    /// Where transitions are announced.
    pub fn attach(&self, events: broadcast::Sender<Event>) {
        let _ = self.events.set(events);
    }

    /// Whether the last word was that the brokers cannot be reached — or is now: a report
    /// suspected of being late that stood `plan::CONFIRM_AFTER` with no probe getting
    /// through (the live thread that probes may be held in a request) is believed here.
    pub fn is_unreachable(&self) -> bool {
        if self.in_doubt.load(Ordering::Relaxed) && !self.unreachable.load(Ordering::Relaxed) {
            let mut reachability = self.reachability();
            let announce = reachability.check(Instant::now());
            self.announce(reachability, announce, None);
        }
        self.unreachable.load(Ordering::Relaxed)
    }

    /// Whether the brokers are unreachable or suspected to be: the live thread probes them
    /// until it knows.
    pub fn in_doubt(&self) -> bool {
        self.in_doubt.load(Ordering::Relaxed)
    }

    /// A request succeeded: the brokers are reachable (INFO and an event when they were not).
    pub fn reached(&self) {
        let mut reachability = self.reachability();
        let announce = reachability.reached();
        self.announce(reachability, announce, None);
    }

    /// A probe of the brokers failed: a suspected report of an outage is believed.
    pub fn probe_failed(&self, reason: &str) {
        let mut reachability = self.reachability();
        let announce = reachability.probe_failed();
        self.announce(reachability, announce, Some(("live", reason)));
    }

    fn reachability(&self) -> std::sync::MutexGuard<'_, Reachability> {
        self.reachability
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Says what `reachability` decided (after letting it go): one WARN and an event for an
    /// outage, naming the last failed connection; one INFO and an event when it ends.
    fn announce(
        &self,
        reachability: std::sync::MutexGuard<'_, Reachability>,
        announce: Announce,
        reporter: Option<(&str, &str)>,
    ) {
        self.unreachable
            .store(reachability.unreachable(), Ordering::Relaxed);
        self.in_doubt
            .store(reachability.in_doubt(), Ordering::Relaxed);
        drop(reachability);
        match announce {
            Announce::Nothing => {}
            Announce::Reachable => {
                tracing::info!("the brokers are reachable again");
                self.emit(Event::BrokersReachable);
            }
            Announce::Unreachable => {
                let (role, reported) = reporter.unwrap_or(("", ""));
                let reason = self
                    .last_failure()
                    .clone()
                    .unwrap_or_else(|| reported.to_owned());
                tracing::warn!(
                    client = role,
                    "the brokers cannot be reached ({reason}); retrying"
                );
                self.emit(Event::BrokersUnreachable { reason });
            }
        }
    }

    /// Why the consumer's credentials are refused, once the refusal is final (it lasted
    /// `REFUSAL_GRACE` with no request getting through).
    pub fn refused(&self) -> Option<String> {
        if !self.refusing.load(Ordering::Relaxed) {
            return None;
        }
        self.refusal().check(Instant::now())
    }

    /// Whether authentication failures are being seen: a request that gets through
    /// ([`accepted`](Self::accepted)) would end them.
    pub fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::Relaxed)
    }

    /// A request got through: the credentials are accepted (a final refusal stays).
    pub fn accepted(&self) {
        let mut refusal = self.refusal();
        if refusal.succeeded() {
            self.refusing.store(refusal.failing(), Ordering::Relaxed);
            drop(refusal);
            tracing::info!("the brokers accept the credentials again");
        }
    }

    fn refusal(&self) -> std::sync::MutexGuard<'_, Refusal> {
        self.refusal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// librdkafka's statistics from the client playing `role`: to the application's hooks.
    pub fn on_statistics(&self, role: &str, statistics: &[u8]) {
        if let Some(hooks) = self.hooks() {
            hooks.statistics(role, statistics);
        }
    }

    fn last_failure(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.last_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn emit(&self, event: Event) {
        if let Some(events) = self.events.get() {
            let _ = events.send(event);
        }
    }

    /// A client reported that authentication failed: one WARN and an event when a run of
    /// failures begins; the consumer stops if it lasts (`plan::Refusal`).
    pub fn authentication_failed(&self, role: &str, reason: &str) {
        self.refused_by(role, reason, Refusal::failed);
    }

    /// The application's token hook failed for the client playing `role`: the cause the
    /// consumer reports should the refusal become final (`Refusal::source_failed`).
    pub fn token_failed(&self, role: &str, reason: &str) {
        self.refused_by(role, reason, Refusal::source_failed);
    }

    fn refused_by(
        &self,
        role: &str,
        reason: &str,
        record: fn(&mut Refusal, Instant, &str) -> bool,
    ) {
        let mut refusal = self.refusal();
        let begins = record(&mut refusal, Instant::now(), reason);
        self.refusing.store(true, Ordering::Relaxed);
        drop(refusal);
        if begins {
            tracing::warn!(
                client = role,
                "{reason}; retrying — the consumer stops if this lasts {} s",
                REFUSAL_GRACE.as_secs()
            );
            self.emit(Event::Error {
                message: format!("authentication failed: {reason}"),
            });
        }
    }

    /// A connection to one broker failed (others may answer): remembered, since it names the
    /// broker and "all brokers are down" does not.
    pub fn connection_failed(&self, reason: &str) {
        telemetry::broker_error(&self.group);
        *self.last_failure() = Some(reason.to_owned());
    }

    /// A client reports that no broker can be reached: one WARN and an event naming the last
    /// failed connection, until a request gets through again ([`reached`](Self::reached)) —
    /// unless a request got through before, which makes the report suspect of being late
    /// (`plan::Reachability`): a failing probe confirms it, or `plan::CONFIRM_AFTER` with no
    /// probe getting through.
    pub fn all_down(&self, role: &str, reason: &str) {
        telemetry::broker_error(&self.group);
        let mut reachability = self.reachability();
        let announce = reachability.all_down(Instant::now());
        self.announce(reachability, announce, Some((role, reason)));
    }
}
