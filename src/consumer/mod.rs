//! The public consumer: subscribe, receive deliveries from the buffer, acknowledge, commit.

mod lag;

pub use crate::plan::{SideStatus, TrueLag};
pub use lag::{PartitionLag, group_lag};

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use futures::StreamExt;
use rdkafka::ClientConfig;
use tokio::sync::Mutex as AsyncMutex;
use tokio::sync::broadcast;

pub use crate::engine::types::{
    AckToken, CatchupConfig, ClientHooks, Delivery, DeliveryHeaders, DeliveryLane, Event, Header,
    Health, LaneBuffer, Mode, PartitionBuffer, Timestamp,
};
pub use crate::fetch::DiskFloor;

use crate::Error;
use crate::engine::Shared;
use crate::kafka::{
    CatchupCommand, CatchupFetcher, KafkaError, LiveCommand, LiveFetcher, Reply, SideLog,
};
use crate::store::{Buffer, BufferOptions, Lane, StoreError};

/// How long a request to the live thread (commit, backlog, close) may take: a commit waits
/// on the brokers.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The least `close` waits for the threads after the live thread answered.
const CLOSE_JOIN_AT_LEAST: Duration = Duration::from_secs(10);

/// Records read from the buffer per refill of the delivery queue (split fairly over the
/// partitions, at least `engine::MIN_READ` each).
const READ_AHEAD: usize = 256;

/// In `Concurrent`, the fresh deliveries in a row after which the backlog gets the next one
/// (while it has records): the catch-up lane gets at least a quarter of the deliveries, so an
/// application slower than the live rate still works off its backlog and the split ends.
/// Fresh-first taken literally gave it 4 % (81 of 2,298) with fresh records at 500/s and the
/// application at 250/s: the backlog would never have merged.
const LIVE_STREAK: u32 = 3;

/// Deliveries read from the buffer and not yet handed out.
#[derive(Default)]
struct Reader {
    /// `Ordered`/`Off`: everything in `[0]`; `Concurrent`: catch-up in `[0]`, live in `[1]`.
    queues: [VecDeque<Delivery>; 2],
    live_appends_seen: u64,
    revocations_seen: u64,
    /// `Concurrent`: fresh deliveries since the backlog's last one.
    live_streak: u32,
}

impl Reader {
    /// Hands out the next delivery of queue `index`, keeping count of the fresh streak.
    fn pop(&mut self, index: usize) -> Option<Delivery> {
        let delivery = self.queues[index].pop_front()?;
        self.live_streak = match index {
            1 => self.live_streak.saturating_add(1),
            _ => 0,
        };
        Some(delivery)
    }
}

/// A Kafka consumer that does not fall behind after a crash (see the crate docs).
pub struct CatchupConsumer {
    shared: Arc<Shared>,
    live: Sender<LiveCommand>,
    catchup: Sender<CatchupCommand>,
    /// `Mode::Latest`: the key-rebuild thread (only told to shut down).
    rebuild: Option<Sender<CatchupCommand>>,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Held only while a record is taken, never across an await: concurrent `recv`s wait
    /// on the consumer's notification, not on each other (a tokio mutex cost every `recv`
    /// an acquire future and a lock of its waiters on release). See `lock_reader`.
    reader: std::sync::Mutex<Reader>,
    /// Set when a close begins: `recv` returns [`Error::Closed`] from then on.
    closed: std::sync::atomic::AtomicBool,
    /// Held by a close while it runs; `true` once one finished (later closes wait for a
    /// running one, then return; a drop abandons the threads unless one finished).
    close_done: AsyncMutex<bool>,
}

