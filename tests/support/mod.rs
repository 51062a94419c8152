//! Helpers the integration tests share: find the test broker, create uniquely named topics,
//! produce keyed records with known payloads, read committed offsets and watermarks; a broker
//! of a test's own for restarts and downtime ([`private_broker`]); a record of what a catchup
//! consumer delivered and the checks on it ([`deliveries`]).
//!
//! Every name is unique per process and call, so test binaries can run in parallel against
//! one broker without seeing each other's topics or groups.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod cli;
pub mod deliveries;
pub mod private_broker;
pub mod zipf;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::future_producer::Delivery;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

/// Timeout of a single broker request in these helpers.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The bootstrap address of the test broker: `CATCHUP_BROKERS`, else the address
/// `scripts/kafka start` wrote into its state directory.
pub fn bootstrap() -> String {
    if let Ok(brokers) = std::env::var("CATCHUP_BROKERS") {
        if !brokers.trim().is_empty() {
            return brokers.trim().to_owned();
        }
    }
    let file = state_dir().join("bootstrap");
    match std::fs::read_to_string(&file) {
        Ok(address) if !address.trim().is_empty() => address.trim().to_owned(),
        _ => panic!(
            "no Kafka broker for the integration tests: run `scripts/kafka start` \
             (or set CATCHUP_BROKERS=host:port); {} was not found",
            file.display()
        ),
    }
}

/// Where `scripts/kafka` keeps the test broker's state.
fn state_dir() -> PathBuf {
    std::env::var_os("CATCHUP_KAFKA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/catchup/broker")
        })
}

/// The librdkafka properties file of the test broker's SASL_SSL listener (bootstrap
/// address, CA, SCRAM-SHA-512 user): `CATCHUP_SECURE_CONFIG`, else the file
/// `scripts/kafka start` wrote (what `scripts/kafka secure` prints).
pub fn secure_properties_file() -> PathBuf {
    std::env::var_os("CATCHUP_SECURE_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| state_dir().join("sasl-ssl.properties"))
}

/// The rdkafka settings of a consumer in `group` on the SASL_SSL listener (those of
/// [`secure_properties_file`]), with `overrides`.
pub fn secure_client(group: &str, overrides: &[(&str, &str)]) -> ClientConfig {
    let file = secure_properties_file();
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "no SASL_SSL listener for the tests ({}: {e}): start the broker with \
             `scripts/kafka start`, or point CATCHUP_SECURE_CONFIG at a properties file",
            file.display()
        )
    });
    let mut config = ClientConfig::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
    {
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}: not KEY=VALUE: {line}", file.display()));
        config.set(key.trim(), value.trim());
    }
    config
        .set("group.id", group)
        .set("auto.offset.reset", "earliest");
    for (key, value) in overrides {
        config.set(*key, *value);
    }
    config
}

/// A name no other test (in this or another process) uses: `prefix-pid-time-counter`.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{nanos}-{count}", std::process::id())
}

/// A record the helpers produced, with where it landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Produced {
    pub partition: i32,
    pub offset: i64,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

/// A topic with records behind a group's committed offsets ([`Kafka::backlog`]).
pub struct Backlog {
    pub topic: String,
    pub group: String,
    /// What was produced, in the order produced.
    pub produced: Vec<Produced>,
}

/// The key and payload of the `index`-th record produced to `topic`.
pub fn key_and_payload(topic: &str, index: usize) -> (Vec<u8>, Vec<u8>) {
    (
        format!("key-{index}").into_bytes(),
        format!("{topic}:{index}").into_bytes(),
    )
}

/// The record [`Kafka::send`] sent for `index`, where `delivery` says it landed.
fn produced_at(topic: &str, index: usize, delivery: &Delivery) -> Produced {
    let (key, payload) = key_and_payload(topic, index);
    Produced {
        partition: delivery.partition,
        offset: delivery.offset,
        key,
        payload,
    }
}

/// The test broker and clients to it.
pub struct Kafka {
    pub bootstrap: String,
    admin: AdminClient<DefaultClientContext>,
    producer: FutureProducer,
}

impl Kafka {
    /// Connects to the test broker.
    pub fn connect() -> Self {
        Self::connect_to(&bootstrap())
    }

