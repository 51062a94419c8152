//! The public vocabulary of the consumer: configuration, deliveries, events, buffer views.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::fetch::DiskFloor;
use crate::store::OffsetRange;

/// How the reader hands records to the application. New modes may come in minor versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Per partition, all of the catch-up lane, then the live lane: strictly increasing
    /// offsets (the proposal's semantics).
    #[default]
    Ordered,
    /// Fresh-first: both lanes at once, each in offset order, every record tagged with its
    /// lane. Removes the lag for fresh records.
    Concurrent,
    /// No split: plain consumption through the same pipeline (the baseline).
    Off,
    /// For topics that keep the latest state per key (upserts, changelogs, compacted
    /// topics): fresh-first as `Concurrent`, and while a partition is split a record whose
    /// key already has a newer record buffered or delivered on that partition is skipped —
    /// counted processed (it moves commits like an acknowledged record), never handed out.
    /// Per key, the offsets handed out only increase; records without a key are never
    /// skipped; a tombstone (no value) is a record like any other. After a restart the
    /// backlog waits until the split's live records delivered before it were read again
    /// from Kafka (keys only), so an older value never follows a newer one seen earlier.
    Latest,
}

impl Mode {
    /// `"ordered"`, `"concurrent"`, `"off"` or `"latest"`: the name `catchup run --mode`
    /// takes.
    ///
    /// ```
    /// assert_eq!(catchup::Mode::default().as_str(), "ordered");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ordered => "ordered",
            Mode::Concurrent => "concurrent",
            Mode::Off => "off",
            Mode::Latest => "latest",
        }
    }

    /// Whether fresh records go first, each lane in its own order (`Concurrent`, `Latest`).
    pub(crate) fn fresh_first(self) -> bool {
        matches!(self, Mode::Concurrent | Mode::Latest)
    }
}

/// Settings of a [`CatchupConsumer`](crate::CatchupConsumer) beyond rdkafka's, built from
/// [`CatchupConfig::new`] and its setters (new settings may come in minor versions, with
/// defaults):
///
/// ```
/// use std::time::Duration;
/// use catchup::{CatchupConfig, Mode};
///
/// let config = CatchupConfig::new("/var/lib/orders-app/buffer")
///     .mode(Mode::Concurrent)
///     .min_lag(10_000)
///     .commit_interval(Duration::from_millis(500));
/// assert_eq!(config.mode, Mode::Concurrent);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CatchupConfig {
    /// The buffer directory (created 0700 if missing). One per consumer instance.
    pub buffer_dir: PathBuf,
    /// Delivery mode.
    pub mode: Mode,
    /// Split a partition only when its backlog is at least this many offsets.
    pub min_lag: u64,
    /// The compacted side topic for live progress (created if missing). `{group}` in the
    /// name is replaced by the group id, giving each group a topic of its own that ACLs can
    /// keep apart (see [`CatchupConfig::side_topic_for`]).
    pub side_topic: String,
    /// How often processed offsets are committed — and sooner (at most every 20 ms) once
    /// a 32nd of [`buffer_budget_bytes`](Self::buffer_budget_bytes) was processed since the
    /// last commit: the buffer drops processed records only once their commit is in Kafka,
    /// and holds them in memory until then. (Below 20 ms, commits come every 20 ms.)
    pub commit_interval: Duration,
    /// Acknowledge every record when `recv` hands it out (the proposal's auto-commit
    /// behaviour); records still queued inside the consumer are never counted.
    pub auto_ack: bool,
    /// Bytes of unprocessed records the buffer may hold, divided evenly over the lanes being
    /// fetched: a partition's lane pauses above its share and resumes below half of it. A
    /// quarter of it is the buffer's memory tier: records the reader takes from memory, and
    /// that a commit drops without writing them; what waits beyond it is written to disk. A
    /// catch-up lane reads ahead of the reader about an eighth of its share (fetched and
    /// not handed out yet), and at least one fetch of a partition within half its share: the
    /// rest of its backlog waits in Kafka, not on disk. Once an eighth of it (at least 1 MiB)
    /// that the application acknowledged waits for commits that have not landed, the reader
    /// reads no partition holding its share of that until its commit lands
    /// (`docs/buffer.md`).
    pub buffer_budget_bytes: u64,
    /// Free space to leave on the buffer's filesystem: below it both fetchers pause every
    /// partition and write nothing until the space is back (the records wait in Kafka).
    /// The larger of 256 MiB and 5 % by default; [`DiskFloor::DISABLED`] turns it off.
    pub disk_floor: DiskFloor,
    /// Disk the buffer may occupy beyond twice the payload it holds before it is compacted
    /// into a fresh database, giving back what sled keeps after a backlog drained
    /// (the buffer's compaction is in `docs/buffer.md`); 64 MiB.
    pub disk_allowance_bytes: u64,
    /// What the application plugs into the Kafka clients catchup creates (statistics,
    /// rebalance notifications); none by default.
    pub hooks: Option<Arc<dyn ClientHooks>>,
}

