//! A group's true progress per partition, read from Kafka alone: no consumer of the group
//! needs to run, nothing is written, and the group is never joined.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::kafka::{BrokerHealth, KafkaError, RoleContext, for_role, read_side_entries};
use crate::plan::{TrueLag, side_key, true_lag};
use crate::{CatchupConfig, Error};

/// How long each request may take.
const LAG_TIMEOUT: Duration = Duration::from_secs(30);

/// The true progress of one partition of a group (see [`TrueLag`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionLag {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Its progress.
    pub lag: TrueLag,
}

/// The true progress of every partition of `topics` for `group` (no topics: every partition
/// the group committed, as `kafka-consumer-groups --describe` shows): during a split, where
/// the catch-up lane stands (the group's committed offset, which is all standard lag tools
/// see), how much backlog is left, and where the live lane stands (the side entry,
/// verified under the split's secret). `client` gives the connection settings;
/// `side_topic` is [`CatchupConfig::side_topic`] (`{group}` is replaced). It blocks on
/// network requests (up to 30 s each): from async code, call it in `spawn_blocking`.
///
/// ```no_run
/// # fn example() -> Result<(), catchup::Error> {
/// let mut kafka = catchup::rdkafka::ClientConfig::new();
/// kafka.set("bootstrap.servers", "127.0.0.1:9092");
/// for partition in catchup::group_lag(&kafka, "orders-app", &["orders"], "__catchup_side")? {
///     let lag = &partition.lag;
///     println!("{}/{}: {} backlog left, live lag {:?} (lag tools report {:?})",
///         partition.topic, partition.partition, lag.catchup_remaining, lag.live_lag, lag.reported_lag);
/// }
/// # Ok(()) }
/// ```
pub fn group_lag(
    client: &ClientConfig,
    group: &str,
    topics: &[&str],
    side_topic: &str,
) -> Result<Vec<PartitionLag>, Error> {
    let side_topic = CatchupConfig::new("")
        .side_topic(side_topic.to_owned())
        .side_topic_for(group)
        .map_err(Error::Config)?;
    // No hooks here: OAUTHBEARER tokens only through librdkafka's OIDC fetcher.
    crate::kafka::check_token_settings(client, false).map_err(Error::Config)?;
    let health = Arc::new(BrokerHealth::new(group, None));
    let base = crate::kafka::for_other_consumers(client);
    let mut config = for_role(&base, "lag");
    // The group's id, to read its committed offsets; it never subscribes, so it never joins.
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer<RoleContext> =
        crate::kafka::create_consumer(&config, RoleContext::new(health.clone(), "lag"))
            .map_err(|e| KafkaError::client("creating the lag reader", e))?;
    let mut list = TopicPartitionList::new();
    if topics.is_empty() {
        // As `kafka-consumer-groups --describe`: the partitions the group committed.
        let partitions = crate::kafka::committed_partitions(consumer.client(), group, LAG_TIMEOUT)
            .map_err(|reason| KafkaError::Request {
                action: "listing the group's committed offsets".into(),
                reason,
            })?;
        for (topic, partition) in &partitions {
            list.add_partition(topic, *partition);
        }
        if list.count() == 0 {
            return Ok(Vec::new());
        }
    }
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), LAG_TIMEOUT)
            .map_err(|e| KafkaError::client(&format!("reading the metadata of {topic}"), e))?;
        let found = metadata.topics().iter().find(|t| t.name() == *topic);
        match found.and_then(|t| t.error()) {
            None => {}
            Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
                return Err(Error::TopicMissing {
                    topic: (*topic).to_owned(),
                });
            }
            Some(code) => {
                return Err(Error::Refused {
                    reason: format!("reading the metadata of {topic}: {code:?}"),
                });
            }
        }
        let partitions: Vec<i32> = found
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default();
        if partitions.is_empty() {
            return Err(Error::TopicMissing {
                topic: (*topic).to_owned(),
            });
        }
        for partition in partitions {
            list.add_partition(topic, partition);
        }
    }
    let committed = consumer
        .committed_offsets(list, LAG_TIMEOUT)
        .map_err(|e| KafkaError::client("reading the group's committed offsets", e))?;
    // A group that never split has no side entries, and maybe no side topic.
    let side = match read_side_entries(&base, &side_topic, group, &health) {
        Ok(entries) => entries,
        Err(KafkaError::SideLog { reason, .. }) if reason.contains("does not exist") => {
            Default::default()
        }
        Err(err) => return Err(err.into()),
    };
    let mut lags = Vec::new();
    for element in committed.elements() {
        let (topic, partition) = (element.topic(), element.partition());
        let (_, log_end) = consumer
            .fetch_watermarks(topic, partition, LAG_TIMEOUT)
            .map_err(|e| {
                KafkaError::client(&format!("reading the log end of {topic}/{partition}"), e)
            })?;
        let offset = match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        };
        let side_value = side.get(&(topic.to_owned(), partition)).map(Vec::as_slice);
        lags.push(PartitionLag {
            topic: topic.to_owned(),
            partition,
            lag: true_lag(
                &side_key(group, topic, partition),
                offset,
                element.metadata(),
                side_value,
                log_end,
            ),
        });
    }
    lags.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(lags)
}