    /// Connects to the broker at `bootstrap` (a [`PrivateBroker`](private_broker::PrivateBroker),
    /// say).
    pub fn connect_to(bootstrap: &str) -> Self {
        let bootstrap = bootstrap.to_owned();
        let admin = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .expect("admin client");
        let producer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            // A batch caught in a broker restart fails within 20 s and is sent again by
            // `produce_from_retrying`, instead of waiting librdkafka's default 5 minutes (the
            // broker-restart test's producer once outlived its 60 s deadline that way).
            .set("message.timeout.ms", "20000")
            .create()
            .expect("producer");
        Self {
            bootstrap,
            admin,
            producer,
        }
    }

    /// Base configuration for a consumer in `group`.
    pub fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000");
        config
    }

    /// Creates `topic` with `partitions` partitions (replication 1) and `configs`, and waits
    /// until its metadata is visible.
    pub async fn create_topic_with(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (key, value) in configs {
            new_topic = new_topic.set(key, value);
        }
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = self
            .admin
            .create_topics([&new_topic], &options)
            .await
            .expect("create_topics");
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => panic!("creating topic {name} failed: {code}"),
            }
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let metadata = self.producer_metadata(topic);
            if metadata == Some(partitions as usize) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "topic {topic} did not appear in metadata"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes `topic` and waits until its metadata is gone.
    pub async fn delete_topic(&self, topic: &str) {
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = self
            .admin
            .delete_topics(&[topic], &options)
            .await
            .expect("delete_topics");
        for result in results {
            if let Err((name, code)) = result {
                panic!("deleting topic {name} failed: {code}");
            }
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        while self.producer_metadata(topic).is_some() {
            assert!(Instant::now() < deadline, "topic {topic} did not go away");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Creates `topic` with `partitions` partitions.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        self.create_topic_with(topic, partitions, &[]).await;
    }

    fn producer_metadata(&self, topic: &str) -> Option<usize> {
        use rdkafka::producer::Producer;
        let metadata = self
            .producer
            .client()
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
            .ok()?;
        let topic = metadata.topics().first()?;
        if topic.error().is_some() {
            return None;
        }
        let partitions = topic.partitions();
        partitions
            .iter()
            .all(|p| p.leader() >= 0)
            .then_some(partitions.len())
    }

    /// The setup most scenarios start from: a new topic (named from `name`) of `partitions`
    /// partitions with `count` records produced over them ([`Kafka::produce`]), and a new
    /// group whose offsets an operator committed at 0, so that its consumer starts behind all
    /// of them.
    pub async fn backlog(&self, name: &str, partitions: i32, count: usize) -> Backlog {
        let topic = unique(name);
        self.create_topic(&topic, partitions).await;
        let produced = self.produce(&topic, partitions, count).await;
        let group = unique(&format!("{name}-group"));
        let starts = vec![0; usize::try_from(partitions).expect("a partition count")];
        self.commit_as_operator(&group, &topic, &starts);
        Backlog {
            topic,
            group,
            produced,
        }
    }

    /// Produces `count` records round-robin over `partitions` partitions: record `i` goes to
    /// partition `i % partitions` with [`key_and_payload`]`(topic, first_index + i)`.
    pub async fn produce(&self, topic: &str, partitions: i32, count: usize) -> Vec<Produced> {
        self.produce_from(topic, partitions, 0, count).await
    }

    /// Like [`Kafka::produce`], numbering records from `first_index`.
    pub async fn produce_from(
        &self,
        topic: &str,
        partitions: i32,
        first_index: usize,
        count: usize,
    ) -> Vec<Produced> {
        self.produce_records(topic, first_index, count, |index| {
            (index % partitions as usize) as i32
        })
        .await
    }

    /// Produces `count` records to one partition, numbered from `first_index`.
    pub async fn produce_to(
        &self,
        topic: &str,
        partition: i32,
        first_index: usize,
        count: usize,
    ) -> Vec<Produced> {
        self.produce_records(topic, first_index, count, |_| partition)
            .await
    }

    /// Sends every record first and awaits the deliveries after: one round trip per batch,
    /// not per record.
    async fn produce_records(
        &self,
        topic: &str,
        first_index: usize,
        count: usize,
        partition_of: impl Fn(usize) -> i32,
    ) -> Vec<Produced> {
        let mut pending = Vec::with_capacity(count);
        for index in first_index..first_index + count {
            let sent = self.send(topic, index, partition_of(index)).await;
            pending.push(sent.unwrap_or_else(|err| panic!("producing to {topic} failed: {err}")));
        }
        let mut produced = Vec::with_capacity(count);
        for (future, index) in pending.into_iter().zip(first_index..) {
            let delivery = future.await.expect("delivery future dropped");
            match delivery {
                Ok(delivery) => produced.push(produced_at(topic, index, &delivery)),
                Err((err, _)) => panic!("delivery to {topic} failed: {err}"),
            }
        }
        produced
    }

    /// Like [`Kafka::produce_from`], but a record whose send or delivery fails (the broker
    /// was away too long, say) is sent again after `backoff`, until the broker acknowledges
    /// every record. Returns them in index order, and the number of failed attempts.
    pub async fn produce_from_retrying(
        &self,
        topic: &str,
        partitions: i32,
        first_index: usize,
        count: usize,
        backoff: Duration,
    ) -> (Vec<Produced>, u64) {
        let mut produced = vec![None; count];
        let mut failures = 0;
        let mut left: Vec<usize> = (first_index..first_index + count).collect();
        while !left.is_empty() {
            let mut pending = Vec::with_capacity(left.len());
            for index in left.drain(..) {
                let partition = (index % partitions as usize) as i32;
                pending.push((index, self.send(topic, index, partition).await));
            }
            for (index, sent) in pending {
                let delivery = match sent {
                    Ok(future) => future
                        .await
                        .expect("delivery future dropped")
                        .map_err(|(err, _)| err),
                    Err(err) => Err(err),
                };
                match delivery {
                    Ok(delivery) => {
                        produced[index - first_index] = Some(produced_at(topic, index, &delivery))
                    }
                    Err(err) => {
                        if left.is_empty() {
                            eprintln!("producing record {index} to {topic} failed: {err}");
                        }
                        left.push(index);
                    }
                }
            }
            if !left.is_empty() {
                eprintln!(
                    "{} records to {topic} failed; sending them again",
                    left.len()
                );
                failures += left.len() as u64;
                tokio::time::sleep(backoff).await;
            }
        }
        (produced.into_iter().flatten().collect(), failures)
    }

    /// Sends the `index`-th record of `topic` ([`key_and_payload`]) to `partition`, waiting
    /// while the local queue is full.
    async fn send(
        &self,
        topic: &str,
        index: usize,
        partition: i32,
    ) -> Result<DeliveryFuture, KafkaError> {
        let (key, payload) = key_and_payload(topic, index);
        let mut record = FutureRecord::to(topic)
            .key(&key)
            .payload(&payload)
            .partition(partition);
        loop {
            match self.producer.send_result(record) {
                Ok(future) => return Ok(future),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    record = returned;
                    // The local queue drains as deliveries complete.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((err, _)) => return Err(err),
            }
        }
    }

    /// Produces `(key, value)` records to one partition, in order, and waits for them.
    pub async fn produce_keyed(&self, topic: &str, partition: i32, records: &[(String, String)]) {
        let mut pending = Vec::with_capacity(records.len());
        for (key, value) in records {
            let record = FutureRecord::to(topic)
                .key(key)
                .payload(value)
                .partition(partition);
            match self.producer.send_result(record) {
                Ok(future) => pending.push(future),
                Err((err, _)) => panic!("producing to {topic} failed: {err}"),
            }
        }
        for future in pending {
            if let Err((err, _)) = future.await.expect("delivery future dropped") {
                panic!("delivery to {topic} failed: {err}");
            }
        }
    }

    /// Produces `per_partition` records to each of `partitions` partitions, in order, with
    /// key `key-<offset>` and the value `value(partition, offset)` (so a reader can check
    /// each record's content), and waits for them.
    pub async fn produce_values(
        &self,
        topic: &str,
        partitions: i32,
        per_partition: i64,
        value: impl Fn(i32, i64) -> String,
    ) {
        for partition in 0..partitions {
            let records: Vec<(String, String)> = (0..per_partition)
                .map(|offset| (format!("key-{offset}"), value(partition, offset)))
                .collect();
            self.produce_keyed(topic, partition, &records).await;
        }
    }

    /// The group's committed offset per partition (`None`: nothing committed).
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
        let consumer: BaseConsumer = self.consumer_config(group).create().expect("consumer");
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, REQUEST_TIMEOUT)
            .expect("committed offsets");
        (0..partitions)
            .map(|partition| {
                match committed
                    .find_partition(topic, partition)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(offset)) => Some(offset),
                    _ => None,
                }
            })
            .collect()
    }

    /// Commits `offsets` (one per partition, from 0) for `group` from outside the group, as
    /// an operator's tool would while the group is empty.
    pub fn commit_as_operator(&self, group: &str, topic: &str, offsets: &[i64]) {
        let consumer: BaseConsumer = self.consumer_config(group).create().expect("consumer");
        let mut list = TopicPartitionList::new();
        for (partition, offset) in offsets.iter().enumerate() {
            list.add_partition_offset(topic, partition as i32, Offset::Offset(*offset))
                .expect("offset");
        }
        consumer.commit(&list, CommitMode::Sync).expect("commit");
    }

    /// `(low, high)` watermarks of every partition.
    pub fn watermarks(&self, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
        let consumer: BaseConsumer = self
            .consumer_config(&unique("watermarks"))
            .create()
            .expect("consumer");
        (0..partitions)
            .map(|partition| {
                consumer
                    .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
                    .expect("watermarks")
            })
            .collect()
    }
}