/// What an application plugs into the clients catchup creates — the group member (`live`),
/// the catch-up consumer (`catchup`), the side log's producer, reader, probe and admin client — where
/// with plain rdkafka it would write a `ClientContext` of its own. Every method does nothing
/// by default. They run on catchup's and librdkafka's threads: keep them short.
pub trait ClientHooks: Send + Sync + 'static {
    /// librdkafka's statistics, as the JSON it emits every `statistics.interval.ms` (set it
    /// in the `ClientConfig`), from the client playing `role`. `rdkafka::Statistics`
    /// parses it with serde.
    fn statistics(&self, role: &str, json: &[u8]) {
        let _ = (role, json);
    }

    /// The group member was assigned `partitions` (with an incremental protocol, those
    /// added) and reconciled them; called before any of their records is fetched.
    fn assigned(&self, partitions: &[(String, i32)]) {
        let _ = partitions;
    }

    /// `partitions` are being revoked (`lost`: the group already gave them to another
    /// member). Called before what was acknowledged of them is committed: the last moment
    /// to [`ack`](crate::CatchupConsumer::ack) work finished in flight. Once it returns,
    /// queued deliveries of these partitions are no longer handed out and their
    /// acknowledgements are ignored.
    fn revoking(&self, partitions: &[(String, i32)], lost: bool) {
        let _ = (partitions, lost);
    }

    /// An OAUTHBEARER token for the client playing `role`, when the `ClientConfig` says
    /// `sasl.mechanism=OAUTHBEARER` (and not `sasl.oauthbearer.method=oidc`, where librdkafka
    /// fetches tokens itself): asked when each client starts and again before its token
    /// expires, with the value of `sasl.oauthbearer.config`. What a plain rdkafka
    /// application writes as `ClientContext::generate_oauth_token`. An error fails the
    /// client's authentication, which stops the consumer with
    /// [`Error::Refused`](crate::Error::Refused) if no request gets through for 10 s. It
    /// runs on catchup's own threads — the group member's among them, inside a rebalance —
    /// so it should answer quickly (a cached token, refreshed elsewhere).
    fn oauth_token(
        &self,
        role: &str,
        oauthbearer_config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        let _ = (role, oauthbearer_config);
        Err("ClientHooks::oauth_token is not implemented".into())
    }
}

/// Hooks shared with the application: `config.hooks(Arc::clone(&hooks))`.
impl<H: ClientHooks + ?Sized> ClientHooks for Arc<H> {
    fn statistics(&self, role: &str, json: &[u8]) {
        (**self).statistics(role, json);
    }

    fn assigned(&self, partitions: &[(String, i32)]) {
        (**self).assigned(partitions);
    }

    fn revoking(&self, partitions: &[(String, i32)], lost: bool) {
        (**self).revoking(partitions, lost);
    }