impl CatchupConsumer {
    /// [`new`](Self::new) on tokio's blocking threads: what to call from async code, where
    /// opening the buffer and checking the side topic must not hold up the runtime's workers.
    /// Dropped before it returns, it lets the opening finish in the background (the buffer
    /// directory is free again once it has).
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), catchup::Error> {
    /// let mut kafka = catchup::rdkafka::ClientConfig::new();
    /// kafka.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "orders-app");
    /// let consumer = catchup::CatchupConsumer::connect(&kafka, catchup::CatchupConfig::new("buffer")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(client: &ClientConfig, config: CatchupConfig) -> Result<Self, Error> {
        let client = client.clone();
        tokio::task::spawn_blocking(move || Self::new(&client, config))
            .await
            .map_err(|e| Error::Internal {
                doing: "opening the consumer".into(),
                reason: e.to_string(),
            })?
    }

    /// Creates the consumer from rdkafka settings (`bootstrap.servers` and `group.id` are
    /// required) and catchup's own. Opens (or creates) the buffer directory and checks (or
    /// creates) the side topic: it blocks on the disk and the brokers — about a minute when
    /// they do not answer — so async code calls [`connect`](Self::connect) instead.
    ///
    /// ```no_run
    /// # fn example() -> Result<(), catchup::Error> {
    /// let mut kafka = catchup::rdkafka::ClientConfig::new();
    /// kafka.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "orders-app");
    /// // Outside async code (a CLI, a test's setup): blocks while it opens.
    /// let consumer = catchup::CatchupConsumer::new(&kafka, catchup::CatchupConfig::new("buffer"))?;
    /// # Ok(()) }
    /// ```
    pub fn new(client: &ClientConfig, config: CatchupConfig) -> Result<Self, Error> {
        let group = client
            .get("group.id")
            .ok_or_else(|| Error::Config("the rdkafka configuration needs a group.id".into()))?
            .to_owned();
        if client.get("bootstrap.servers").is_none() {
            return Err(Error::Config(
                "the rdkafka configuration needs bootstrap.servers".into(),
            ));
        }
        let side_topic = config.side_topic_for(&group).map_err(Error::Config)?;
        crate::kafka::check_token_settings(client, config.hooks.is_some())
            .map_err(Error::Config)?;
        // A wrong setting is an error now, before anything touches the network (this client
        // may still start connecting before it is dropped: its errors go where all others do).
        crate::engine::telemetry::describe();
        let health = Arc::new(crate::kafka::BrokerHealth::new(
            &group,
            config.hooks.clone(),
        ));
        client
            .create_with_context::<_, rdkafka::consumer::BaseConsumer<crate::kafka::RoleContext>>(
                crate::kafka::RoleContext::new(health.clone(), "check"),
            )
            .map_err(|e| KafkaError::client("checking the rdkafka settings", e))?;
        if Buffer::empty_if_untrusted(&config.buffer_dir)? {
            tracing::warn!(
                path = %config.buffer_dir.display(),
                "the buffer was marked untrusted after a failed write: it starts empty, and its records are fetched again from Kafka"
            );
        }
        let options = BufferOptions {
            disk_allowance_bytes: config.disk_allowance_bytes,
            // A quarter of the budget serves the reader from memory (a commit every 32nd of
            // it keeps what is processed from outgrowing it); what waits beyond goes to sled.
            memory_bytes: config.buffer_budget_bytes / 4,
            ..BufferOptions::default()
        };
        let buffer = match Buffer::open(&config.buffer_dir, options.clone()) {
            // What a power loss or a damaged disk left, beyond sled's recovery: the buffer
            // is a cache of Kafka, so it starts empty rather than refusing to start.
            Err(StoreError::Damaged { reason, .. }) if Buffer::is_marked(&config.buffer_dir) => {
                tracing::warn!(
                    path = %config.buffer_dir.display(),
                    "the buffer cannot be recovered ({reason}): it starts empty, and its records are fetched again from Kafka"
                );
                Buffer::empty(&config.buffer_dir)?;
                Buffer::open(&config.buffer_dir, options)?
            }
            other => other?,
        };
        let buffer = Arc::new(buffer);
        let side_log = SideLog::open(client, &side_topic, &group, health.clone()).map_err(
            // Refused credentials are the cause to report, not the side topic they hid.
            |e| match health.refused() {
                Some(reason) => Error::Refused { reason },
                None => e.into(),
            },
        )?;
        let shared = Arc::new(Shared::new(buffer, config, group, health));
        shared.warn_if_room_short();
        let (catchup, catchup_thread) = CatchupFetcher::spawn(client, shared.clone())?;
        let (live, live_thread) =
            LiveFetcher::spawn(client, shared.clone(), side_log, catchup.clone())?;
        let mut threads = vec![live_thread, catchup_thread];
        let rebuild = match shared.config.mode {
            Mode::Latest => {
                let (rebuild, thread) = CatchupFetcher::spawn_rebuild(client, shared.clone())?;
                threads.push(thread);
                Some(rebuild)
            }
            _ => None,
        };
        Ok(Self {
            shared,
            live,
            catchup,
            rebuild,
            threads: std::sync::Mutex::new(threads),
            reader: std::sync::Mutex::new(Reader::default()),
            closed: std::sync::atomic::AtomicBool::new(false),
            close_done: AsyncMutex::new(false),
        })
    }

    /// Subscribes the group member to `topics` (names, or patterns starting with `^`),
    /// replacing any earlier subscription. Like rdkafka's `subscribe` it returns at once: the
    /// group member joins in the background. Malformed names are an error here; what the
    /// member's client refuses, and topics the cluster does not have, `recv` reports.
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// consumer.subscribe(&["orders", "^payments-.*"])?;
    /// # Ok(()) }
    /// ```
    pub fn subscribe(&self, topics: &[&str]) -> Result<(), Error> {
        crate::plan::check_subscription(topics).map_err(Error::Config)?;
        let topics = topics.iter().map(|t| (*t).to_owned()).collect();
        // What was wrong with the last subscription ends here, not when the live thread
        // gets to this one: a `recv` right after must not report it.
        let generation = self.shared.subscribing();
        self.live
            .send(LiveCommand::Subscribe(topics, generation))
            .map_err(|_| KafkaError::Stopped("live fetcher"))?;
        Ok(())
    }

    /// Sends a request to the live thread and awaits its answer (at most 120 s: a commit
    /// waits on the brokers).
    async fn request<T>(
        &self,
        what: &str,
        command: impl FnOnce(Reply<T>) -> LiveCommand,
    ) -> Result<T, Error> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.live
            .send(command(reply))
            .map_err(|_| KafkaError::Stopped("live fetcher"))?;
        match tokio::time::timeout(REQUEST_TIMEOUT, answer).await {
            Ok(Ok(result)) => Ok(result?),
            Ok(Err(_)) => Err(KafkaError::Stopped("live fetcher").into()),
            Err(_) => Err(Error::Timeout {
                what: what.to_owned(),
                after: REQUEST_TIMEOUT,
            }),
        }
    }

    /// The next record, in the order of the configured [`Mode`]. Waits until one is there.
    /// Cancel-safe: a `recv` dropped while waiting loses nothing.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let delivery = consumer.recv().await?;
    /// println!("{}/{} @{}", delivery.topic, delivery.partition, delivery.offset);
    /// consumer.ack(&delivery);
    /// # Ok(()) }
    /// ```
    pub async fn recv(&self) -> Result<Delivery, Error> {
        self.recv_past(None).await.map_err(|(error, _)| error)
    }

    /// [`recv`](Self::recv), except that an error of subscription `waived` (one a stream
    /// already yielded) is waited out — until the next `subscribe` — rather than returned
    /// again. An error comes with the subscription it may belong to: read before the error,
    /// so that a later subscription's error is never taken for a waived one.
    async fn recv_past(&self, waived: Option<u64>) -> Result<Delivery, (Error, u64)> {
        let look = || async {
            let mut reader = self.lock_reader().await;
            let subscription = self.shared.subscription();
            match self.next_ready(&mut reader) {
                Ok(ready) => Ok(ready),
                Err(error) if error.is_subscription_error() && waived == Some(subscription) => {
                    Ok(None)
                }
                Err(error) => Err((error, subscription)),
            }
        };
        loop {
            // Most calls find a record queued: no waiter is registered for them.
            if let Some(delivery) = look().await? {
                return Ok(delivery);
            }
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Registered before looking again: an append between the two looks wakes us.
            if let Some(delivery) = look().await? {
                return Ok(delivery);
            }
            // Appends, assignments and subscriptions wake us; the timeout covers a wake-up
            // that raced with the refill.
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Waits for the next delivery as [`recv`](Self::recv) does, then appends it and the
    /// deliveries ready after it, up to `limit` in all, to `deliveries`: a run taken under one
    /// lock (and, with [`CatchupConfig::auto_ack`], acknowledged in one go), as
    /// [`recv`](Self::recv) would have handed them out one by one (a `recv` of another task
    /// may take records between the first and the rest of the run). Returns how many it
    /// appended: at least one, or none for a `limit` of 0. An error met after the run's first
    /// delivery ends the run; the next call meets it again if it still holds. Cancel-safe:
    /// it waits only before the first delivery is taken.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let mut batch = Vec::with_capacity(512);
    /// consumer.recv_many(&mut batch, 512).await?;
    /// for delivery in &batch {
    ///     println!("{}/{} @{}", delivery.topic, delivery.partition, delivery.offset);
    /// }
    /// consumer.ack_many(&batch);
    /// # Ok(()) }
    /// ```
    pub async fn recv_many(
        &self,
        deliveries: &mut Vec<Delivery>,
        limit: usize,
    ) -> Result<usize, Error> {
        if limit == 0 {
            return Ok(0);
        }
        let first = self.recv_past(None).await.map_err(|(error, _)| error)?;
        let mut reader = self.lock_reader().await;
        let start = deliveries.len();
        deliveries.push(first);
        while deliveries.len() - start < limit {
            // An error ends the run, not kept: each comes from state the next call reads
            // again (closed, stopped, a read of the buffer), and a kept one could outlive it
            // (a new subscription, a close).
            match self.next_unacked(&mut reader) {
                Ok(Some(delivery)) => deliveries.push(delivery),
                Ok(None) | Err(_) => break,
            }
        }
        if self.shared.config.auto_ack {
            // The first was acknowledged when it was handed out.
            self.shared
                .queue_acks(deliveries[start + 1..].iter().map(Delivery::ack_token));
        }
        Ok(deliveries.len() - start)
    }

    /// The next record if one is ready now, without waiting: `None` also while another call
    /// is taking a record from this consumer at this very moment (it gets the next one).
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// while let Some(delivery) = consumer.try_recv()? {
    ///     consumer.ack(&delivery);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_recv(&self) -> Result<Option<Delivery>, Error> {
        match self.try_lock_reader() {
            Some(mut reader) => self.next_ready(&mut reader),
            None => Ok(None),
        }
    }

    /// The reader's queues and cursors, for taking a record (never held across an await).
    /// While another call holds them (taking a record can read sled), this task yields to
    /// the runtime rather than block its worker thread; cancelled there, it took nothing.
    async fn lock_reader(&self) -> std::sync::MutexGuard<'_, Reader> {
        loop {
            if let Some(reader) = self.try_lock_reader() {
                return reader;
            }
            tokio::task::yield_now().await;
        }
    }

    /// The reader's queues and cursors, unless another call holds them now.
    fn try_lock_reader(&self) -> Option<std::sync::MutexGuard<'_, Reader>> {
        match self.reader.try_lock() {
            Ok(reader) => Some(reader),
            // A panic while taking a record leaves nothing half-done that a later take
            // trusts: the queues hold whole records, the buffer is read from its cursors.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The next delivery, handed out: with [`CatchupConfig::auto_ack`] it counts as processed
    /// from here on — not before, so records still queued when a partition is revoked or the
    /// consumer closes are never committed.
    fn next_ready(&self, reader: &mut Reader) -> Result<Option<Delivery>, Error> {
        let delivery = self.next_unacked(reader)?;
        if self.shared.config.auto_ack {
            if let Some(delivery) = &delivery {
                self.shared.ack(delivery.ack_token());
            }
        }
        Ok(delivery)
    }

    /// [`next_ready`](Self::next_ready) without the acknowledgement `auto_ack` makes: the
    /// caller makes it before the delivery leaves the consumer.
    fn next_unacked(&self, reader: &mut Reader) -> Result<Option<Delivery>, Error> {
        // A failed buffer write stopped the fetchers: say so rather than wait for records
        // that will never come.
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        // Looked at when nothing read is queued (it takes three locks): what was read from
        // the buffer before the consumer stopped is handed out first, as valid as ever.
        if reader.queues.iter().all(VecDeque::is_empty) {
            if let Some(failure) = self.stop_reason() {
                return Err(failure);
            }
        }
        let delivery = loop {
            let Some(delivery) = self.next_queued(reader)? else {
                break None;
            };
            // `Latest`: a backlog record read into the queue before a newer record of its
            // key was handed out must not follow it (nor one whose partition was revoked
            // meanwhile: the check of revocations above may have raced with it).
            if self.shared.config.mode == Mode::Latest
                && delivery.lane == DeliveryLane::Catchup
                && self.shared.withheld_at_hand_out(&delivery)
            {
                continue;
            }
            break Some(delivery);
        };
        Ok(delivery)
    }

    fn next_queued(&self, reader: &mut Reader) -> Result<Option<Delivery>, Error> {
        let revocations = self
            .shared
            .revocations
            .load(std::sync::atomic::Ordering::Relaxed);
        if revocations != reader.revocations_seen {
            // Queued records of a revoked partition belong to its new owner now.
            reader.revocations_seen = revocations;
            let shared = &self.shared;
            reader
                .queues
                .iter_mut()
                .for_each(|queue| queue.retain(|d| shared.is_current(d)));
        }
        if self.shared.config.mode.fresh_first() {
            // The backlog's turn after `LIVE_STREAK` fresh deliveries, if it has records
            // (looked for only while some backlog is not handed out: a fill takes the lock
            // the live thread needs).
            if reader.live_streak >= LIVE_STREAK {
                if reader.queues[0].is_empty() && self.shared.backlog_pending() {
                    self.shared
                        .fill(&mut reader.queues, READ_AHEAD, &[Lane::Catchup])?;
                }
                if let Some(delivery) = reader.pop(0) {
                    return Ok(Some(delivery));
                }
                // Nothing there: fresh records until the next turn.
                reader.live_streak = 0;
            }
            // Fresh first: look for new live records before handing out queued backlog.
            let live_appends = self
                .shared
                .live_appends
                .load(std::sync::atomic::Ordering::Relaxed);
            if live_appends != reader.live_appends_seen && reader.queues[1].is_empty() {
                self.shared
                    .fill(&mut reader.queues, READ_AHEAD, &[Lane::Live])?;
                // A fill that held back for commits has the new live records still to read.
                if !reader.queues[1].is_empty() || !self.shared.reader_waits_for_commits() {
                    reader.live_appends_seen = live_appends;
                }
            }
            if let Some(delivery) = reader.pop(1) {
                return Ok(Some(delivery));
            }
        }
        if let Some(delivery) = reader.pop(0) {
            return Ok(Some(delivery));
        }
        self.shared
            .fill(&mut reader.queues, READ_AHEAD, &[Lane::Live, Lane::Catchup])?;
        Ok(reader.pop(1).or_else(|| reader.pop(0)))
    }

    /// The deliveries as a stream, as rdkafka's `MessageStream`: errors are items, and the
    /// stream goes on after those the consumer gets past ([`Error::is_recoverable`]). A
    /// missing topic or a refused subscription is yielded once; the stream then waits for
    /// the next [`subscribe`](Self::subscribe) (from another task, or a handler of the
    /// error) and goes on with it. An error that ends the consumer (closed, a failed buffer,
    /// refused access) is the stream's last item. It is `Unpin`, so `stream.next().await`
    /// works without pinning.
    ///
    /// ```no_run
    /// use futures::StreamExt;
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let mut deliveries = consumer.stream();
    /// while let Some(next) = deliveries.next().await {
    ///     match next {
    ///         Ok(delivery) => consumer.ack(&delivery),
    ///         Err(error) if error.is_recoverable() => eprintln!("{error}"),
    ///         Err(error) => return Err(error),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn stream(&self) -> futures::stream::BoxStream<'_, Result<Delivery, Error>> {
        /// Where the stream is: going on (with the subscription whose error it yielded,
        /// if any), or ended by an error the consumer cannot get past.
        enum State {
            Open { waived: Option<u64> },
            Ended,
        }
        futures::stream::unfold(
            (self, State::Open { waived: None }),
            |(consumer, state)| async move {
                let State::Open { waived } = state else {
                    return None;
                };
                let (next, state) = match consumer.recv_past(waived).await {
                    Ok(delivery) => (Ok(delivery), State::Open { waived }),
                    Err((error, subscription)) => {
                        let state = if error.is_subscription_error() {
                            State::Open {
                                waived: Some(subscription),
                            }
                        } else if error.is_recoverable() {
                            State::Open { waived }
                        } else {
                            State::Ended
                        };
                        (Err(error), state)
                    }
                };
                Some((next, (consumer, state)))
            },
        )
        .boxed()
    }

    /// Marks a delivery processed — given itself (`&delivery`) or its
    /// [`AckToken`] — : only acknowledged records count towards commits (at-least-once), in
    /// any order. An acknowledgement of a partition revoked since the delivery is ignored
    /// (the record belongs to the partition's new owner). With
    /// [`CatchupConfig::auto_ack`] every delivery is acknowledged when `recv` returns it.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let first = consumer.recv().await?;
    /// let second = consumer.recv().await?;
    /// consumer.ack(&second);
    /// consumer.ack(first.ack_token());
    /// # Ok(()) }
    /// ```
    pub fn ack(&self, delivery: impl Into<AckToken>) {
        self.shared.ack(delivery.into());
    }

    /// [`ack`](Self::ack) for each of `deliveries` (or their [`AckToken`]s), queued under one
    /// lock: for a batch, as [`recv_many`](Self::recv_many) hands them out.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let mut batch = Vec::new();
    /// consumer.recv_many(&mut batch, 100).await?;
    /// consumer.ack_many(&batch);
    /// # Ok(()) }
    /// ```
    pub fn ack_many<T: Into<AckToken>>(&self, deliveries: impl IntoIterator<Item = T>) {
        self.shared
            .queue_acks(deliveries.into_iter().map(Into::into));
    }

    /// Commits everything acknowledged so far (catch-up progress to the group, live progress
    /// to the side topic while split, merging when a catch-up lane is done).
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// let delivery = consumer.recv().await?;
    /// consumer.ack(&delivery);
    /// consumer.commit().await?; // without waiting for the commit interval
    /// # Ok(()) }
    /// ```
    pub async fn commit(&self) -> Result<(), Error> {
        self.request("committing", LiveCommand::Commit).await
    }

    /// Events: assignments, splits, merges, truncations, discarded buffers, errors.
    ///
    /// The channel keeps the last 4,096 events: a listener that falls further behind gets
    /// `RecvError::Lagged(missed)` once, then the events that are left — keep listening
    /// after it (only `Closed` ends the stream). Records are never held back by a slow
    /// listener.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// use tokio::sync::broadcast::error::RecvError;
    /// let mut events = consumer.events();
    /// tokio::spawn(async move {
    ///     loop {
    ///         match events.recv().await {
    ///             Ok(catchup::Event::Merged { topic, partition, offset, .. }) => {
    ///                 println!("{topic}/{partition} caught up at {offset}");
    ///             }
    ///             Ok(_) => {}
    ///             Err(RecvError::Lagged(missed)) => eprintln!("{missed} events missed"),
    ///             Err(RecvError::Closed) => break,
    ///         }
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.subscribe_events()
    }

    /// The consumer group.
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) {
    /// println!("consuming as group {}", consumer.group());
    /// # }
    /// ```
    pub fn group(&self) -> &str {
        &self.shared.group
    }

    /// Whether the group has assigned this member its partitions at least once (an empty
    /// assignment counts: the member was told it holds none). Until then there is nothing to
    /// consume yet — which is not the same as nothing left to consume.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) {
    /// while !consumer.has_assignment() {
    ///     tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    /// }
    /// # }
    /// ```
    pub fn has_assignment(&self) -> bool {
        self.shared
            .assignments
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    /// The partitions this member holds and delivers from, as `(topic, partition)`, sorted:
    /// those assigned and reconciled (a partition whose reconciliation failed waits paused
    /// for a retry, and is not among them until it succeeds).
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) {
    /// for (topic, partition) in consumer.assignment() {
    ///     println!("holding {topic}/{partition}");
    /// }
    /// # }
    /// ```
    pub fn assignment(&self) -> Vec<(String, i32)> {
        self.shared.partitions().keys().cloned().collect()
    }

    /// Offsets of the current assignment the group has not committed: from each partition's
    /// committed offset to its log end (asks the brokers for the log ends).
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// println!("{} offsets not committed yet", consumer.backlog().await?);
    /// # Ok(()) }
    /// ```
    pub async fn backlog(&self) -> Result<u64, Error> {
        self.request("reading the log ends", LiveCommand::Backlog)
            .await
    }

    /// Whether every assigned partition is merged and everything delivered is acknowledged
    /// and committed.
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// // Before a planned shutdown: let the splits merge and the commits land.
    /// while !consumer.settled() {
    ///     consumer.commit().await?;
    ///     tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn settled(&self) -> bool {
        self.shared.settled()
    }

    /// Delivered records not acknowledged yet.
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) {
    /// println!("{} records in flight", consumer.unacked());
    /// # }
    /// ```
    pub fn unacked(&self) -> usize {
        self.shared.unacked()
    }

    /// What is buffered per assigned partition and lane.
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// for buffer in consumer.buffers()? {
    ///     println!("{}/{}: {} catch-up records, {} live", buffer.topic, buffer.partition,
    ///         buffer.catchup.records, buffer.live.records);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn buffers(&self) -> Result<Vec<PartitionBuffer>, Error> {
        let stats = self.shared.buffer.stats()?;
        let assigned = self.shared.partitions();
        Ok(stats
            .partitions
            .into_iter()
            // Records kept for partitions not assigned here are not this consumer's to report.
            .filter(|p| assigned.contains_key(&(p.topic.clone(), p.partition)))
            .map(|p| {
                let lane = |index: usize| {
                    let stats = &p.lanes[index];
                    let cursors = p.state.lane(stats.lane);
                    let ranges = match stats.lane {
                        Lane::Catchup => crate::plan::clip_ranges(
                            &p.state.layout.catchup_ranges,
                            cursors.committed_next,
                        ),
                        Lane::Live => vec![crate::store::OffsetRange::new(
                            cursors.committed_next,
                            cursors.fetched_next,
                        )],
                    };
                    LaneBuffer {
                        ranges,
                        // On disk and in memory alike.
                        records: stats.records + stats.memory_records,
                        bytes: stats.bytes + stats.memory_bytes,
                        processed_next: cursors.committed_next,
                        fetched_next: cursors.fetched_next,
                        lag: cursors.fetched_next - cursors.committed_next,
                    }
                };
                PartitionBuffer {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    epoch: p.state.layout.epoch,
                    boundary: p.state.layout.boundary(),
                    catchup: lane(0),
                    live: lane(1),
                }
            })
            .collect())
    }

    /// Commits, leaves the group, stops the threads and lets go of the buffer directory (a
    /// new consumer can open it at once). Takes `&self`, so a consumer shared between tasks
    /// (`Arc`) can be closed from any of them; afterwards `recv` returns [`Error::Closed`],
    /// and closing again does nothing.
    ///
    /// Returns within about two minutes whatever the brokers do: a thread still waiting on
    /// them then is left behind with [`Error::Timeout`], and the buffer directory stays
    /// locked until the process ends (nothing is lost: the next start resumes from Kafka).
    ///
    /// ```no_run
    /// # async fn example(consumer: &catchup::CatchupConsumer) -> Result<(), catchup::Error> {
    /// tokio::signal::ctrl_c().await.ok();
    /// consumer.close().await?; // commits what was acknowledged and leaves the group
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) -> Result<(), Error> {
        let mut done = self.close_done.lock().await;
        if *done {
            return Ok(());
        }
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.shared.notify.notify_waiters();
        let started = std::time::Instant::now();
        let result = self.request("closing", LiveCommand::Close).await;
        let _ = self.catchup.send(CatchupCommand::Shutdown);
        self.stop_rebuild();
        let threads = std::mem::take(&mut *self.threads());
        // What is left of the two minutes, and never less than the threads need to leave
        // once their brokers answered.
        let deadline = self.join_deadline(false).unwrap_or(
            REQUEST_TIMEOUT
                .saturating_sub(started.elapsed())
                .max(CLOSE_JOIN_AT_LEAST),
        );
        let joined = tokio::task::spawn_blocking(move || join_within(threads, Some(deadline)))
            .await
            .unwrap_or(false);
        if !joined {
            *done = true;
            return result.and(Err(Error::Timeout {
                what: "stopping the consumer's threads".into(),
                after: deadline,
            }));
        }
        // The buffer directory is free for the next consumer now, even while this handle
        // lives on (an `Arc` elsewhere) — unless a write failed: that sled handle is never
        // let go of (its flush can block for good).
        // What the buffer holds in memory is written out for the next start, as far as the
        // free space above the floor allows (none below it) and not after a failed write:
        // the rest is fetched again from Kafka.
        if self.shared.may_write_at_close() {
            let buffer = self.shared.buffer.clone();
            let flushed =
                tokio::task::spawn_blocking(move || buffer.flush_memory_within_allowance()).await;
            match flushed {
                Ok(Err(err)) => {
                    tracing::warn!(
                        "writing the buffer's memory out at close failed ({err}); those records are fetched again from Kafka"
                    );
                    if err.is_io_failure() {
                        self.shared.write_failed(&err);
                    }
                }
                Ok(Ok(left)) if left > 0 => tracing::info!(
                    left_bytes = left,
                    "the buffer's filesystem is near its free-space floor: {left} bytes of records in memory are not written out at close, and are fetched again from Kafka"
                ),
                _ => {}
            }
        }
        let result = if self.shared.failure().is_none() {
            let buffer = self.shared.buffer.clone();
            let released = tokio::task::spawn_blocking(move || buffer.release())
                .await
                .map_err(|e| Error::Internal {
                    doing: "releasing the buffer".into(),
                    reason: e.to_string(),
                })?;
            result.and(released.map_err(Error::from))
        } else {
            result
        };
        *done = true;
        result
    }

    /// Whether the brokers answer, as the consumer's clients last reported it (`false` from
    /// an "all brokers are down" until a request gets through again; once a request has got
    /// through, a report counts when a probe fails, or after 5 s with no probe getting
    /// through, since it may be a client's late word): for health checks, next to
    /// [`Event::BrokersUnreachable`] and [`Event::BrokersReachable`].
    ///
    /// ```no_run
    /// # fn example(consumer: &catchup::CatchupConsumer) {
    /// if !consumer.brokers_reachable() {
    ///     eprintln!("the brokers do not answer");
    /// }
    /// # }
    /// ```
    pub fn brokers_reachable(&self) -> bool {
        !self.shared.health.is_unreachable()
    }

    /// What a health check (a `/healthz` endpoint, a liveness probe) needs: whether the
    /// brokers answer and whether something stopped the consumer for good.
    ///
    /// ```no_run
    /// # async fn check(consumer: &catchup::CatchupConsumer) {
    /// let health = consumer.health();
    /// if !health.is_healthy() {
    ///     eprintln!("unhealthy: {health:?}");
    /// }
    /// # }
    /// ```
    pub fn health(&self) -> Health {
        let stopped = if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            Some(Error::Closed)
        } else {
            self.stop_reason()
        };
        Health {
            brokers_reachable: self.brokers_reachable(),
            stopped: stopped.map(|error| error.to_string()),
        }
    }

    /// What stopped the consumer for good, as `recv` reports it: a failed write to the
    /// buffer first, else a condition on the Kafka side.
    fn stop_reason(&self) -> Option<Error> {
        self.shared
            .failure()
            .map(Error::from)
            .or_else(|| self.shared.stopped().map(Error::from))
    }
}