/// What [`consume_all`] saw: every record by (partition, offset), and how often.
#[derive(Debug, Default)]
pub struct Consumed {
    pub records: HashMap<(i32, i64), (Vec<u8>, Vec<u8>)>,
    pub deliveries: HashMap<(i32, i64), usize>,
}

/// Consumes `topic` with a group consumer until `expected` distinct records arrived (or
/// `deadline` passed), then commits synchronously.
pub async fn consume_all(
    consumer: &StreamConsumer,
    expected: usize,
    deadline: Duration,
) -> Consumed {
    let mut consumed = Consumed::default();
    let until = Instant::now() + deadline;
    while consumed.records.len() < expected {
        let left = until.saturating_duration_since(Instant::now());
        let message = match tokio::time::timeout(left, consumer.recv()).await {
            Ok(Ok(message)) => message,
            Ok(Err(err)) => panic!("consumer error: {err}"),
            Err(_) => break,
        };
        let at = (message.partition(), message.offset());
        *consumed.deliveries.entry(at).or_default() += 1;
        let key = message.key().unwrap_or_default().to_vec();
        let payload = message.payload().unwrap_or_default().to_vec();
        consumed.records.insert(at, (key, payload));
    }
    if !consumed.records.is_empty() {
        consumer
            .commit_consumer_state(CommitMode::Sync)
            .expect("commit");
    }
    consumed
}