    fn oauth_token(
        &self,
        role: &str,
        oauthbearer_config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        (**self).oauth_token(role, oauthbearer_config)
    }
}

impl std::fmt::Debug for dyn ClientHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientHooks")
    }
}

impl CatchupConfig {
    /// Defaults: `Ordered`, `min_lag` 1000, side topic `__catchup_side`, commits every second,
    /// explicit acks, a 256 MiB budget, a free-space floor of the larger of 256 MiB and 5 %.
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("/var/lib/orders-app/buffer");
    /// assert_eq!(config.mode, catchup::Mode::Ordered);
    /// ```
    pub fn new(buffer_dir: impl Into<PathBuf>) -> Self {
        Self {
            buffer_dir: buffer_dir.into(),
            mode: Mode::Ordered,
            min_lag: 1000,
            side_topic: "__catchup_side".into(),
            commit_interval: Duration::from_secs(1),
            auto_ack: false,
            buffer_budget_bytes: 256 << 20,
            disk_floor: DiskFloor::default(),
            disk_allowance_bytes: 64 << 20,
            hooks: None,
        }
    }

    /// Sets [`mode`](Self::mode) (`Ordered` by default).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer").mode(catchup::Mode::Concurrent);
    /// ```
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets [`min_lag`](Self::min_lag): the least backlog, in offsets, a partition is split
    /// for (1000 by default).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer").min_lag(50_000);
    /// ```
    pub fn min_lag(mut self, offsets: u64) -> Self {
        self.min_lag = offsets;
        self
    }

    /// Sets [`side_topic`](Self::side_topic), a name or a `{group}` template
    /// (`__catchup_side` by default).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer").side_topic("catchup-side.{group}");
    /// assert_eq!(config.side_topic_for("orders").unwrap(), "catchup-side.orders");
    /// ```
    pub fn side_topic(mut self, topic: impl Into<String>) -> Self {
        self.side_topic = topic.into();
        self
    }

    /// Sets [`commit_interval`](Self::commit_interval) (1 s by default).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer")
    ///     .commit_interval(std::time::Duration::from_millis(250));
    /// ```
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// Sets [`auto_ack`](Self::auto_ack) (off by default: the application acknowledges).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer").auto_ack(true);
    /// ```
    pub fn auto_ack(mut self, auto_ack: bool) -> Self {
        self.auto_ack = auto_ack;
        self
    }

    /// Sets [`buffer_budget_bytes`](Self::buffer_budget_bytes) (256 MiB by default).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer").buffer_budget_bytes(1 << 30);
    /// ```
    pub fn buffer_budget_bytes(mut self, bytes: u64) -> Self {
        self.buffer_budget_bytes = bytes;
        self
    }

    /// Sets [`disk_floor`](Self::disk_floor) (the larger of 256 MiB and 5 % by default).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer")
    ///     .disk_floor(catchup::DiskFloor::new(2 << 30, 10.0));
    /// ```
    pub fn disk_floor(mut self, floor: DiskFloor) -> Self {
        self.disk_floor = floor;
        self
    }

    /// Sets [`disk_allowance_bytes`](Self::disk_allowance_bytes) (64 MiB by default).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer").disk_allowance_bytes(256 << 20);
    /// ```
    pub fn disk_allowance_bytes(mut self, bytes: u64) -> Self {
        self.disk_allowance_bytes = bytes;
        self
    }

    /// Plugs `hooks` into the clients catchup creates (an `Arc` of them serves too, so the
    /// application can keep a handle).
    ///
    /// ```
    /// struct Stats;
    /// impl catchup::ClientHooks for Stats {
    ///     fn statistics(&self, role: &str, json: &[u8]) {
    ///         println!("{role}: {} bytes of statistics", json.len());
    ///     }
    /// }
    /// let config = catchup::CatchupConfig::new("buffer").hooks(Stats);
    /// assert!(config.hooks.is_some());
    /// ```
    pub fn hooks(mut self, hooks: impl ClientHooks) -> Self {
        self.hooks = Some(Arc::new(hooks));
        self
    }

