//! The side log: a compacted topic holding, per split partition, the live lane's progress.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::side_reader::SideReader;
use super::{BrokerHealth, KafkaError, Rebootstrap, RoleContext, for_role};
use crate::plan::{SIDE_PARTITIONS, SideEntry, SplitSecret, side_key, side_partition};

/// How long one side-log operation may take before it is an error.
const SIDE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the side log's producer tries to deliver a write (`message.timeout.ms`).
const SIDE_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The latest side-topic value of each partition of one group, by (topic, partition), as
/// read: reconciliation decodes and authenticates it (or finds it stale).
pub type SideEntries = HashMap<(String, i32), Vec<u8>>;

/// Reads and writes the side topic.
pub struct SideLog {
    topic: String,
    group: String,
    /// The partition of the side topic holding this group's entries ([`side_partition`]).
    partition: i32,
    client_config: ClientConfig,
    producer: FutureProducer<RoleContext>,
    /// The producer's bootstrap servers, added again after a write timed out.
    rebootstrap: Rebootstrap,
    /// Reads this group's entries at every assignment.
    reader: SideReader,
    health: Arc<BrokerHealth>,
}

impl SideLog {
    /// Connects, and creates the side topic (compacted, one partition) if it is missing.
    pub fn open(
        base: &ClientConfig,
        topic: &str,
        group: &str,
        health: Arc<BrokerHealth>,
    ) -> Result<Self, KafkaError> {
        let client_config = for_other_consumers(base);
        let mut producer_config = for_role(&for_producers(base), "side-producer");
        producer_config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .set(
                "message.timeout.ms",
                SIDE_MESSAGE_TIMEOUT.as_millis().to_string(),
            );
        let rebootstrap = Rebootstrap::new(&producer_config);
        let producer: FutureProducer<RoleContext> = producer_config
            .create_with_context(RoleContext::new(health.clone(), "side-producer"))
            .map_err(|e| KafkaError::client("creating the side-log producer", e))?;
        let mut side_log = Self {
            topic: topic.to_owned(),
            group: group.to_owned(),
            partition: 0,
            client_config: client_config.clone(),
            producer,
            rebootstrap,
            reader: SideReader::new(&client_config, group, health.clone()),
            health,
        };
        let partitions = side_log.ensure_topic()?;
        side_log.partition = side_partition(group, partitions);
        Ok(side_log)
    }

    /// Creates the side topic unless it exists: a consumer without the Create ACL works
    /// with a topic an operator created. Returns its partition count.
    fn ensure_topic(&self) -> Result<i32, KafkaError> {
        let probe: BaseConsumer<RoleContext> = for_role(&self.client_config, "side-probe")
            .create_with_context(self.context("side-probe"))
            .map_err(|e| KafkaError::client("creating a metadata client", e))?;
        // Asked in short rounds, polling in between: the poll serves the client's events —
        // OAUTHBEARER token requests, authentication failures (final ones end the wait: the
        // consumer reports them) — that a metadata request alone leaves queued.
        let deadline = Instant::now() + SIDE_TIMEOUT;
        let metadata = loop {
            let _ = probe.poll(Duration::ZERO);
            match probe.fetch_metadata(Some(&self.topic), Duration::from_secs(1)) {
                Ok(metadata) => {
                    self.health.accepted();
                    break Some(metadata);
                }
                Err(_) => {
                    let _ = probe.poll(Duration::ZERO);
                    if let Some(reason) = self.health.refused() {
                        return Err(KafkaError::side(
                            &self.topic,
                            format!("cannot check it: {reason}"),
                        ));
                    }
                    if Instant::now() >= deadline {
                        break None;
                    }
                }
            }
        };
        let existing = metadata.and_then(|metadata| {
            metadata
                .topics()
                .iter()
                .find(|t| {
                    t.name() == self.topic && t.error().is_none() && !t.partitions().is_empty()
                })
                .map(|t| t.partitions().len() as i32)
        });
        if let Some(partitions) = existing {
            return Ok(partitions);
        }
        let admin: AdminClient<RoleContext> =
            for_role(&for_producers(&self.client_config), "side-admin")
                .create_with_context(self.context("side-admin"))
                .map_err(|e| KafkaError::client("creating an admin client", e))?;
        if super::tokens_from_hooks(&self.client_config) {
            self.give_token(&admin)?;
        }
        // Partitioned by group (`plan::side_partition`): an assignment reads its group's
        // partition only, not the entries of every group sharing the topic.
        let topic = NewTopic::new(&self.topic, SIDE_PARTITIONS, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact")
            // Every assignment reads its whole partition: roll segments often so that
            // compaction keeps it at about one entry per split partition, and drop tombstones
            // after an hour (far longer than any read of the topic takes).
            .set("min.cleanable.dirty.ratio", "0.1")
            .set("segment.ms", "60000")
            .set("delete.retention.ms", "3600000");
        let options = AdminOptions::new().operation_timeout(Some(SIDE_TIMEOUT));
        let results = futures::executor::block_on(admin.create_topics([&topic], &options))
            .map_err(|e| KafkaError::side(&self.topic, format!("cannot create it: {e}")))?;
        for result in results {
            match result {
                Ok(_) => {}
                // Another member created it meanwhile: its partition count is what counts.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => return self.partition_count(),
                Err((_, code)) => {
                    return Err(KafkaError::side(
                        &self.topic,
                        format!("cannot create it: {code}"),
                    ));
                }
            }
        }
        Ok(SIDE_PARTITIONS)
    }

    /// The side topic's partition count, from its metadata.
    fn partition_count(&self) -> Result<i32, KafkaError> {
        let probe: BaseConsumer<RoleContext> = for_role(&self.client_config, "side-probe")
            .create_with_context(self.context("side-probe"))
            .map_err(|e| KafkaError::client("creating a metadata client", e))?;
        let metadata = probe
            .fetch_metadata(Some(&self.topic), SIDE_TIMEOUT)
            .map_err(|e| KafkaError::side(&self.topic, format!("cannot read its metadata: {e}")))?;
        metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.topic && !t.partitions().is_empty())
            .map(|t| t.partitions().len() as i32)
            .ok_or_else(|| KafkaError::side(&self.topic, "it has no partitions".into()))
    }