/// The latest value of `key` in the side topic (`None`: absent or a tombstone).
pub fn side_value(kafka: &Kafka, side_topic: &str, key: &str) -> Option<String> {
    use rdkafka::consumer::Consumer as _;
    let (group, _, _) = catchup::plan::parse_side_key(key).expect("a side key");
    let partition = side_partition(kafka, side_topic, group);
    let consumer: BaseConsumer = kafka
        .consumer_config(&unique("side-reader"))
        .create()
        .expect("consumer");
    let (low, high) = consumer
        .fetch_watermarks(side_topic, partition, REQUEST_TIMEOUT)
        .expect("side watermarks");
    if high <= low {
        return None;
    }
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(side_topic, partition, Offset::Beginning)
        .expect("offset");
    consumer.assign(&list).expect("assign");
    let mut latest = None;
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    loop {
        assert!(
            Instant::now() < deadline,
            "reading the side topic timed out"
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.expect("side message");
        if message.key() == Some(key.as_bytes()) {
            latest = message
                .payload()
                .map(|p| String::from_utf8_lossy(p).into_owned());
        }
        if message.offset() + 1 >= high {
            return latest;
        }
    }
}

/// Waits (bounded) until an event satisfies `predicate`; returns it.
pub async fn wait_for_event(
    events: &mut tokio::sync::broadcast::Receiver<catchup::Event>,
    timeout: Duration,
    predicate: impl FnMut(&catchup::Event) -> bool,
) -> catchup::Event {
    wait_for_named_event(events, timeout, "matching event", predicate).await
}

/// As [`wait_for_event`]; the panic at the timeout names `what` was awaited.
pub async fn wait_for_named_event(
    events: &mut tokio::sync::broadcast::Receiver<catchup::Event>,
    timeout: Duration,
    what: &str,
    mut predicate: impl FnMut(&catchup::Event) -> bool,
) -> catchup::Event {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(event)) if predicate(&event) => return event,
            Ok(Ok(event)) if std::env::var_os("CATCHUP_TEST_EVENTS").is_some() => {
                eprintln!("event: {event:?}")
            }
            Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(err)) => panic!("event channel closed: {err}"),
            Err(_) => panic!("no {what} within {timeout:?}"),
        }
    }
}

