//! The side log: a compacted topic holding, per split partition, the live lane's progress.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::KafkaError;
use crate::plan::{SideEntry, SplitSecret, parse_side_key, side_key};

/// How long one side-log operation may take before it is an error.
const SIDE_TIMEOUT: Duration = Duration::from_secs(30);

/// The latest side-topic value of each partition of one group, by (topic, partition), as
/// read: reconciliation decodes and authenticates it (or finds it stale).
pub type SideEntries = HashMap<(String, i32), Vec<u8>>;

/// Reads and writes the side topic.
pub struct SideLog {
    topic: String,
    group: String,
    client_config: ClientConfig,
    producer: FutureProducer,
}

impl SideLog {
    /// Connects, and creates the side topic (compacted, one partition) if it is missing.
    pub fn open(base: &ClientConfig, topic: &str, group: &str) -> Result<Self, KafkaError> {
        let client_config = connection_only(base);
        let mut producer_config = client_config.clone();
        producer_config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .set("message.timeout.ms", "30000");
        let producer: FutureProducer = producer_config
            .create()
            .map_err(|e| KafkaError::client("creating the side-log producer", e))?;
        let side_log = Self {
            topic: topic.to_owned(),
            group: group.to_owned(),
            client_config,
            producer,
        };
        side_log.ensure_topic()?;
        Ok(side_log)
    }

    /// Creates the side topic unless it exists: a consumer without the Create ACL works
    /// with a topic an operator created.
    fn ensure_topic(&self) -> Result<(), KafkaError> {
        let probe: BaseConsumer = self
            .client_config
            .create()
            .map_err(|e| KafkaError::client("creating a metadata client", e))?;
        let exists = probe
            .fetch_metadata(Some(&self.topic), SIDE_TIMEOUT)
            .is_ok_and(|metadata| {
                metadata.topics().iter().any(|t| {
                    t.name() == self.topic && t.error().is_none() && !t.partitions().is_empty()
                })
            });
        if exists {
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> = self
            .client_config
            .create()
            .map_err(|e| KafkaError::client("creating an admin client", e))?;
        let topic = NewTopic::new(&self.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact")
            // Every assignment reads the whole topic: roll segments often so that compaction
            // keeps it at about one entry per split partition, and drop tombstones after an
            // hour (far longer than any read of the topic takes).
            .set("min.cleanable.dirty.ratio", "0.1")
            .set("segment.ms", "60000")
            .set("delete.retention.ms", "3600000");
        let options = AdminOptions::new().operation_timeout(Some(SIDE_TIMEOUT));
        let results = futures::executor::block_on(admin.create_topics([&topic], &options))
            .map_err(|e| KafkaError::side(&self.topic, format!("cannot create it: {e}")))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => {
                    return Err(KafkaError::side(
                        &self.topic,
                        format!("cannot create it: {code}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The side topic's name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Reads the whole side topic and returns the latest entry of every partition of this
    /// group (compaction keeps the topic small).
    pub fn read_all(&self) -> Result<SideEntries, KafkaError> {
        let mut config = self.client_config.clone();
        config
            .set("group.id", format!("{}.catchup-side-reader", self.group))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        let reader: BaseConsumer = config
            .create()
            .map_err(|e| KafkaError::client("creating the side-log reader", e))?;
        let metadata = reader
            .fetch_metadata(Some(&self.topic), SIDE_TIMEOUT)
            .map_err(|e| KafkaError::side(&self.topic, format!("cannot read its metadata: {e}")))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(KafkaError::side(
                &self.topic,
                "the topic does not exist".into(),
            ));
        }
        let mut ends = HashMap::new();
        let mut assignment = TopicPartitionList::new();
        for &partition in &partitions {
            let (low, high) = reader
                .fetch_watermarks(&self.topic, partition, SIDE_TIMEOUT)
                .map_err(|e| {
                    KafkaError::side(&self.topic, format!("cannot read its watermarks: {e}"))
                })?;
            if high > low {
                ends.insert(partition, high);
                assignment
                    .add_partition_offset(&self.topic, partition, Offset::Beginning)
                    .map_err(|e| KafkaError::client("building the side-log assignment", e))?;
            }
        }
        let mut entries = SideEntries::new();
        if ends.is_empty() {
            return Ok(entries);
        }
        reader
            .assign(&assignment)
            .map_err(|e| KafkaError::client("assigning the side log", e))?;
        let prefix = format!("{}/", self.group);
        let deadline = Instant::now() + SIDE_TIMEOUT;
        while !ends.is_empty() {
            if Instant::now() > deadline {
                return Err(KafkaError::side(&self.topic, "reading it timed out".into()));
            }
            let Some(message) = reader.poll(Duration::from_millis(200)) else {
                continue;
            };
            let message = message
                .map_err(|e| KafkaError::side(&self.topic, format!("cannot read it: {e}")))?;
            if message.offset() + 1 >= ends.get(&message.partition()).copied().unwrap_or(0) {
                ends.remove(&message.partition());
            }
            let Some(key) = message.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                continue;
            };
            if !key.starts_with(&prefix) {
                continue;
            }
            let Some((group, topic, partition)) = parse_side_key(key) else {
                continue;
            };
            if group != self.group {
                continue;
            }
            let slot = (topic.to_owned(), partition);
            match message.payload() {
                None => {
                    entries.remove(&slot);
                }
                Some(value) => {
                    entries.insert(slot, value.to_vec());
                }
            }
        }
        Ok(entries)
    }

    /// The key of `topic`/`partition` of this group.
    pub fn key(&self, topic: &str, partition: i32) -> String {
        side_key(&self.group, topic, partition)
    }

    /// Writes `entry`, sealed under its split's `secret`, for `topic`/`partition` (a
    /// tombstone for `None`) and waits until the broker has it.
    pub fn write(
        &self,
        topic: &str,
        partition: i32,
        entry: Option<(&SideEntry, &SplitSecret)>,
    ) -> Result<(), KafkaError> {
        let key = self.key(topic, partition);
        let value = entry.map(|(entry, secret)| entry.seal(&key, secret));
        let mut record = FutureRecord::to(&self.topic).key(&key);
        if let Some(value) = &value {
            record = record.payload(value);
        }
        let delivery = futures::executor::block_on(self.producer.send(record, SIDE_TIMEOUT));
        delivery
            .map(|_| ())
            .map_err(|(e, _)| KafkaError::side(&self.topic, format!("writing {key} failed: {e}")))
    }
}

/// The connection settings of `base` (bootstrap, security), without consumer settings that
/// would make a producer or admin client complain.
pub(crate) fn connection_only(base: &ClientConfig) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in base.config_map() {
        let keep = key.starts_with("bootstrap.")
            || key.starts_with("security.")
            || key.starts_with("ssl.")
            || key.starts_with("sasl.")
            || key == "client.id"
            || key == "broker.address.family";
        if keep {
            config.set(key, value);
        }
    }
    config
}