impl Drop for CatchupConsumer {
    /// Dropping without [`close`](Self::close) stops the threads without committing or
    /// cleaning up — what a crash leaves, except that the group member still leaves its
    /// group (rdkafka closes its consumer), so its partitions move on at once; the next
    /// start resumes from Kafka and the buffer. It waits for the threads (at most 30 s: the
    /// buffer directory must be free for the next consumer), on the dropping thread:
    /// [`close`](Self::close) first in async code.
    fn drop(&mut self) {
        // A close that finished stopped everything; one that was cancelled half-way did not.
        if self.close_done.try_lock().is_ok_and(|done| *done) {
            return;
        }
        let _ = self.live.send(LiveCommand::Abandon);
        let _ = self.catchup.send(CatchupCommand::Shutdown);
        self.stop_rebuild();
        let threads = std::mem::take(&mut *self.threads());
        let _ = join_within(threads, self.join_deadline(true));
    }
}

impl CatchupConsumer {
    fn stop_rebuild(&self) {
        if let Some(rebuild) = &self.rebuild {
            let _ = rebuild.send(CatchupCommand::Shutdown);
        }
    }

    fn threads(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.threads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How long closing or dropping waits for the threads. They hold the buffer, and a
    /// consumer opened next on the same directory needs it, so: `close` what is left of its
    /// two minutes (`None` here);
    /// a drop (a crash, or a panic unwinding) at most 30 s, since a thread may wait on a
    /// broker that is gone (librdkafka's synchronous commit has no timeout); and either at
    /// most 10 s once a buffer write failed, when a thread may be blocked for good in sled.
    fn join_deadline(&self, dropping: bool) -> Option<Duration> {
        if self.shared.failure().is_some() {
            Some(Duration::from_secs(10))
        } else {
            dropping.then_some(Duration::from_secs(30))
        }
    }
}

/// Joins `threads`, waiting at most `deadline` in all (`None`: until they end): a thread
/// blocked for good (in a wedged disk write, a broker that never answers) is left behind
/// rather than hanging its caller. Whether every thread ended.
fn join_within(threads: Vec<JoinHandle<()>>, deadline: Option<Duration>) -> bool {
    let Some(deadline) = deadline else {
        threads.into_iter().for_each(|thread| drop(thread.join()));
        return true;
    };
    let until = std::time::Instant::now() + deadline;
    let mut left = threads;
    while !left.is_empty() && std::time::Instant::now() < until {
        let (finished, running): (Vec<_>, Vec<_>) =
            left.into_iter().partition(JoinHandle::is_finished);
        finished.into_iter().for_each(|t| drop(t.join()));
        left = running;
        if !left.is_empty() {
            // Nothing to wait on but the threads' end; poll it.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let all_ended = left.is_empty();
    for thread in left {
        let name = thread.thread().name().unwrap_or("unnamed").to_owned();
        tracing::error!(
            thread = name,
            "a catchup thread did not stop within {} s; leaving it behind",
            deadline.as_secs()
        );
    }
    all_ended
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `close` has a real deadline: a thread that does not end in time is left behind and
    /// said to be, instead of holding the caller for as long as a broker keeps it.
    #[test]
    fn joining_gives_up_on_a_thread_at_the_deadline() {
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            let _ = blocked.recv();
        });
        let finished = std::thread::spawn(|| {});
        let started = std::time::Instant::now();
        assert!(!join_within(
            vec![stuck, finished],
            Some(Duration::from_millis(100))
        ));
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(release);

        let quick = std::thread::spawn(|| {});
        assert!(join_within(vec![quick], Some(Duration::from_secs(5))));
        assert!(join_within(Vec::new(), None));
    }
}