/// The consumer's next delivery, awaited at most `within`; panics when none comes in time
/// or `recv` fails.
pub async fn next_delivery(
    consumer: &catchup::CatchupConsumer,
    within: Duration,
) -> catchup::Delivery {
    next_delivery_or(consumer, within, || {
        format!("no delivery within {within:?}")
    })
    .await
}

/// As [`next_delivery`]; the panic when none comes in time is `stalled()`, which can say
/// what the test was waiting for.
pub async fn next_delivery_or(
    consumer: &catchup::CatchupConsumer,
    within: Duration,
    stalled: impl FnOnce() -> String,
) -> catchup::Delivery {
    match tokio::time::timeout(within, consumer.recv()).await {
        Ok(Ok(delivery)) => delivery,
        Ok(Err(err)) => panic!("recv: {err}"),
        Err(_) => panic!("{}", stalled()),
    }
}

/// Takes deliveries without acknowledging them (what is handed out and not acknowledged
/// counts against the byte budget) until an event satisfies `predicate` (bounded); returns
/// what was taken and that event.
pub async fn take_unacked_until_event(
    consumer: &catchup::CatchupConsumer,
    events: &mut tokio::sync::broadcast::Receiver<catchup::Event>,
    timeout: Duration,
    mut predicate: impl FnMut(&catchup::Event) -> bool,
) -> (Vec<catchup::Delivery>, catchup::Event) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut taken = Vec::new();
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(event) if predicate(&event) => return (taken, event),
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(err) => panic!("event channel closed: {err}"),
            },
            // Cancel-safe: `recv` waits only before it hands a record out.
            delivery = consumer.recv() => taken.push(delivery.expect("recv")),
            _ = tokio::time::sleep_until(deadline) => panic!("no matching event within {timeout:?}"),
        }
    }
}

/// The default side topic (the mock cluster cannot create topics through the admin API).
pub const MOCK_SIDE_TOPIC: &str = "__catchup_side";

/// librdkafka's mock cluster of one broker holding `topic` (one partition) and the default side
/// topic, the broker coordinating `group`; with a client of it.
pub fn mock_cluster(
    topic: &str,
    group: &str,
) -> (
    rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    Kafka,
) {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    stock_mock_cluster(&cluster, topic, group);
    let kafka = Kafka::connect_to(&cluster.bootstrap_servers());
    (cluster, kafka)
}

/// Gives a mock cluster of one broker `topic` (one partition) and the default side topic, and
/// makes its broker coordinate `group`.
pub fn stock_mock_cluster<C: rdkafka::ClientContext>(
    cluster: &rdkafka::mocking::MockCluster<'_, C>,
    topic: &str,
    group: &str,
) {
    cluster.create_topic(topic, 1, 1).expect("mock topic");
    cluster
        .create_topic(MOCK_SIDE_TOPIC, 1, 1)
        .expect("side topic");
    cluster
        .coordinator(rdkafka::mocking::MockCoordinator::Group(group.into()), 1)
        .expect("coordinator");
}

/// Test settings: `mode`, `min_lag`, frequent commits, the buffer in `dir`.
pub fn test_config(
    dir: &std::path::Path,
    mode: catchup::Mode,
    min_lag: u64,
) -> catchup::CatchupConfig {
    catchup::CatchupConfig::new(dir)
        .mode(mode)
        .min_lag(min_lag)
        .commit_interval(Duration::from_millis(200))
}

/// The partition of `side_topic` holding `group`'s side entries (as the consumer picks it).
pub fn side_partition(kafka: &Kafka, side_topic: &str, group: &str) -> i32 {
    use rdkafka::consumer::Consumer as _;
    let consumer: BaseConsumer = kafka
        .consumer_config(&unique("side-metadata"))
        .create()
        .expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some(side_topic), REQUEST_TIMEOUT)
        .expect("side topic metadata");
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == side_topic)
        .map_or(0, |t| t.partitions().len() as i32);
    assert!(partitions > 0, "side topic {side_topic} has no partitions");
    catchup::plan::side_partition(group, partitions)
}