    /// The side topic `group` uses: [`side_topic`](Self::side_topic) with `{group}`
    /// replaced by the group id. An error when the result is not a legal topic name (Kafka
    /// allows ASCII letters, digits, `.`, `_` and `-`, at most 249 of them).
    ///
    /// ```
    /// let config = catchup::CatchupConfig::new("buffer").side_topic("side.{group}");
    /// assert_eq!(config.side_topic_for("orders"), Ok("side.orders".to_owned()));
    /// assert!(config.side_topic_for("team/orders").is_err());
    /// ```
    pub fn side_topic_for(&self, group: &str) -> Result<String, String> {
        let name = self.side_topic.replace("{group}", group);
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if name.is_empty() || name == "." || name == ".." || name.len() > 249 {
            return Err(format!("side topic {name:?} is not a legal topic name"));
        }
        if let Some(bad) = name.chars().find(|&c| !legal(c)) {
            let hint = if self.side_topic.contains("{group}") {
                format!(
                    " (from the template {:?} and group {group:?})",
                    self.side_topic
                )
            } else {
                String::new()
            };
            return Err(format!(
                "side topic {name:?}{hint} contains {bad:?}; topic names allow only ASCII letters, digits, '.', '_' and '-'"
            ));
        }
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_topic_templates_name_one_topic_per_group() {
        let mut config = CatchupConfig::new("unused");
        assert_eq!(config.side_topic_for("orders"), Ok("__catchup_side".into()));
        config.side_topic = "catchup-side.{group}".into();
        assert_eq!(
            config.side_topic_for("orders-app"),
            Ok("catchup-side.orders-app".into())
        );
        for (group, bad) in [("team/orders", "'/'"), ("a b", "' '")] {
            let err = config.side_topic_for(group).unwrap_err();
            assert!(err.contains(bad) && err.contains("template"), "{err}");
        }
        config.side_topic = "{group}".into();
        assert!(config.side_topic_for("").is_err());
        assert!(config.side_topic_for(&"g".repeat(250)).is_err());
        assert!(config.side_topic_for("..").is_err());
    }
}

/// Which lane a delivered record came through. The three lanes are the model's (DESIGN):
/// this enum stays exhaustive, so a `match` on it needs no wildcard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeliveryLane {
    /// The backlog below the boundary.
    Catchup,
    /// At or after the boundary of a split partition.
    Live,
    /// A partition that is not split.
    Plain,
}

impl DeliveryLane {
    /// `"catchup"`, `"live"` or `"plain"`.
    ///
    /// ```
    /// assert_eq!(catchup::DeliveryLane::Live.as_str(), "live");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryLane::Catchup => "catchup",
            DeliveryLane::Live => "live",
            DeliveryLane::Plain => "plain",
        }
    }
}

/// A record handed to the application. Acknowledge it with
/// [`CatchupConsumer::ack`](crate::CatchupConsumer::ack) once processed.
///
/// Key and value are [`Bytes`]: shared with the buffer, not copied for each delivery, and
/// cheap to clone. A record fetched with its neighbours shares one allocation with them (up
/// to 16 KiB, freed with the last of them): to keep a value for long, copy it
/// (`payload.to_vec()`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delivery {
    /// Topic (shared by the deliveries of one assignment of the partition).
    pub topic: std::sync::Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key; `None` for a null key.
    pub key: Option<Bytes>,
    /// Value; `None` for a null value (a tombstone).
    pub payload: Option<Bytes>,
    /// Headers, in the order the producer wrote them.
    pub headers: DeliveryHeaders,
    /// Timestamp.
    pub timestamp: Timestamp,
    /// The lane it came through.
    pub lane: DeliveryLane,
    /// The assignment it belongs to: an ack after a revocation is ignored.
    pub(crate) generation: u64,
}

