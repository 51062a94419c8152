//! Reading one group's entries from its partition of the side topic: once, with a client
//! made for the read (`catchup::group_lag` and other tools), or at every assignment, with
//! a client the side log keeps ([`SideReader`]).
//!
//! A client made for each read cost every assignment the client's start, its connections
//! and a metadata request before the watermarks: 60–170 ms a read on a local broker, against
//! 1.5–5 ms with the kept client (its first read, which starts it, 44 ms), and more where
//! connections need TLS and SASL. On a new group, the first record came 120–230 ms after
//! `subscribe`, and 65–80 ms with the kept reader (a bare rdkafka consumer: about 60 ms).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::side_log::SideEntries;
use super::{BrokerHealth, KafkaError, RoleContext, for_role};
use crate::plan::{parse_side_key, side_partition};

/// How long one read may take before it is an error.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads one group's side partition at every assignment, with a client kept between reads.
pub(crate) struct SideReader {
    config: ClientConfig,
    health: Arc<BrokerHealth>,
    /// Made at the first read; dropped after a read that failed, so that a client left
    /// without brokers (librdkafka issue 5301, see `kafka::Rebootstrap`) is not kept.
    client: Mutex<Option<BaseConsumer<RoleContext>>>,
}

impl SideReader {
    /// A reader for `group`, its client made from `client_config` at the first read.
    pub fn new(client_config: &ClientConfig, group: &str, health: Arc<BrokerHealth>) -> Self {
        Self {
            config: reader_config(client_config, group),
            health,
            client: Mutex::new(None),
        }
    }

    /// The latest entry of every partition of `group` in `partition` of `side_topic`
    /// (compaction keeps it small).
    pub fn read(
        &self,
        side_topic: &str,
        group: &str,
        partition: i32,
    ) -> Result<SideEntries, KafkaError> {
        let mut kept = self
            .client
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let client = match kept.take() {
            Some(client) => client,
            None => create(&self.config, &self.health)?,
        };
        // Serves what the client reported while it was idle (errors go to the health).
        let _ = client.poll(Duration::ZERO);
        let entries = read_partition(&client, side_topic, group, partition)?;
        // Assigned, it would go on fetching the partition until the next read.
        if client.unassign().is_ok() {
            *kept = Some(client);
        }
        Ok(entries)
    }
}

/// Reads `group`'s partition of the side topic `side_topic` ([`side_partition`]) with a
/// client of its own and returns the latest entry of every partition of `group`. Creates
/// nothing: a tool may call it.
pub(crate) fn read_side_entries(
    client_config: &ClientConfig,
    side_topic: &str,
    group: &str,
    health: &Arc<BrokerHealth>,
) -> Result<SideEntries, KafkaError> {
    let reader = create(&reader_config(client_config, group), health)?;
    let metadata = reader
        .fetch_metadata(Some(side_topic), READ_TIMEOUT)
        .map_err(|e| KafkaError::side(side_topic, format!("cannot read its metadata: {e}")))?;
    let found = metadata.topics().iter().find(|t| t.name() == side_topic);
    if let Some(code) = found.and_then(|t| t.error()) {
        if code != rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART {
            return Err(KafkaError::side(
                side_topic,
                format!("cannot read its metadata: {code:?}"),
            ));
        }
    }
    let count = found.map_or(0, |t| t.partitions().len() as i32);
    if count == 0 {
        return Err(KafkaError::side(
            side_topic,
            "the topic does not exist".into(),
        ));
    }
    // Only the group's own partition holds its entries.
    read_partition(&reader, side_topic, group, side_partition(group, count))
}

fn reader_config(client_config: &ClientConfig, group: &str) -> ClientConfig {
    let mut config = for_role(client_config, "side-reader");
    config
        .set("group.id", format!("{group}.catchup-side-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    config
}

fn create(
    config: &ClientConfig,
    health: &Arc<BrokerHealth>,
) -> Result<BaseConsumer<RoleContext>, KafkaError> {
    super::create_consumer(config, RoleContext::new(health.clone(), "side-reader"))
        .map_err(|e| KafkaError::client("creating the side-log reader", e))
}

/// Reads `partition` of `side_topic` from its start to its end as of now, keeping the last
/// value of each key of `group`; leaves `reader` assigned to it when there was anything to
/// read.
fn read_partition(
    reader: &BaseConsumer<RoleContext>,
    side_topic: &str,
    group: &str,
    partition: i32,
) -> Result<SideEntries, KafkaError> {
    let mut entries = SideEntries::new();
    let (low, end) = reader
        .fetch_watermarks(side_topic, partition, READ_TIMEOUT)
        .map_err(|e| KafkaError::side(side_topic, format!("cannot read its watermarks: {e}")))?;
    if end <= low {
        return Ok(entries);
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(side_topic, partition, Offset::Beginning)
        .map_err(|e| KafkaError::client("building the side-log assignment", e))?;
    reader
        .assign(&assignment)
        .map_err(|e| KafkaError::client("assigning the side log", e))?;
    let prefix = format!("{group}/");
    let deadline = Instant::now() + READ_TIMEOUT;
    loop {
        if Instant::now() > deadline {
            return Err(KafkaError::side(side_topic, "reading it timed out".into()));
        }
        let Some(message) = reader.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message =
            message.map_err(|e| KafkaError::side(side_topic, format!("cannot read it: {e}")))?;
        if message.partition() != partition {
            continue;
        }
        let last = message.offset() + 1 >= end;
        let slot = message
            .key()
            .and_then(|key| std::str::from_utf8(key).ok())
            .filter(|key| key.starts_with(&prefix))
            .and_then(parse_side_key)
            .filter(|(entry_group, _, _)| *entry_group == group)
            .map(|(_, topic, partition)| (topic.to_owned(), partition));
        if let Some(slot) = slot {
            match message.payload() {
                None => {
                    entries.remove(&slot);
                }
                Some(value) => {
                    entries.insert(slot, value.to_vec());
                }
            }
        }
        if last {
            return Ok(entries);
        }
    }
}