    /// rdkafka's admin client never polls the queue where librdkafka asks for OAUTHBEARER
    /// tokens, so it is handed one from the hooks at creation (it lives for one request).
    fn give_token(&self, admin: &AdminClient<RoleContext>) -> Result<(), KafkaError> {
        let failed = |reason: String| {
            KafkaError::side(
                &self.topic,
                format!("cannot create it: no OAUTHBEARER token for the admin client: {reason}"),
            )
        };
        let token = self
            .health
            .oauth_token(
                "side-admin",
                self.client_config.get("sasl.oauthbearer.config"),
            )
            .map_err(|e| failed(e.to_string()))?;
        let value = CString::new(token.token).map_err(|e| failed(e.to_string()))?;
        let principal = CString::new(token.principal_name).map_err(|e| failed(e.to_string()))?;
        let mut reason: [std::ffi::c_char; 512] = [0; 512];
        // SAFETY: the client lives as long as `admin` is borrowed; librdkafka copies the two
        // NUL-terminated strings during the call; no extensions (null, 0); `reason` is
        // writable for its length, which is what is passed.
        let code = unsafe {
            rdkafka::bindings::rd_kafka_oauthbearer_set_token(
                admin.inner().native_ptr(),
                value.as_ptr(),
                token.lifetime_ms,
                principal.as_ptr(),
                std::ptr::null_mut(),
                0,
                reason.as_mut_ptr(),
                reason.len(),
            )
        };
        if code == rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            // SAFETY: librdkafka wrote a NUL-terminated message into `reason` (zeroed before).
            let reason = unsafe { std::ffi::CStr::from_ptr(reason.as_ptr()) };
            Err(failed(reason.to_string_lossy().into_owned()))
        }
    }

    fn context(&self, role: &'static str) -> RoleContext {
        RoleContext::new(self.health.clone(), role)
    }

    /// The side topic's name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Reads this group's partition of the side topic and returns the latest entry of every
    /// partition of the group (compaction keeps it small).
    pub fn read_all(&self) -> Result<SideEntries, KafkaError> {
        self.reader.read(&self.topic, &self.group, self.partition)
    }

    /// Serves the queue of the client that reads at assignments, now and then: the live
    /// thread calls it at every turn (`SideReader::serve_if_due`).
    pub fn serve_reader(&self) {
        self.reader.serve_if_due();
    }

    /// The key of `topic`/`partition` of this group.
    pub fn key(&self, topic: &str, partition: i32) -> String {
        side_key(&self.group, topic, partition)
    }

    /// Writes entries, each sealed under its split's `secret`, for its partition (a tombstone
    /// for `None`), and waits until the broker has them: all are sent before any is awaited,
    /// so a commit cycle costs one round trip of the side log, not one per partition. One
    /// result per entry, in order.
    pub fn write_all(&self, entries: &[SideLogWrite<'_>]) -> Vec<Result<(), KafkaError>> {
        let sealed: Vec<(String, Option<String>)> = entries
            .iter()
            .map(|(topic, partition, entry)| {
                let key = self.key(topic, *partition);
                let value = entry.map(|(entry, secret)| entry.seal(&key, secret));
                (key, value)
            })
            .collect();
        let sends = sealed.iter().map(|(key, value)| {
            let mut record = FutureRecord::to(&self.topic)
                .partition(self.partition)
                .key(key);
            if let Some(value) = value {
                record = record.payload(value);
            }
            self.producer.send(record, SIDE_TIMEOUT)
        });
        let deliveries = futures::executor::block_on(futures::future::join_all(sends));
        // A write that timed out found no broker for its whole timeout: the producer may be
        // left with none to connect to, as the consumers can be (`Rebootstrap`), and no
        // later write would get through either. It is the only client nothing polls while
        // the brokers are away, so its servers are added again here.
        let timed_out = deliveries.iter().any(|delivery| {
            matches!(
                delivery,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(
                        RDKafkaErrorCode::MessageTimedOut
                    ),
                    _
                ))
            )
        });
        if timed_out {
            self.rebootstrap.add_servers(
                self.producer.client(),
                "side-producer",
                &format!(
                    "a side-log write found no broker for {} s",
                    SIDE_MESSAGE_TIMEOUT.as_secs()
                ),
            );
        }
        deliveries
            .into_iter()
            .zip(&sealed)
            .map(|(delivery, (key, _))| {
                delivery.map(|_| ()).map_err(|(e, _)| {
                    KafkaError::side(&self.topic, format!("writing {key} failed: {e}"))
                })
            })
            .collect()
    }
}