/// Subscribes `consumer` to `topic` and waits (bounded) for the first split; returns the
/// event receiver, subscribed before anything could happen, and that split event.
pub async fn subscribe_until_split(
    consumer: &catchup::CatchupConsumer,
    topic: &str,
) -> (
    tokio::sync::broadcast::Receiver<catchup::Event>,
    catchup::Event,
) {
    let mut events = consumer.events();
    consumer.subscribe(&[topic]).expect("subscribe");
    let split = wait_for_event(&mut events, Duration::from_secs(60), |e| {
        matches!(e, catchup::Event::SplitStarted { .. })
    })
    .await;
    (events, split)
}

/// A catchup consumer for `group` on this broker.
pub fn catchup_consumer(
    kafka: &Kafka,
    group: &str,
    config: catchup::CatchupConfig,
) -> catchup::CatchupConsumer {
    catchup::CatchupConsumer::new(&kafka.consumer_config(group), config).expect("catchup consumer")
}

/// Opens a buffer directory with sled itself (to damage it the way a disk or a crafted file
/// would), with the segment size the buffer was created with: sled refuses any other.
pub fn raw_sled(dir: &std::path::Path) -> sled::Result<sled::Db> {
    let dir = &sled_dir(dir);
    let conf = std::fs::read(dir.join("conf")).unwrap_or_default();
    let segment = String::from_utf8_lossy(&conf)
        .lines()
        .find_map(|line| line.strip_prefix("segment_size: ")?.trim().parse().ok())
        .unwrap_or(4 << 20);
    sled::Config::new().path(dir).segment_size(segment).open()
}

/// Where the buffer in `dir` keeps its sled database: after a compaction, in the generation
/// `CURRENT` names.
fn sled_dir(dir: &std::path::Path) -> std::path::PathBuf {
    match std::fs::read_to_string(dir.join("CURRENT")) {
        Ok(name) => dir.join(name.trim()),
        Err(_) => dir.to_path_buf(),
    }
}

/// Waits (bounded) until nothing holds the sled lock of the buffer in `dir`: a dropped
/// `sled::Db` lets go of its file only once its background thread has ended, and a process
/// opening the buffer meanwhile is told it is in use.
pub fn wait_sled_released(dir: &std::path::Path) {
    let path = sled_dir(dir).join("db");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("the sled database file");
    let deadline = Instant::now() + Duration::from_secs(30);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // sled locks the file with `flock`: taking and letting go of the same lock tells it free.
    // SAFETY: `fd` is the open file's, for the duration of the calls.
    while unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        assert!(
            Instant::now() < deadline,
            "{} is still locked after 30 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe { libc::flock(fd, libc::LOCK_UN) };
}

/// Waits (bounded) until `consumer` has buffered every partition of its assignment up to
/// `fetched_next` in the live lane, and `partitions` are assigned.
pub async fn wait_until_buffered(
    consumer: &catchup::CatchupConsumer,
    partitions: usize,
    fetched_next: i64,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let buffers = consumer.buffers().expect("buffers");
        if buffers.len() == partitions
            && buffers.iter().all(|b| b.live.fetched_next == fetched_next)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not buffered in time: {buffers:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One past the last offset `produced` has in each of `partitions` partitions (0 for one it
/// has none in).
pub fn partition_ends(produced: &[Produced], partitions: i32) -> Vec<i64> {
    let mut ends = vec![0i64; usize::try_from(partitions).expect("a partition count")];
    for record in produced {
        let end = &mut ends[usize::try_from(record.partition).expect("a partition")];
        *end = (*end).max(record.offset + 1);
    }
    ends
}

/// Commits what `consumer` acknowledged until `group` stands committed at `ends` on every
/// partition of `topic`; fails after `wait`.
pub async fn await_committed_at(
    kafka: &Kafka,
    consumer: &catchup::CatchupConsumer,
    group: &str,
    topic: &str,
    ends: &[i64],
    wait: Duration,
) {
    let partitions = i32::try_from(ends.len()).expect("a partition count");
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        consumer.commit().await.expect("commit");
        let committed = kafka.committed(group, topic, partitions);
        if committed
            .iter()
            .zip(ends)
            .all(|(at, end)| *at == Some(*end))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "committed {committed:?}, ends {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
