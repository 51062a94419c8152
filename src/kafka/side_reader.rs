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

/// How often the kept client's queue is served between reads.
const SERVE_EVERY: Duration = Duration::from_millis(100);

/// The most events served at once (librdkafka's `poll` serves one a call and does not say
/// whether more wait).
const SERVE_MOST: usize = 64;

/// Reads one group's side partition at every assignment, with a client kept between reads.
pub(crate) struct SideReader {
    config: ClientConfig,
    health: Arc<BrokerHealth>,
    /// Made at the first read; dropped after a read that failed, so that a client left
    /// without brokers (librdkafka issue 5301, see `kafka::Rebootstrap`) is not kept.
    kept: Mutex<Option<Kept>>,
}

/// The kept client, and when its queue was last served.
struct Kept {
    client: BaseConsumer<RoleContext>,
    served_at: Instant,
}

impl SideReader {
    /// A reader for `group`, its client made from `client_config` at the first read.
    pub fn new(client_config: &ClientConfig, group: &str, health: Arc<BrokerHealth>) -> Self {
        Self {
            config: reader_config(client_config, group),
            health,
            kept: Mutex::new(None),
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
            .kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let client = match kept.take() {
            Some(Kept { client, .. }) => {
                // What it reported since it was last served goes to the health first, not
                // into this read.
                serve(&client);
                client
            }
            None => create(&self.config, &self.health)?,
        };
        let entries = read_partition(&client, side_topic, group, partition)?;
        // Assigned, it would go on fetching the partition until the next read.
        if client.unassign().is_ok() {
            *kept = Some(Kept {
                client,
                served_at: Instant::now(),
            });
        }
        Ok(entries)
    }

    /// Serves the kept client's queue (its logs, errors and token refreshes) if it was not
    /// served for [`SERVE_EVERY`]: idle between assignments, it would otherwise pile them up
    /// and hand them over late. Called by the live thread at every turn.
    pub fn serve_if_due(&self) {
        let Ok(mut kept) = self.kept.try_lock() else {
            return; // being read: the read serves it
        };
        if let Some(kept) = kept.as_mut() {
            if kept.served_at.elapsed() >= SERVE_EVERY {
                serve(&kept.client);
                kept.served_at = Instant::now();
            }
        }
    }
}

/// Serves up to [`SERVE_MOST`] events of an unassigned client's queue: errors reach the
/// health through its context, logs the log, token refreshes the hooks.
fn serve(client: &BaseConsumer<RoleContext>) {
    for _ in 0..SERVE_MOST {
        // Unassigned: nothing it returns is a record of a read.
        let _ = client.poll(Duration::ZERO);
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
        .set("enable.partition.eof", "false")
        // Kept for the consumer's life: its statistics say nothing about the consumer.
        .set("statistics.interval.ms", "0");
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
            // The record at `end - 1` may never come: the position passed it (an offset
            // reset after the log start moved, or a record no longer there).
            if position(reader, side_topic, partition).is_some_and(|at| at >= end) {
                return Ok(entries);
            }
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

/// The consumer's position on `partition` of `topic`, if it has one.
fn position(reader: &BaseConsumer<RoleContext>, topic: &str, partition: i32) -> Option<i64> {
    let positions = reader.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(at) => Some(at),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    use super::*;
    use crate::plan::side_key;

    const SIDE: &str = "side";

    fn write(producer: &BaseProducer, key: &str, value: Option<&str>) {
        let mut record = BaseRecord::<str, str>::to(SIDE).key(key).partition(0);
        if let Some(value) = value {
            record = record.payload(value);
        }
        producer.send(record).expect("queued");
        producer.flush(Duration::from_secs(10)).expect("written");
    }

    fn entries(pairs: &[(&str, i32, &str)]) -> SideEntries {
        pairs
            .iter()
            .map(|&(topic, partition, value)| ((topic.to_owned(), partition), value.into()))
            .collect()
    }

    /// The kept client reads what was written between reads (tombstones included), the
    /// group's entries only, and stays kept; a failed read drops it. librdkafka's mock
    /// cluster: no broker needed.
    #[test]
    fn a_kept_reader_reads_every_write_since_its_last_read() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic(SIDE, 1, 1).expect("side topic");
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", cluster.bootstrap_servers());
        let producer: BaseProducer = config.create().expect("producer");
        let health = Arc::new(BrokerHealth::new("g", None));
        let reader = SideReader::new(&config, "g", health);
        let read = || reader.read(SIDE, "g", 0).expect("side read");
        let kept = || {
            reader
                .kept
                .lock()
                .map(|kept| kept.is_some())
                .unwrap_or(false)
        };

        assert_eq!(read(), SideEntries::new(), "an empty partition");
        assert!(kept(), "kept after the first read");
        write(&producer, &side_key("g", "orders", 0), Some("a"));
        write(&producer, &side_key("other", "orders", 0), Some("theirs"));
        assert_eq!(read(), entries(&[("orders", 0, "a")]));
        assert!(kept());
        write(&producer, &side_key("g", "orders", 0), Some("b"));
        write(&producer, &side_key("g", "orders", 1), Some("c"));
        assert_eq!(read(), entries(&[("orders", 0, "b"), ("orders", 1, "c")]));
        write(&producer, &side_key("g", "orders", 1), None);
        reader.serve_if_due();
        assert_eq!(read(), entries(&[("orders", 0, "b")]));
        assert!(kept());

        assert!(reader.read("no-such-topic", "g", 0).is_err());
        assert!(!kept(), "dropped after a failed read");
        assert_eq!(read(), entries(&[("orders", 0, "b")]), "made again");
    }
}