/// A record's timestamp, as Kafka reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timestamp {
    /// The broker sent no timestamp.
    NotAvailable,
    /// Set by the producer (`message.timestamp.type=CreateTime`), in ms since the epoch.
    CreateTime(i64),
    /// Set by the broker on append (`message.timestamp.type=LogAppendTime`), in ms.
    LogAppendTime(i64),
}

impl Timestamp {
    /// The milliseconds since the epoch, whichever kind (`None`: not available).
    ///
    /// ```
    /// assert_eq!(catchup::Timestamp::CreateTime(1_700).to_millis(), Some(1_700));
    /// assert_eq!(catchup::Timestamp::NotAvailable.to_millis(), None);
    /// ```
    pub fn to_millis(self) -> Option<i64> {
        match self {
            Timestamp::CreateTime(ms) | Timestamp::LogAppendTime(ms) => Some(ms),
            Timestamp::NotAvailable => None,
        }
    }

    /// The buffer's stored timestamp, as delivered.
    pub(crate) fn stored(stored: crate::store::Timestamp) -> Self {
        match stored {
            crate::store::Timestamp::NotAvailable => Timestamp::NotAvailable,
            crate::store::Timestamp::CreateTime(ms) => Timestamp::CreateTime(ms),
            crate::store::Timestamp::LogAppendTime(ms) => Timestamp::LogAppendTime(ms),
        }
    }
}

/// One record header: a name and an optional value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Header {
    /// Header name.
    pub key: String,
    /// Header value; `None` is a null value, distinct from an empty one.
    pub value: Option<Vec<u8>>,
}

/// The headers of a [`Delivery`]: a list of [`Header`]s (a slice through `Deref`), also
/// readable through rdkafka's [`Headers`](rdkafka::message::Headers) trait.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeliveryHeaders(pub Vec<Header>);

impl DeliveryHeaders {
    /// The buffer's stored headers, as delivered (the vector is reused: the two header
    /// types have one layout).
    pub(crate) fn stored(stored: Vec<crate::store::Header>) -> Self {
        DeliveryHeaders(
            stored
                .into_iter()
                .map(|header| Header {
                    key: header.key,
                    value: header.value,
                })
                .collect(),
        )
    }
}

impl std::ops::Deref for DeliveryHeaders {
    type Target = [Header];

    fn deref(&self) -> &[Header] {
        &self.0
    }
}

impl rdkafka::message::Headers for DeliveryHeaders {
    fn count(&self) -> usize {
        self.0.len()
    }

    fn try_get(&self, idx: usize) -> Option<rdkafka::message::Header<'_, &[u8]>> {
        self.0.get(idx).map(|header| rdkafka::message::Header {
            key: &header.key,
            value: header.value.as_deref(),
        })
    }
}

/// A delivery reads like the message of an rdkafka consumer, so handlers written against
/// `&impl rdkafka::Message` work unchanged.
impl rdkafka::Message for Delivery {
    type Headers = DeliveryHeaders;

    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// Always `None`: a delivery's value is shared with the buffer (and with its
    /// neighbours' values) and never changed in place. Copy it to change it
    /// (`payload.to_vec()`).
    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        None
    }

    fn topic(&self) -> &str {
        &self.topic
    }

    fn partition(&self) -> i32 {
        self.partition
    }

    fn offset(&self) -> i64 {
        self.offset
    }

    fn timestamp(&self) -> rdkafka::Timestamp {
        match self.timestamp {
            Timestamp::NotAvailable => rdkafka::Timestamp::NotAvailable,
            Timestamp::CreateTime(ms) => rdkafka::Timestamp::CreateTime(ms),
            Timestamp::LogAppendTime(ms) => rdkafka::Timestamp::LogAppendTime(ms),
        }
    }

    /// `None` when the record has no headers, as rdkafka does.
    fn headers(&self) -> Option<&DeliveryHeaders> {
        (!self.headers.0.is_empty()).then_some(&self.headers)
    }
}