/// One side-log write: the partition, and its entry with the split's secret (`None`: a
/// tombstone).
pub(crate) type SideLogWrite<'a> = (&'a str, i32, Option<(&'a SideEntry, &'a SplitSecret)>);

/// The user's settings for catchup's other consumers (the catch-up consumer, the side-log
/// reader): everything — connection, security, tuning, `client.id`, `debug` — but what
/// belongs to the group member alone (its group, membership and commits), which each
/// client sets for itself.
pub(crate) fn for_other_consumers(base: &ClientConfig) -> ClientConfig {
    settings_where(base, |key| {
        !MEMBER_ONLY
            .iter()
            .any(|member| key == *member || key.starts_with(&format!("{member}.")))
    })
}

/// The settings of `base` whose key `keep` accepts.
fn settings_where(base: &ClientConfig, keep: impl Fn(&str) -> bool) -> ClientConfig {
    let mut config = ClientConfig::new();
    // The keys only: `config_map` replaces the values of secrets (`sasl.password`, ...) with
    // a placeholder, which would then be sent as the password.
    for key in base.config_map().keys().filter(|key| keep(key)) {
        if let Some(value) = base.get(key) {
            config.set(*key, value);
        }
    }
    config
}

/// What only the group member uses (a key, or a prefix before a `.`).
const MEMBER_ONLY: [&str; 15] = [
    "group",
    // Metadata requests would create missing topics: the side topic (uncompacted) among them.
    "allow.auto.create.topics",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
    "offset.store.method",
    "consume.callback.max.messages",
    "rebalance_cb",
    "offset_commit_cb",
];

/// The user's settings for the side log's producer and admin client: those of every
/// client type (connection, security, sockets, metadata, retries, `client.id`, `debug`,
/// statistics); consumer properties would make librdkafka warn that it ignores them.
pub(crate) fn for_producers(base: &ClientConfig) -> ClientConfig {
    settings_where(base, |key| {
        ANY_CLIENT_PREFIXES
            .iter()
            .any(|prefix| key.starts_with(prefix))
            || ANY_CLIENT_KEYS.contains(&key)
    })
}

const ANY_CLIENT_PREFIXES: [&str; 12] = [
    "bootstrap.",
    "security.",
    "ssl.",
    "sasl.",
    "ssl_",
    "https.",
    "socket.",
    "reconnect.",
    "metadata.",
    "topic.metadata.",
    "api.version.",
    "broker.",
];

const ANY_CLIENT_KEYS: [&str; 13] = [
    "client.id",
    "client.rack",
    "client.dns.lookup",
    "debug",
    "log_level",
    "log.connection.close",
    "statistics.interval.ms",
    "enable.ssl.certificate.verification",
    "enable.sasl.oauthbearer.unsecure.jwt",
    "enable.metrics.push",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "connections.max.idle.ms",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_reach_every_client_as_given() {
        let mut user = ClientConfig::new();
        user.set("bootstrap.servers", "broker:9093")
            .set("group.id", "g")
            .set("security.protocol", "SASL_SSL")
            .set("sasl.username", "app")
            .set("sasl.password", "s3cret")
            .set("ssl.key.password", "k3y");
        for config in [for_producers(&user), for_other_consumers(&user)] {
            assert_eq!(config.get("sasl.username"), Some("app"));
            assert_eq!(config.get("sasl.password"), Some("s3cret"));
            assert_eq!(config.get("ssl.key.password"), Some("k3y"));
            assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));
        }
        assert_eq!(for_producers(&user).get("group.id"), None);
    }
}
