//! Bootstrapping a client again once it has been without brokers for a while.
//!
//! librdkafka (2.10 and later) forgets every broker a metadata response leaves out, and a
//! broker that is shutting down (or still recovering) can answer one with no broker at all:
//! the client is then left with nothing to connect to, and librdkafka 2.12 does not bootstrap
//! again by itself in that state (librdkafka issue 5301). A group member stuck so never
//! rejoins; a catch-up consumer never fetches again. So each of our consumers adds its
//! `bootstrap.servers` again once it has reached no broker for `plan::REBOOTSTRAP_AFTER` (the
//! consumer announcing the brokers unreachable, or the client's own report standing), and as
//! often again while that lasts (adding brokers librdkafka still knows does nothing). When
//! that is due is decided by `plan::ClientOutage`.

use std::ffi::CString;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::RoleContext;
use crate::plan::{ClientOutage, REBOOTSTRAP_AFTER};

/// How long a client's own probe of the brokers may take.
const OWN_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// When to add a client's bootstrap servers again.
#[derive(Debug)]
pub(crate) struct Rebootstrap {
    servers: Option<CString>,
    outage: ClientOutage,
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
            outage: ClientOutage::default(),
        }
    }

    /// A new client replaced the one this followed: what that one reported or waited for
    /// says nothing about the new one.
    pub(crate) fn new_client(&mut self) {
        self.outage = ClientOutage::default();
    }

    /// Looks at whether the consumer announced its brokers unreachable at `now`, and adds
    /// `client`'s bootstrap servers again when due. For the group member, whose own probe
    /// is the one that decides the announcement.
    pub(crate) fn observe<C: ClientContext>(
        &mut self,
        client: &Client<C>,
        announced_unreachable: bool,
        now: Instant,
        role: &str,
    ) {
        if self.outage.rebootstrap_due(announced_unreachable, now) {
            self.add_due_servers(client, role);
        }
    }

    /// As [`observe`](Self::observe), for a client whose own reports of "all brokers down"
    /// count too (`plan::ClientOutage`): while one stands, the client asks the brokers (with
    /// a metadata request for `topic`) every `plan::OWN_PROBE_EVERY`, and its report ends
    /// once one gets through.
    pub(crate) fn follow(
        &mut self,
        consumer: &BaseConsumer<RoleContext>,
        announced_unreachable: bool,
        topic: Option<&str>,
        role: &str,
    ) {
        if consumer.context().take_down_report() {
            self.outage.reported_down();
        }
        let now = Instant::now();
        // At most OWN_PROBE_TIMEOUT every OWN_PROBE_EVERY while a report stands: commands
        // (a revocation's `Remove`) wait that much longer in the worst case.
        if self.outage.probe_due(now) {
            let answer = consumer.fetch_metadata(topic, OWN_PROBE_TIMEOUT);
            if let Err(error) = &answer {
                tracing::debug!(client = role, %error, "probing the brokers after this client reported none reachable");
            }
            self.outage.probed(answer.is_ok(), Instant::now());
        }
        self.observe(
            consumer.client(),
            announced_unreachable,
            Instant::now(),
            role,
        );
    }

    fn add_due_servers<C: ClientContext>(&self, client: &Client<C>, role: &str) {
        let whose = if self.outage.reported() {
            "this client has"
        } else {
            "the consumer has"
        };
        self.add_servers(
            client,
            role,
            &format!(
                "{whose} reached no broker for at least {} s",
                REBOOTSTRAP_AFTER.as_secs() * u64::from(self.outage.times_added())
            ),
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
    use std::sync::Arc;

    use rdkafka::mocking::MockCluster;

    use super::*;
    use crate::engine::BrokerHealth;
    use crate::kafka::create_consumer;

    /// Drives `follow` as the catch-up fetcher does (poll, then follow) until `done` or
    /// `within` passes; whether `done` came.
    fn follow_until(
        rebootstrap: &mut Rebootstrap,
        consumer: &BaseConsumer<RoleContext>,
        within: Duration,
        done: impl Fn(&Rebootstrap) -> bool,
    ) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let _ = consumer.poll(Duration::from_millis(100));
            // As when the group member's probe gets through: nothing is announced.
            rebootstrap.follow(consumer, false, Some("orders"), "catchup");
            if done(rebootstrap) {
                return true;
            }
        }
        false
    }

    /// A client that alone reaches no broker (the consumer announcing nothing: the group
    /// member's probe gets through) adds its servers again after `REBOOTSTRAP_AFTER`, and
    /// its report ends once its own probe gets through. librdkafka's mock cluster: a real
    /// broker cannot be taken away from one client of a process alone.
    #[test]
    fn a_client_alone_without_brokers_adds_its_servers_again() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("orders", 1, 1).expect("mock topic");
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "rebootstrap-test")
            .set("reconnect.backoff.max.ms", "200");
        let health = Arc::new(BrokerHealth::new("rebootstrap-test", None));
        let consumer = create_consumer(&config, RoleContext::new(health, "catchup"))
            .expect("consumer on the mock cluster");
        let mut rebootstrap = Rebootstrap::new(&config);
        consumer
            .fetch_metadata(Some("orders"), Duration::from_secs(5))
            .expect("the mock broker answers");

        cluster.broker_down(1).expect("broker down");
        assert!(
            follow_until(
                &mut rebootstrap,
                &consumer,
                REBOOTSTRAP_AFTER + Duration::from_secs(10),
                |r| r.outage.times_added() >= 1
            ),
            "no rebootstrap within {} s of the broker going away (reported: {})",
            REBOOTSTRAP_AFTER.as_secs() + 10,
            rebootstrap.outage.reported()
        );
        assert!(rebootstrap.outage.reported());

        cluster.broker_up(1).expect("broker up");
        assert!(
            follow_until(&mut rebootstrap, &consumer, Duration::from_secs(20), |r| {
                !r.outage.reported()
            }),
            "the client's report outlived the broker's return"
        );
    }
}