impl Delivery {
    /// What acknowledging this record takes, without the record: a small `Copy` value for a
    /// pipeline that moves the payload on (into a task, a batch) and acknowledges later.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let delivery = consumer.recv().await?;
    /// let token = delivery.ack_token();
    /// let payload = delivery.payload; // moved away
    /// tokio::spawn(async move { drop(payload) }).await.ok();
    /// consumer.ack(token);
    /// # Ok(()) }
    /// ```
    pub fn ack_token(&self) -> AckToken {
        AckToken {
            generation: self.generation,
            partition: self.partition,
            offset: self.offset,
            lane: self.lane,
        }
    }

    /// The assignment of its partition this record was delivered under (a number that grows
    /// with every assignment of any partition to this consumer). Within one assignment a
    /// partition's records arrive in order (per lane in `Concurrent` mode); after a
    /// revocation — a lost one included — the next assignment may start again at the first
    /// record not yet committed, so records acknowledged but not committed come again.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let delivery = consumer.recv().await?;
    /// println!("{}/{} @{} (assignment {})", delivery.topic, delivery.partition,
    ///     delivery.offset, delivery.assignment());
    /// # Ok(()) }
    /// ```
    pub fn assignment(&self) -> u64 {
        self.generation
    }
}

/// What [`CatchupConsumer::ack`](crate::CatchupConsumer::ack) needs of a delivery
/// ([`Delivery::ack_token`]): its assignment, partition, offset and lane. `Copy`, so it
/// outlives the delivery it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckToken {
    pub(crate) generation: u64,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) lane: DeliveryLane,
}

impl AckToken {
    /// The record's offset.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let token = consumer.recv().await?.ack_token();
    /// println!("acknowledging {}@{} ({})", token.partition(), token.offset(), token.lane().as_str());
    /// consumer.ack(token);
    /// # Ok(()) }
    /// ```
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The record's partition (of the topic its delivery named).
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The lane the record came through.
    pub fn lane(&self) -> DeliveryLane {
        self.lane
    }
}

impl From<&Delivery> for AckToken {
    fn from(delivery: &Delivery) -> Self {
        delivery.ack_token()
    }
}

