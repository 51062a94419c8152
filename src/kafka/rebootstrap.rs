//! Bootstrapping a client again once it has been without brokers for a while.
//!
//! librdkafka (2.10 and later) forgets every broker a metadata response leaves out, and a
//! broker that is shutting down (or still recovering) can answer one with no broker at all:
//! the client is then left with nothing to connect to, and librdkafka 2.12 does not bootstrap
//! again by itself in that state (librdkafka issue 5301). A group member stuck so never
//! rejoins; a catch-up consumer never fetches again. So each of our consumers adds its
//! `bootstrap.servers` again once the brokers have been unreachable for
//! [`REBOOTSTRAP_AFTER`], and every [`REBOOTSTRAP_AFTER`] while that lasts (adding brokers
//! librdkafka still knows does nothing).

use std::ffi::CString;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

/// How long the brokers may stay unreachable before the bootstrap servers are added again.
pub(crate) const REBOOTSTRAP_AFTER: Duration = Duration::from_secs(10);

/// When to add a client's bootstrap servers again.
#[derive(Debug)]
pub(crate) struct Rebootstrap {
    servers: Option<CString>,
    /// Unreachable since, and when the servers were last added.
    since: Option<Instant>,
    last: Option<Instant>,
}

impl Rebootstrap {
    /// For a client made from `config`.
    pub(crate) fn new(config: &ClientConfig) -> Self {
        let servers = config
            .get("bootstrap.servers")
            .or_else(|| config.get("metadata.broker.list"))
            .and_then(|servers| CString::new(servers).ok());
        Self {
            servers,
            since: None,
            last: None,
        }
    }

    /// Whether the servers are due to be added again at `now`, the brokers being reachable
    /// or not.
    fn due(&mut self, reachable: bool, now: Instant) -> bool {
        if reachable {
            self.since = None;
            self.last = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        let from = self.last.unwrap_or(since);
        if now.saturating_duration_since(from) < REBOOTSTRAP_AFTER {
            return false;
        }
        self.last = Some(now);
        true
    }

    /// Looks at whether `client` reaches its brokers at `now`, and adds its bootstrap servers
    /// again when due.
    pub(crate) fn observe<C: ClientContext>(
        &mut self,
        client: &Client<C>,
        reachable: bool,
        now: Instant,
        role: &str,
    ) {
        if !self.due(reachable, now) {
            return;
        }
        self.add_servers(
            client,
            role,
            &format!("no broker reachable for {} s", REBOOTSTRAP_AFTER.as_secs()),
        );
    }

    /// Adds `client`'s bootstrap servers again now, because of `why` (said in a WARN line).
    pub(crate) fn add_servers<C: ClientContext>(&self, client: &Client<C>, role: &str, why: &str) {
        let Some(servers) = &self.servers else {
            return;
        };
        // SAFETY: a live handle borrowed from `client`, and a NUL-terminated list that
        // outlives the call (librdkafka copies what it keeps).
        let added = unsafe { rd::rd_kafka_brokers_add(client.native_ptr(), servers.as_ptr()) };
        tracing::warn!(
            client = role,
            added,
            "{why}: adding the bootstrap servers again"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_servers_are_added_again_after_ten_unreachable_seconds_and_then_every_ten() {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:9092");
        let mut rebootstrap = Rebootstrap::new(&config);
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        // (seconds, reachable, due)
        let steps = [
            (0, true, false),
            (1, false, false),
            (10, false, false),
            (11, false, true),
            (15, false, false),
            (21, false, true),
            (22, true, false),
            (23, false, false),
            (33, false, true),
        ];
        for (secs, reachable, due) in steps {
            assert_eq!(rebootstrap.due(reachable, at(secs)), due, "at {secs} s");
        }
    }
}