/// What happened, for applications that want to know. New events may come in minor
/// versions: match with a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Partitions were assigned to this member.
    Assigned {
        /// `(topic, partition)` pairs.
        partitions: Vec<(String, i32)>,
    },
    /// Partitions were revoked (or lost).
    Revoked {
        /// `(topic, partition)` pairs.
        partitions: Vec<(String, i32)>,
        /// Lost rather than revoked: nothing was committed for them.
        lost: bool,
    },
    /// A split began: catch-up `[from, boundary)`, live from `boundary`.
    SplitStarted {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Split epoch.
        epoch: u64,
        /// Catch-up start.
        from: i64,
        /// The boundary.
        boundary: i64,
    },
    /// An unfinished split resumed after a restart or a move.
    SplitResumed {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Split epoch.
        epoch: u64,
    },
    /// The catch-up fetcher has fetched the partition's backlog and left it.
    CatchupFetched {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// Every catch-up record of the partition was read from the buffer for delivery (the
    /// reader's queue holds the last of them).
    CatchupDrained {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// The live progress was merged into the group's offsets: the split is over.
    Merged {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The group's committed offset after the merge.
        offset: i64,
    },
    /// Retention removed `[from, to)` before it was processed.
    Truncated {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// First lost offset.
        from: i64,
        /// Processing continues here.
        to: i64,
    },
    /// Local records were discarded because they do not match Kafka (refetched instead).
    LocalDiscarded {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Why.
        reason: String,
    },
    /// Records the buffer already held were kept at assignment (after a revoke or a
    /// restart), so offsets `[from, to)` are delivered from disk instead of refetched.
    LocalReused {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The group's position: delivery resumes here.
        from: i64,
        /// Where fetching resumes: the end of what the buffer holds.
        to: i64,
    },
    /// A side entry or token was stale and ignored (processing restarts at the group's offset).
    StaleState {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// What was stale.
        what: String,
    },
    /// A fetcher paused one partition because its lane's bytes fetched and not yet
    /// acknowledged exceed its share of [`CatchupConfig::buffer_budget_bytes`], or resumed it
    /// below half of that share. The budget is divided evenly over the lanes being fetched.
    Backpressure {
        /// `"live"` or `"catch-up"`.
        fetcher: String,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Paused (true) or resumed (false).
        paused: bool,
        /// The partition's bytes in the fetcher's lane at that moment.
        buffered_bytes: u64,
        /// The share of the budget they were measured against.
        share: u64,
    },
    /// The buffer's filesystem fell below the free-space floor (`low`: both fetchers pause
    /// every partition and write nothing) or came back above it (`!low`: they resume).
    DiskSpace {
        /// The buffer directory.
        path: PathBuf,
        /// Below the floor (true) or back above it (false).
        low: bool,
        /// Free bytes measured.
        available_bytes: u64,
        /// The floor in bytes ([`CatchupConfig::disk_floor`]).
        floor_bytes: u64,
    },
    /// The buffer occupied more than twice what it stores plus
    /// [`CatchupConfig::disk_allowance_bytes`] and was
    /// compacted into a fresh database: the disk sled held is given back.
    BufferCompacted {
        /// The buffer directory.
        path: PathBuf,
        /// Bytes on disk before.
        disk_before: u64,
        /// Bytes on disk after.
        disk_after: u64,
        /// Bytes copied (everything stored).
        copied_bytes: u64,
        /// How long the compaction took (on its own thread).
        took: std::time::Duration,
        /// How long fetching and commits waited: the keys written during the copy, copied
        /// again, and the switch.
        writers_waited: std::time::Duration,
    },
    /// The brokers cannot be reached (said once, when it starts: the clients retry by
    /// themselves); `reason` names the broker and the failure.
    BrokersUnreachable {
        /// What librdkafka reported first.
        reason: String,
    },
    /// The brokers answer again after [`Event::BrokersUnreachable`].
    BrokersReachable,
    /// A background error; the consumer keeps going where it safely can.
    Error {
        /// The error.
        message: String,
    },
}

/// What is buffered for one lane of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneBuffer {
    /// Offsets the lane covers, as `[start, end)` ranges.
    pub ranges: Vec<OffsetRange>,
    /// Stored records.
    pub records: u64,
    /// Stored bytes.
    pub bytes: u64,
    /// First offset not yet processed.
    pub processed_next: i64,
    /// Where fetching resumes.
    pub fetched_next: i64,
    /// Offsets fetched but not yet processed.
    pub lag: i64,
}

/// What a health check asks of a consumer ([`CatchupConsumer::health`](crate::CatchupConsumer::health)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Whether the brokers answer, as the consumer's clients last reported it.
    pub brokers_reachable: bool,
    /// Why the consumer stopped for good, if it did: what `recv` returns (closed, a failed
    /// write to the buffer, a missing topic, refused credentials, a fetcher that died).
    pub stopped: Option<String>,
}

impl Health {
    /// Whether the consumer is working: the brokers answer and nothing stopped it.
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) {
    /// let status = if consumer.health().is_healthy() { 200 } else { 503 };
    /// # }
    /// ```
    pub fn is_healthy(&self) -> bool {
        self.brokers_reachable && self.stopped.is_none()
    }
}

/// What is buffered for one partition ([`CatchupConsumer::buffers`](crate::CatchupConsumer::buffers)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionBuffer {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Split epoch (0: not split).
    pub epoch: u64,
    /// The boundary while split.
    pub boundary: Option<i64>,
    /// The catch-up lane.
    pub catchup: LaneBuffer,
    /// The live lane.
    pub live: LaneBuffer,
}
