//! The live fetcher: the group member. Its rebalance context reconciles every assigned
//! partition (DESIGN §5) and assigns it at absolute offsets; its thread fetches the live lane
//! into the buffer and commits processed offsets — the only client that commits (invariant 4).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};

use super::side_log::SideLogWrite;
use super::{Budget, CatchupCommand, KafkaError, SideLog, to_record};
use crate::engine::telemetry;
use crate::engine::types::{Event, Mode};
use crate::engine::{PartitionId, PartitionRuntime, Shared, Stopped};
use crate::fetch::{
    AppendResult, FatalKind, PendingAppend, PollErrorKind, Standing, classify_poll_error,
    fatal_kind, standing,
};
use crate::plan::{
    CommitWrites, Committed, Inputs, LocalAction, MainLogCommit, OffsetReset, PlanEvent, SideValue,
    SideWrite, SplitSecret, SplitToken, UnownedAction, reconcile, unowned_action,
};
use crate::store::{Lane, PartitionState, Record, StoreError};

/// Timeout of one broker request made during a rebalance or a commit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long repositioning one partition of the live lane may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the reconciliation of a partition that failed is tried again.
const RECONCILE_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two reconciliation attempts that keep failing.
const RECONCILE_RETRY_MAX: Duration = Duration::from_secs(30);
/// How often the buffered records of partitions not assigned here are checked against the
/// group's commits (and after every assignment).
const PRUNE_EVERY: Duration = Duration::from_secs(10);
/// How long that check may wait for the committed offsets.
const PRUNE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most messages taken from one poll round before they are appended.
const POLL_BATCH: usize = 2000;
/// Commits brought forward by the amount processed come at most this often.
const MIN_COMMIT_SPACING: Duration = Duration::from_millis(100);

/// Requests to the live thread.
pub(crate) enum LiveCommand {
    /// A new subscription (its topics, its generation); a failure stops the consumer until
    /// the next one (`recv` says it).
    Subscribe(Vec<String>, u64),
    Commit(Reply<()>),
    /// Offsets between the group's committed offsets and the log ends of the assignment.
    Backlog(Reply<u64>),
    /// Commit, leave the group (revoking everything), stop.
    Close(Reply<()>),
    /// Stop without committing or cleaning up: what a crash would leave.
    Abandon,
}

/// Where the live thread answers a request: a tokio oneshot, so that the asking task awaits
/// it without holding a thread (sending from the live thread does not block).
pub(crate) type Reply<T> = tokio::sync::oneshot::Sender<Result<T, KafkaError>>;

/// What the rebalance callback needs.
pub(crate) struct LiveState {
    shared: Arc<Shared>,
    side_log: SideLog,
    catchup: Sender<CatchupCommand>,
    reset: OffsetReset,
    abandoned: AtomicBool,
    /// Assigned partitions whose reconciliation failed (committed offsets or the side log
    /// unreadable, a write refused): paused, with no runtime, retried from the live loop
    /// (findings F6, F13).
    unreconciled: Mutex<BTreeSet<PartitionId>>,
    /// Topics whose incarnation this process has checked: once while assigned is enough; a
    /// revoke forgets its topics (records kept meanwhile are checked when they return) and a
    /// restart checks again.
    incarnations_checked: Mutex<BTreeSet<String>>,
    /// Partitions revoked in this process whose records stayed in the buffer: when one comes
    /// back, its topic's incarnation is checked again before anything is reused.
    kept: Mutex<BTreeSet<PartitionId>>,
    /// A buffer compaction running on its own thread (its copy takes seconds on a large
    /// buffer; the live lane keeps polling meanwhile).
    compacting: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The subscription in force.
    subscribed: Mutex<Subscription>,
}

/// The subscription the group member holds.
#[derive(Default)]
struct Subscription {
    /// Its topics (or patterns).
    topics: Vec<String>,
    /// Which `subscribe` call made it (`Shared::subscribing`): what is reported of it is
    /// dropped once the application subscribed again.
    generation: u64,
    /// When a topic reported unknown was last looked up.
    last_check: Option<Instant>,
}

/// How often, and how long, the live thread asks for metadata while the brokers are
/// unreachable, to tell when they are back.
const PROBE_EVERY: Duration = Duration::from_secs(2);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a subscribed topic reported unknown is looked up in the cluster's metadata.
const TOPIC_CHECK_EVERY: Duration = Duration::from_secs(5);

/// How long the topic-id lookup may take: it is a check on top, and runs inside the rebalance.
const TOPIC_ID_TIMEOUT: Duration = Duration::from_secs(5);
/// How long reading one partition's watermarks may take while an assignment is reconciled:
/// a partition whose leader does not answer waits (paused, retried from the live loop)
/// instead of holding the rebalance callback, whose time counts against
/// `max.poll.interval.ms`.
const ASSIGN_WATERMARKS_TIMEOUT: Duration = Duration::from_secs(5);
/// An assignment's watermarks are read this many partitions at a time.
const WATERMARK_READERS: usize = 16;

/// The live consumer's context: overrides the rebalance to assign at absolute offsets.
pub(crate) struct LiveContext {
    state: Arc<LiveState>,
}

impl ClientContext for LiveContext {
    /// Tokens come from the application's hooks (see `ClientHooks::oauth_token`).
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        oauthbearer_config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.state
            .shared
            .health
            .oauth_token("live", oauthbearer_config)
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        self.state
            .shared
            .health
            .on_log("live", level, facility, message);
    }

    /// librdkafka's client-wide errors, through the consumer's broker health: brokers that
    /// cannot be reached are one WARN per change (the clients retry), an unknown subscribed
    /// topic is confirmed and reported through `recv` (see `on_fatal_error`).
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.state.shared.health.on_error("live", error, reason);
    }

    /// Statistics go to the application's hooks, and are not logged (see `RoleContext`).
    fn stats_raw(&self, statistics: &[u8]) {
        self.state.shared.health.on_statistics("live", statistics);
    }
}

impl ConsumerContext for LiveContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let deferred = self.state.on_assign(consumer, tpl);
                let assigned = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                // Not reconciled: nothing may be fetched for them until a retry succeeds.
                assigned.and_then(|()| match deferred.count() {
                    0 => Ok(()),
                    _ => consumer.pause(&deferred),
                })
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.state.on_revoke(consumer, tpl);
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                self.state.shared.emit(Event::Error {
                    message: format!("rebalance error: {other:?}"),
                });
                if cooperative {
                    Ok(())
                } else {
                    consumer.unassign()
                }
            }
        };
        if let Err(err) = result {
            self.state.shared.emit(Event::Error {
                message: format!("applying the assignment failed: {err}"),
            });
        }
    }

    fn pre_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {}
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<PartitionId> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl LiveState {
    /// Reconciles every assigned partition and sets its start offset in `tpl`; returns the
    /// partitions that could not be reconciled (to pause and retry).
    fn on_assign(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        tpl: &mut TopicPartitionList,
    ) -> TopicPartitionList {
        let partitions = partitions_of(tpl);
        tracing::info!(count = partitions.len(), "partitions assigned: reconciling");
        let held = self.shared.partitions().len();
        self.shared
            .assigning
            .store(held + partitions.len(), Ordering::Relaxed);
        let deferred = self.reconcile_all(consumer, &partitions, |topic, partition, start| {
            tpl.set_partition_offset(topic, partition, Offset::Offset(start))
        });
        tracing::info!(
            count = partitions.len(),
            deferred = deferred.len(),
            "partitions reconciled and assigned"
        );
        if let Some(hooks) = self.shared.health.hooks() {
            hooks.assigned(&partitions);
        }
        self.shared.emit(Event::Assigned { partitions });
        self.shared.assignments.fetch_add(1, Ordering::Relaxed);
        self.shared.notify.notify_waiters();
        let mut list = TopicPartitionList::new();
        for (topic, partition) in &deferred {
            list.add_partition(topic, *partition);
            // A valid start (never the group's offset, which may be missing, or a reset that
            // stops the partition): a partition that fetches is one a later seek can move.
            // It is paused, and nothing polled for it is used before it is repositioned.
            if let Err(err) = tpl.set_partition_offset(topic, *partition, Offset::End) {
                tracing::warn!(topic, partition, %err, "deferred partition keeps its start");
            }
        }
        self.unreconciled().extend(deferred);
        list
    }

    /// Takes `partitions` from the catch-up fetcher and waits (bounded) until it has stopped
    /// appending for them: their records are discarded or their layout retired next.
    fn stop_catchup(&self, partitions: &[PartitionId]) {
        let (done, stopped) = crossbeam_channel::bounded(1);
        let command = CatchupCommand::Remove {
            partitions: partitions.to_vec(),
            done,
        };
        if self.catchup.send(command).is_ok() {
            let _ = stopped.recv_timeout(REQUEST_TIMEOUT);
        }
    }

    fn kept(&self) -> MutexGuard<'_, BTreeSet<PartitionId>> {
        self.kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn compacting(&self) -> MutexGuard<'_, Option<std::thread::JoinHandle<()>>> {
        self.compacting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn subscribed(&self) -> MutexGuard<'_, Subscription> {
        self.subscribed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An error polling on does not get past: access refused stops the consumer at once;
    /// an unknown topic only once the cluster's metadata confirms that a subscribed topic
    /// does not exist (it may be created a moment later; looked up at most every 5 s).
    fn on_fatal_error(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        kind: FatalKind,
        message: String,
    ) {
        match kind {
            FatalKind::Refused => self.shared.stop_with(Stopped::Refused(message)),
            FatalKind::UnknownTopic => {
                let (topics, generation) = {
                    let mut subscribed = self.subscribed();
                    if subscribed
                        .last_check
                        .is_some_and(|at| at.elapsed() < TOPIC_CHECK_EVERY)
                    {
                        return;
                    }
                    subscribed.last_check = Some(Instant::now());
                    (subscribed.topics.clone(), subscribed.generation)
                };
                // A pattern (`^...`) matches whatever exists: nothing to confirm.
                for topic in topics.iter().filter(|t| !t.starts_with('^')) {
                    let Ok(metadata) = consumer.fetch_metadata(Some(topic), TOPIC_ID_TIMEOUT)
                    else {
                        continue; // the cluster cannot say now: the next error asks again
                    };
                    let missing = metadata.topics().iter().any(|t| {
                        t.name() == topic
                            && t.error()
                                == Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
                    });
                    if missing {
                        self.shared.stop_for_subscription(
                            generation,
                            Stopped::TopicMissing(topic.clone()),
                        );
                        return;
                    }
                }
            }
        }
    }

    fn unreconciled(&self) -> MutexGuard<'_, BTreeSet<PartitionId>> {
        self.unreconciled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reconciles `partitions` and hands each start offset to `start_at`; returns those that
    /// failed. Without the committed offsets nothing can be decided; without the side log
    /// only the partitions with a split token must wait (their side entry holds the live
    /// progress; treating it as missing would reprocess far more than needed).
    fn reconcile_all(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        partitions: &[PartitionId],
        mut start_at: impl FnMut(&str, i32, i64) -> rdkafka::error::KafkaResult<()>,
    ) -> Vec<PartitionId> {
        // An empty assignment (cooperative and KIP-848 rebalances hand out many) asks nothing:
        // with the consumer protocol, fetching the committed offsets of no partition while
        // the member leaves blocked the rebalance callback for the whole request timeout.
        if partitions.is_empty() {
            return Vec::new();
        }
        let mut list = TopicPartitionList::new();
        for (topic, partition) in partitions {
            list.add_partition(topic, *partition);
        }
        let committed = match consumer.committed_offsets(list, REQUEST_TIMEOUT) {
            Ok(committed) => committed,
            Err(err) => {
                self.shared.emit(Event::Error {
                    message: format!(
                        "reading committed offsets failed: {err}; the partitions wait paused and reconciliation is retried"
                    ),
                });
                return partitions.to_vec();
            }
        };
        self.check_incarnations(consumer, partitions);
        let side_entries = match self.side_log.read_all() {
            Ok(entries) => Some(entries),
            Err(err) => {
                self.shared.emit(Event::Error {
                    message: format!(
                        "{err}; split partitions wait paused and reconciliation is retried"
                    ),
                });
                None
            }
        };
        let mut failed = Vec::new();
        let watermarks = read_watermarks(consumer, partitions);
        for ((topic, partition), watermarks) in partitions.iter().zip(watermarks) {
            let split = committed
                .find_partition(topic, *partition)
                .is_some_and(|e| SplitToken::decode(e.metadata()).is_some());
            if side_entries.is_none() && split {
                failed.push((topic.clone(), *partition));
                continue;
            }
            let result = self
                .assign_one(
                    consumer,
                    &committed,
                    side_entries.as_ref(),
                    topic,
                    *partition,
                    watermarks,
                )
                .and_then(|start| {
                    start_at(topic, *partition, start).map_err(|err| {
                        KafkaError::client(&format!("setting the start offset {start}"), err).into()
                    })
                });
            if let Err(err) = result {
                if let AssignError::Store(store) = &err {
                    if store.is_io_failure() {
                        // The buffer cannot be written: retrying cannot help (see write_failed).
                        self.shared.write_failed(store);
                    }
                }
                self.shared.emit(Event::Error {
                    message: format!(
                        "assigning {topic}/{partition}: {err}; the partition waits paused and reconciliation is retried"
                    ),
                });
                self.shared
                    .partitions()
                    .remove(&(topic.clone(), *partition));
                failed.push((topic.clone(), *partition));
            }
        }
        failed
    }

    /// Tries the failed reconciliations again. A partition that succeeds gets its runtime,
    /// and its consumer is moved to the start (its cursor begins broken, so the live loop
    /// repositions it like any broken chain) and resumed.
    /// Returns whether nothing is left to retry.
    fn retry_unreconciled(&self, consumer: &BaseConsumer<LiveContext>) -> bool {
        let partitions: Vec<PartitionId> = std::mem::take(&mut *self.unreconciled())
            .into_iter()
            .collect();
        if partitions.is_empty() {
            return true;
        }
        let failed = self.reconcile_all(consumer, &partitions, |_, _, _| Ok(()));
        let reconciled: Vec<PartitionId> = partitions
            .iter()
            .filter(|key| !failed.contains(key))
            .cloned()
            .collect();
        {
            let mut runtimes = self.shared.partitions();
            for key in &reconciled {
                if let Some(runtime) = runtimes.get_mut(key) {
                    runtime.live_cursor.break_chain();
                }
            }
        }
        let done = failed.is_empty();
        self.unreconciled().extend(failed);
        if !reconciled.is_empty() {
            tracing::info!(count = reconciled.len(), "reconciled on retry");
            self.shared.notify.notify_waiters();
        }
        done
    }

    /// Starts a compaction of the buffer on its own thread, unless one is running; it
    /// compacts when sled holds far more disk than the buffer stores
    /// ([`Buffer::compact_if_bloated`](crate::store::Buffer::compact_if_bloated)). A
    /// failure changes nothing stored (the old generation stays): a WARN, and the next
    /// round tries again.
    fn compact_if_bloated(&self) {
        // After a failed write the buffer is untrusted and its handle must not be dropped:
        // the next process empties it anyway.
        if self.shared.failure().is_some() {
            return;
        }
        let mut compacting = self.compacting();
        if compacting
            .as_ref()
            .is_some_and(|running| !running.is_finished())
        {
            return;
        }
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("catchup-compact".into())
            .spawn(move || match shared.buffer.compact_if_bloated() {
                Ok(None) => {}
                Ok(Some(done)) => {
                    telemetry::compacted(&shared.group);
                    shared.emit(Event::BufferCompacted {
                        path: shared.buffer.dir().to_path_buf(),
                        disk_before: done.disk_before,
                        disk_after: done.disk_after,
                        copied_bytes: done.copied_bytes,
                        took: done.took,
                        writers_waited: done.writers_waited,
                    });
                }
                Err(err) => {
                    tracing::warn!(%err, "buffer compaction failed; the buffer is unchanged")
                }
            });
        match spawned {
            Ok(handle) => *compacting = Some(handle),
            Err(err) => tracing::warn!(%err, "cannot start a buffer compaction thread"),
        }
    }

    /// Waits for a running compaction (it holds the buffer, which closing needs alone).
    fn finish_compaction(&self) {
        let running = self.compacting().take();
        if let Some(running) = running {
            let _ = running.join();
        }
    }

    /// Discards the buffered records of partitions not assigned here (revoked, or held
    /// before a restart) that a reassignment could never reuse, by the group's commits
    /// ([`unowned_action`]). A failed lookup leaves them for the next round.
    fn prune_unowned(&self, consumer: &BaseConsumer<LiveContext>) {
        let Ok(buffered) = self.shared.buffer.partitions() else {
            return; // a damaged state: reconciliation reports it when the partition comes
        };
        let owned: BTreeSet<PartitionId> = {
            let mut owned: BTreeSet<PartitionId> =
                self.shared.partitions().keys().cloned().collect();
            owned.extend(self.unreconciled().iter().cloned());
            if let Ok(assignment) = consumer.assignment() {
                owned.extend(partitions_of(&assignment));
            }
            owned
        };
        let unowned: Vec<(String, i32, PartitionState)> = buffered
            .into_iter()
            .filter(|(topic, partition, _)| !owned.contains(&(topic.clone(), *partition)))
            .collect();
        if unowned.is_empty() {
            return;
        }
        let subscription = consumer.subscription().map(|list| partitions_of(&list));
        // No subscription yet (or unreadable): nothing tells what is still wanted.
        let Ok(subscription) = subscription else {
            return;
        };
        if subscription.is_empty() {
            return;
        }
        // A pattern subscription does not say which topics it covers: keep those.
        let patterns = subscription.iter().any(|(topic, _)| topic.starts_with('^'));
        let mut list = TopicPartitionList::new();
        for (topic, partition, _) in &unowned {
            list.add_partition(topic, *partition);
        }
        let Ok(committed) = consumer.committed_offsets(list, PRUNE_TIMEOUT) else {
            return;
        };
        for (topic, partition, local) in unowned {
            let main = committed.find_partition(&topic, partition).and_then(|e| {
                match (e.error(), e.offset()) {
                    (Ok(()), Offset::Offset(offset)) => Some(Committed {
                        offset,
                        metadata: e.metadata().to_owned(),
                    }),
                    _ => None,
                }
            });
            let subscribed = patterns || subscription.iter().any(|(t, _)| *t == topic);
            if let UnownedAction::Discard { reason } =
                unowned_action(&local, main.as_ref(), subscribed)
            {
                match self.shared.buffer.discard_partition(&topic, partition) {
                    Ok(_) => {
                        tracing::info!(
                            topic,
                            partition,
                            "{reason}: its buffered records are dropped"
                        );
                        self.shared.emit(Event::LocalDiscarded {
                            topic,
                            partition,
                            reason: format!("not assigned here, and {reason}"),
                        });
                    }
                    Err(err) => self.shared.emit(Event::Error {
                        message: err.to_string(),
                    }),
                }
            }
        }
    }

    /// Discards the records of partitions whose buffer failed verification on read (the
    /// reader took them off already) and queues them for reconciliation, paused: with no
    /// local records left, reconciliation refetches them from the group's committed offsets
    /// (and the side entry of a split), as after a crash with an empty buffer.
    fn refetch_damaged(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        damaged: &BTreeSet<PartitionId>,
    ) {
        // Only what is still ours: a revoke in between hands the partition to its new owner.
        let assigned: BTreeSet<PartitionId> = consumer
            .assignment()
            .map(|list| partitions_of(&list).into_iter().collect())
            .unwrap_or_default();
        let partitions: Vec<PartitionId> = damaged
            .iter()
            .filter(|key| assigned.contains(*key))
            .cloned()
            .collect();
        if partitions.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::new();
        for (topic, partition) in &partitions {
            list.add_partition(topic, *partition);
        }
        if let Err(err) = consumer.pause(&list) {
            tracing::warn!(%err, "pausing damaged partitions");
        }
        self.stop_catchup(&partitions);
        {
            let mut runtimes = self.shared.partitions();
            for key in &partitions {
                runtimes.remove(key);
            }
        }
        for (topic, partition) in &partitions {
            if let Err(err) = self.shared.buffer.discard_partition(topic, *partition) {
                if err.is_io_failure() {
                    self.shared.write_failed(&err);
                }
                self.shared.emit(Event::Error {
                    message: err.to_string(),
                });
            }
        }
        self.unreconciled().extend(partitions);
    }

    /// Drops the buffered records of every topic among `partitions` that was deleted and
    /// recreated since they were fetched (Kafka's topic id changed): the new topic's offsets
    /// restart with other data. Without topic ids (an old broker, a failed request) nothing
    /// buffered of the partitions being assigned is reused; a topic never recorded before is
    /// recorded.
    fn check_incarnations(&self, consumer: &BaseConsumer<LiveContext>, partitions: &[PartitionId]) {
        let returning: Vec<PartitionId> = {
            let mut kept = self.kept();
            partitions
                .iter()
                .filter(|key| kept.remove(*key))
                .cloned()
                .collect()
        };
        let topics: Vec<&str> = {
            let mut checked = self
                .incarnations_checked
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for (topic, _) in &returning {
                checked.remove(topic);
            }
            let topics: BTreeSet<&str> = partitions
                .iter()
                .map(|(topic, _)| topic.as_str())
                .filter(|topic| !checked.contains(*topic))
                .collect();
            topics.into_iter().collect()
        };
        if topics.is_empty() {
            return;
        }
        let ids = match super::topic_id::topic_ids(consumer.client(), &topics, TOPIC_ID_TIMEOUT) {
            Ok(ids) => ids,
            Err(err) => {
                tracing::debug!(%err, "topic ids unavailable; the incarnation check is skipped");
                Default::default()
            }
        };
        // Records of a topic whose incarnation cannot be told now — kept across a revoke in
        // this process, or left by an earlier process — may be of a topic deleted and
        // recreated meanwhile, the same offsets holding other data. Refetching costs only time.
        for (topic, partition) in crate::plan::incarnation_unknown(partitions, &topics, &ids) {
            match self.shared.buffer.discard_partition(topic, *partition) {
                Ok(false) => {}
                Ok(true) => self.shared.emit(Event::LocalDiscarded {
                    topic: topic.clone(),
                    partition: *partition,
                    reason: "the topic's id (its incarnation) cannot be read now, so nothing proves the buffered records are of the topic as it is".into(),
                }),
                Err(err) => self.shared.emit(Event::Error {
                    message: err.to_string(),
                }),
            }
        }
        for (topic, id) in ids {
            // Partitions of the topic running since an earlier assignment (whose lookup
            // failed) hold what this process fetched: discarding them under their runtimes
            // would stall them. Only the partitions being assigned now, and those not
            // assigned, are dropped.
            let running: BTreeSet<i32> = self
                .shared
                .partitions()
                .keys()
                .filter(|key| key.0 == topic && !partitions.contains(key))
                .map(|key| key.1)
                .collect();
            let keep = |partition| running.contains(&partition);
            match self.shared.buffer.record_incarnation(&topic, &id, keep) {
                Ok(None) => {
                    self.checked(topic);
                }
                Ok(Some(old)) => {
                    for (_, partition) in partitions.iter().filter(|(t, _)| *t == topic) {
                        self.shared.emit(Event::LocalDiscarded {
                            topic: topic.clone(),
                            partition: *partition,
                            reason: format!(
                                "topic {topic} was deleted and recreated (id {old}, now {id}): its buffered records belong to the old incarnation"
                            ),
                        });
                    }
                    self.checked(topic);
                }
                Err(err) => {
                    if err.is_io_failure() {
                        self.shared.write_failed(&err);
                    }
                    self.shared.emit(Event::Error {
                        message: err.to_string(),
                    });
                }
            }
        }
    }

    fn checked(&self, topic: String) {
        self.incarnations_checked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(topic);
    }

    /// Reconciles one partition, applies the decision and returns the live lane's start.
    /// `side_entries` is `None` when the side log could not be read: then a decision that
    /// writes to it must wait (it could not see an entry it would overwrite or trust).
    fn assign_one(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        committed: &TopicPartitionList,
        side_entries: Option<&super::side_log::SideEntries>,
        topic: &str,
        partition: i32,
        watermarks: rdkafka::error::KafkaResult<(i64, i64)>,
    ) -> Result<i64, AssignError> {
        let _span = tracing::info_span!("assign", topic, partition).entered();
        let shared = &self.shared;
        let element = committed.find_partition(topic, partition);
        if let Some(Err(err)) = element.as_ref().map(|e| e.error()) {
            // Not "never committed": an error reading it. Deciding as if there were no commit
            // would apply auto.offset.reset.
            return Err(KafkaError::client("reading the committed offset", err).into());
        }
        let main = element.and_then(|e| match e.offset() {
            Offset::Offset(offset) => Some(Committed {
                offset,
                metadata: e.metadata().to_owned(),
            }),
            _ => None,
        });
        let (low, high) = watermarks.map_err(|e| KafkaError::client("reading watermarks", e))?;
        let side_key = self.side_log.key(topic, partition);
        let side = side_entries
            .and_then(|e| e.get(&(topic.to_owned(), partition)))
            .map(|value| SideValue {
                key: &side_key,
                value,
            });
        // Drawn for every decision; used only when it starts a split.
        let fresh_secret = SplitSecret::random().map_err(|e| {
            KafkaError::Assignment(format!(
                "the operating system's random source failed ({e}); a split needs a secret"
            ))
        })?;
        let local = match shared.buffer.partition_state(topic, partition) {
            Ok(local) => local,
            Err(err) => {
                shared.emit(Event::LocalDiscarded {
                    topic: topic.into(),
                    partition,
                    reason: err.to_string(),
                });
                None
            }
        };
        let min_lag = (shared.config.mode != Mode::Off).then_some(shared.config.min_lag.max(1));
        let decision = reconcile(&Inputs {
            committed: main.as_ref(),
            side,
            low,
            high,
            min_lag,
            reset: self.reset,
            local: local.as_ref(),
            fresh_secret,
        });
        tracing::info!(topic, partition, ?decision, "reconciled");
        if side_entries.is_none() && !matches!(decision.side, SideWrite::Keep) {
            return Err(KafkaError::side(
                self.side_log.topic(),
                "unreadable, and this partition's decision writes to it".into(),
            )
            .into());
        }
        if let Some(commit) = &decision.main_log {
            commit_main(consumer, topic, partition, commit.offset, &commit.metadata)?;
        }
        match &decision.side {
            SideWrite::Keep => {}
            SideWrite::Write(entry) => {
                // Reconciliation writes an entry only with the token of the split it starts.
                let token = decision.token.ok_or_else(|| {
                    KafkaError::Assignment(format!(
                        "{topic}/{partition}: a side entry to write without a split token"
                    ))
                })?;
                self.side_log
                    .write(topic, partition, Some((entry, &token.secret)))?
            }
            SideWrite::Tombstone => self.side_log.write(topic, partition, None)?,
        }
        let reuse = match &decision.local {
            LocalAction::Reuse {
                catchup_committed,
                live_committed,
            } => {
                let buffer = &shared.buffer;
                let reused = buffer
                    .record_committed(Lane::Catchup, topic, partition, *catchup_committed)
                    .and_then(|_| {
                        buffer.record_committed(Lane::Live, topic, partition, *live_committed)
                    })
                    .map_err(|err| err.to_string());
                let range = decision
                    .local
                    .reused_range(&decision.layout, local.as_ref());
                if let (Ok(_), Some((from, to))) = (&reused, range) {
                    shared.emit(Event::LocalReused {
                        topic: topic.into(),
                        partition,
                        from,
                        to,
                    });
                }
                reused
            }
            LocalAction::Reset { reason } => Err(reason.clone().unwrap_or_default()),
        };
        if let Err(reason) = reuse {
            if !reason.is_empty() {
                shared.emit(Event::LocalDiscarded {
                    topic: topic.into(),
                    partition,
                    reason,
                });
            }
            shared
                .buffer
                .reset_partition(topic, partition, decision.layout.clone())?;
        }
        let state = shared
            .buffer
            .partition_state(topic, partition)?
            .ok_or_else(|| {
                KafkaError::Assignment(format!("{topic}/{partition} vanished from the buffer"))
            })?;
        let main_committed = decision.main_log.as_ref().map_or_else(
            || {
                main.as_ref()
                    .map_or(state.layout.live_from, |m| m.offset.max(low))
            },
            |commit| commit.offset,
        );
        let layout_id = shared.buffer.layout_id(topic, partition)?.ok_or_else(|| {
            KafkaError::Assignment(format!("{topic}/{partition} vanished from the buffer"))
        })?;
        let runtime = PartitionRuntime::new(
            shared.next_generation(),
            &state,
            layout_id,
            decision.token,
            decision.side_entry.clone(),
            main_committed,
        );
        shared
            .partitions()
            .insert((topic.to_owned(), partition), runtime);
        for event in &decision.events {
            shared.emit(plan_event(topic, partition, event));
        }
        if !state.catchup_fetched() {
            let command = CatchupCommand::Add {
                topic: topic.to_owned(),
                partition,
                layout: layout_id,
                position: state.catchup.fetched_next,
                ranges: state.layout.catchup_ranges.clone(),
            };
            self.catchup
                .send(command)
                .map_err(|_| KafkaError::Stopped("catch-up fetcher"))?;
        }
        Ok(state.live.fetched_next)
    }

    fn on_revoke(&self, consumer: &BaseConsumer<LiveContext>, tpl: &TopicPartitionList) {
        let partitions = partitions_of(tpl);
        let lost = consumer.assignment_lost();
        let _span = tracing::info_span!("revoke", count = partitions.len(), lost).entered();
        if self.abandoned.load(Ordering::Relaxed) {
            return; // a simulated crash: leave Kafka and the buffer as they are
        }
        if let Some(hooks) = self.shared.health.hooks() {
            hooks.revoking(&partitions, lost);
        }
        if !lost {
            // Errors are reported as events; what is not committed is reprocessed (safe).
            let _ = self.commit(consumer, Some(&partitions));
        }
        self.stop_catchup(&partitions);
        {
            let mut runtimes = self.shared.partitions();
            let mut unreconciled = self.unreconciled();
            for key in &partitions {
                runtimes.remove(key);
                unreconciled.remove(key);
            }
        }
        self.shared.revocations.fetch_add(1, Ordering::Relaxed);
        // The records stay: a reassignment reconciles them like a restart would, and the
        // pruning in the live loop drops them once the group's commit shows they can never
        // be reused. Writers still positioned for them are refused from here on.
        for (topic, partition) in &partitions {
            if let Err(err) = self.shared.buffer.retire_layout(topic, *partition) {
                self.shared.emit(Event::Error {
                    message: err.to_string(),
                });
            }
        }
        // While not ours the topic may be deleted and recreated: checked again on return.
        self.kept().extend(partitions.iter().cloned());
        // Not ours to refetch any more, should the reader have found it damaged meanwhile.
        self.shared.forget_damaged(&partitions);
        self.shared.emit(Event::Revoked { partitions, lost });
    }

    /// Offsets of the assignment that the group has not committed yet: from each partition's
    /// committed offset to its log end (a partition still waiting for reconciliation counts
    /// as one, its size being unknown).
    fn backlog(&self, consumer: &BaseConsumer<LiveContext>) -> Result<u64, KafkaError> {
        let committed: Vec<(PartitionId, i64)> = self
            .shared
            .partitions()
            .iter()
            .map(|(key, runtime)| (key.clone(), runtime.main_committed))
            .collect();
        let mut backlog = self.unreconciled().len() as u64;
        for ((topic, partition), main_committed) in committed {
            let (_, high) = consumer
                .fetch_watermarks(&topic, partition, REQUEST_TIMEOUT)
                .map_err(|e| {
                    KafkaError::client(&format!("reading the log end of {topic}/{partition}"), e)
                })?;
            backlog += (high - main_committed).max(0) as u64;
        }
        Ok(backlog)
    }

    /// Commits what is processed, for `only` or every partition. Errors are reported as
    /// events and retried at the next commit.
    /// One commit cycle (of every partition, or of `only`): the main-log writes of all
    /// partitions in one OffsetCommit, then the side-log writes of those whose main-log
    /// write succeeded (or had none) sent together, then what Kafka now holds recorded in
    /// the buffer. The first error is returned; every one is reported.
    fn commit(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        only: Option<&[PartitionId]>,
    ) -> Result<(), KafkaError> {
        if only.is_none() {
            // What was processed so far is covered now: the early-commit count restarts.
            self.shared.take_processed_since_commit();
        }
        let pending = self.shared.pending_commits(only);
        if pending.is_empty() {
            return Ok(());
        }
        let writes: Vec<CommitWrites> = pending
            .iter()
            .map(|pending| {
                tracing::debug!(partition = ?pending.partition, plan = ?pending.plan, "commit");
                pending.plan.writes(pending.token.as_ref())
            })
            .collect();
        let mains: Vec<(&PartitionId, &MainLogCommit)> = pending
            .iter()
            .zip(&writes)
            .filter_map(|(pending, writes)| Some((&pending.partition, writes.main.as_ref()?)))
            .collect();
        let main_result = commit_main_all(consumer, &mains);
        let main_ok = main_result.is_ok();
        let main_done = |writes: &CommitWrites| writes.main.is_none() || main_ok;
        let sides: Vec<(usize, SideLogWrite<'_>)> = pending
            .iter()
            .zip(&writes)
            .enumerate()
            .filter(|(_, (_, writes))| main_done(writes))
            .filter_map(|(index, (pending, writes))| {
                let (topic, partition) = (pending.partition.0.as_str(), pending.partition.1);
                let entry = match &writes.side {
                    SideWrite::Keep => return None,
                    SideWrite::Tombstone => None,
                    SideWrite::Write(entry) => Some((entry, &pending.token.as_ref()?.secret)),
                };
                Some((index, (topic, partition, entry)))
            })
            .collect();
        let side_entries: Vec<_> = sides.iter().map(|(_, entry)| *entry).collect();
        let mut side_results: Vec<(usize, Result<(), KafkaError>)> = sides
            .iter()
            .map(|(index, _)| *index)
            .zip(self.side_log.write_all(&side_entries))
            .collect();
        let mut first_error = None;
        if let Err(err) = main_result {
            self.shared.emit(Event::Error {
                message: err.to_string(),
            });
            first_error = Some(err);
        }
        for (index, (pending, writes)) in pending.iter().zip(&writes).enumerate() {
            let side_failed = match side_results.iter().position(|(at, _)| *at == index) {
                Some(at) => side_results.swap_remove(at).1.err(),
                None => None,
            };
            if let Some(err) = side_failed {
                self.shared.emit(Event::Error {
                    message: err.to_string(),
                });
                first_error.get_or_insert(err);
                continue;
            }
            if !main_done(writes) {
                continue;
            }
            if let Err(err) = self.shared.commit_applied(pending) {
                if err.is_io_failure() {
                    self.shared.write_failed(&err);
                }
                self.shared.emit(Event::Error {
                    message: err.to_string(),
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The watermarks of `partitions`, read concurrently, each within
/// [`ASSIGN_WATERMARKS_TIMEOUT`]: an assignment with offline partitions costs one timeout, not
/// one per partition.
fn read_watermarks(
    consumer: &BaseConsumer<LiveContext>,
    partitions: &[PartitionId],
) -> Vec<rdkafka::error::KafkaResult<(i64, i64)>> {
    let mut watermarks = Vec::with_capacity(partitions.len());
    for group in partitions.chunks(WATERMARK_READERS) {
        std::thread::scope(|scope| {
            let readers: Vec<_> = group
                .iter()
                .map(|(topic, partition)| {
                    scope.spawn(move || {
                        consumer.fetch_watermarks(topic, *partition, ASSIGN_WATERMARKS_TIMEOUT)
                    })
                })
                .collect();
            for reader in readers {
                // A reader that panicked reads nothing: the partition waits and is retried.
                watermarks.push(
                    reader
                        .join()
                        .unwrap_or(Err(rdkafka::error::KafkaError::Canceled)),
                );
            }
        });
    }
    watermarks
}

fn commit_main(
    consumer: &BaseConsumer<LiveContext>,
    topic: &str,
    partition: i32,
    offset: i64,
    metadata: &str,
) -> Result<(), KafkaError> {
    let key = (topic.to_owned(), partition);
    let commit = MainLogCommit {
        offset,
        metadata: metadata.to_owned(),
    };
    commit_main_all(consumer, &[(&key, &commit)])
}

/// Commits every partition's offset and metadata in one OffsetCommit request.
fn commit_main_all(
    consumer: &BaseConsumer<LiveContext>,
    commits: &[(&PartitionId, &MainLogCommit)],
) -> Result<(), KafkaError> {
    if commits.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), commit) in commits {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(commit.offset))
            .map_err(|e| KafkaError::client("building a commit", e))?;
        if let Some(mut element) = tpl.find_partition(topic, *partition) {
            element.set_metadata(&commit.metadata);
        }
    }
    let what = match commits {
        [((topic, partition), commit)] => {
            format!("committing {topic}/{partition} at {}", commit.offset)
        }
        _ => format!("committing {} partitions", commits.len()),
    };
    consumer
        .commit(&tpl, CommitMode::Sync)
        .map_err(|e| KafkaError::client(&what, e))
}

fn plan_event(topic: &str, partition: i32, event: &PlanEvent) -> Event {
    let topic = topic.to_owned();
    match *event {
        PlanEvent::Truncated { from, to } => Event::Truncated {
            topic,
            partition,
            from,
            to,
        },
        PlanEvent::SplitStarted {
            epoch,
            from,
            boundary,
        } => Event::SplitStarted {
            topic,
            partition,
            epoch,
            from,
            boundary,
        },
        PlanEvent::SplitResumed { epoch } => Event::SplitResumed {
            topic,
            partition,
            epoch,
        },
        PlanEvent::StaleSideEntry { ref reason } => {
            // Possibly a forgery, or another group's entry: worth an operator's attention.
            tracing::warn!(
                topic,
                partition,
                "{reason}; reprocessing from the committed offset"
            );
            Event::StaleState {
                topic,
                partition,
                what: reason.clone(),
            }
        }
        PlanEvent::StaleToken { ref what } => Event::StaleState {
            topic,
            partition,
            what: what.clone(),
        },
        PlanEvent::MergeFinished { offset } => Event::Merged {
            topic,
            partition,
            offset,
        },
    }
}

/// Why a partition's assignment could not be carried out: the brokers, or the buffer (a
/// failed write stops the consumer; anything else defers the partition).
#[derive(Debug, thiserror::Error)]
enum AssignError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The live fetcher thread and its consumer.
pub(crate) struct LiveFetcher;

impl LiveFetcher {
    /// Creates the group member and starts its thread.
    pub fn spawn(
        client: &ClientConfig,
        shared: Arc<Shared>,
        side_log: SideLog,
        catchup: Sender<CatchupCommand>,
    ) -> Result<(Sender<LiveCommand>, JoinHandle<()>), KafkaError> {
        let mut config = client.clone();
        // Commits are ours alone, and never of the log end (DESIGN §6).
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if config.get("partition.assignment.strategy").is_none()
            && config.get("group.protocol") != Some("consumer")
        {
            config.set("partition.assignment.strategy", "cooperative-sticky");
        }
        // Where a group without a commit starts is decided at assignment (reconciliation),
        // from the user's setting with librdkafka's default (the log end). Past that the
        // client must never jump by itself: a reset would skip records silently (F9), so an
        // out-of-range position is an error the fetcher handles, with an event.
        let reset = match config.get("auto.offset.reset") {
            Some("earliest") | Some("smallest") | Some("beginning") => OffsetReset::Earliest,
            _ => OffsetReset::Latest,
        };
        config.set("auto.offset.reset", "error");
        super::prefetch::apply(
            &mut config,
            &super::prefetch::member(shared.config.buffer_budget_bytes),
        );
        let state = Arc::new(LiveState {
            shared: shared.clone(),
            side_log,
            catchup,
            reset,
            abandoned: AtomicBool::new(false),
            unreconciled: Mutex::new(BTreeSet::new()),
            incarnations_checked: Mutex::new(BTreeSet::new()),
            kept: Mutex::new(BTreeSet::new()),
            compacting: Mutex::new(None),
            subscribed: Mutex::new(Subscription::default()),
        });
        let consumer: BaseConsumer<LiveContext> = config
            .create_with_context(LiveContext {
                state: state.clone(),
            })
            .map_err(|e| KafkaError::client("creating the group consumer", e))?;
        let (commands, receiver) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("catchup-live".into())
            .spawn(move || run(consumer, receiver, state))
            .map_err(|error| KafkaError::Spawn {
                thread: "live",
                error,
            })?;
        Ok((commands, thread))
    }
}

fn run(
    consumer: BaseConsumer<LiveContext>,
    commands: Receiver<LiveCommand>,
    state: Arc<LiveState>,
) {
    let shared = state.shared.clone();
    let _stop_on_panic = shared.stop_on_panic("live");
    let interval = shared.config.commit_interval;
    let mut last_commit = Instant::now();
    let mut last_commit_took = Duration::ZERO;
    let mut last_retry = Instant::now();
    let mut retry_every = RECONCILE_RETRY;
    let mut last_prune = Instant::now();
    let mut last_probe = Instant::now();
    let mut pruned_at_assignment = 0;
    let mut budget = Budget::new("live", Lane::Live, shared.config.buffer_budget_bytes);
    loop {
        while let Ok(command) = commands.try_recv() {
            match command {
                LiveCommand::Subscribe(topics, generation) => {
                    // (What was wrong with the last subscription was cleared by the caller.)
                    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                    match consumer.subscribe(&names) {
                        Ok(()) => {
                            *state.subscribed() = Subscription {
                                topics,
                                generation,
                                last_check: None,
                            };
                        }
                        // librdkafka keeps the previous subscription: so does `subscribed`.
                        Err(error) => shared.stop_for_subscription(
                            generation,
                            Stopped::Subscription(format!(
                                "subscribing to {}: {error}",
                                topics.join(", ")
                            )),
                        ),
                    }
                }
                LiveCommand::Commit(reply) => {
                    let _ = reply.send(state.commit(&consumer, None));
                }
                LiveCommand::Backlog(reply) => {
                    let _ = reply.send(state.backlog(&consumer));
                }
                LiveCommand::Close(reply) => {
                    state.finish_compaction();
                    let result = state.commit(&consumer, None);
                    consumer.unsubscribe();
                    // Serve the revocation this triggers before the consumer goes.
                    let deadline = Instant::now() + REQUEST_TIMEOUT;
                    while consumer.assignment().is_ok_and(|a| a.count() > 0)
                        && Instant::now() < deadline
                    {
                        let _ = consumer.poll(Duration::from_millis(50));
                    }
                    drop(consumer);
                    let _ = reply.send(result);
                    return;
                }
                LiveCommand::Abandon => {
                    state.finish_compaction();
                    state.abandoned.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
        if commit_due(
            last_commit.elapsed(),
            last_commit_took,
            interval,
            shared.processed_since_commit(),
            shared.config.buffer_budget_bytes,
        ) {
            let started = Instant::now();
            let _ = state.commit(&consumer, None);
            last_commit = Instant::now();
            last_commit_took = last_commit - started;
        }
        let assignments = shared.assignments.load(Ordering::Relaxed);
        if last_prune.elapsed() >= PRUNE_EVERY || assignments != pruned_at_assignment {
            state.prune_unowned(&consumer);
            state.compact_if_bloated();
            last_prune = Instant::now();
            pruned_at_assignment = assignments;
        }
        let damaged = shared.take_damaged();
        if !damaged.is_empty() {
            state.refetch_damaged(&consumer, &damaged);
            damaged.iter().for_each(|key| budget.forget(key));
        }
        // Damaged partitions are reconciled again at once, not after a backoff that other
        // partitions ran up.
        if !damaged.is_empty() || last_retry.elapsed() >= retry_every {
            // Each attempt asks the brokers (up to 30 s per request while they are down):
            // back off while it keeps failing so the live lane keeps fetching and committing.
            retry_every = if state.retry_unreconciled(&consumer) {
                RECONCILE_RETRY
            } else {
                (retry_every * 2).min(RECONCILE_RETRY_MAX)
            };
            last_retry = Instant::now();
        }
        // Unreachable brokers say nothing when they come back, nor refusing ones when they
        // accept the credentials again: ask, every 2 s meanwhile (a round trip: messages
        // polled may have been fetched before the brokers went away).
        if (shared.health.is_unreachable() || shared.health.is_refusing())
            && last_probe.elapsed() >= PROBE_EVERY
        {
            if consumer.fetch_metadata(None, PROBE_TIMEOUT).is_ok() {
                shared.health.reached();
                shared.health.accepted();
            }
            last_probe = Instant::now();
        }
        if let Some((kind, message)) = poll_into_buffer(&consumer, &shared, &budget) {
            state.on_fatal_error(&consumer, kind, message);
        }
        budget.apply(&shared, &consumer, |_| true);
    }
}

/// Whether to commit now: every `interval`, and sooner once an eighth of the byte budget was
/// processed since the last commit. The buffer deletes processed records only once their
/// commit is in Kafka, and sled keeps them in memory until then: at hundreds of MB/s a
/// one-second interval held over 400 MiB (1 KiB records). An early commit waits at least
/// [`MIN_COMMIT_SPACING`] and as long as the last one took (a commit asks the brokers once
/// per partition), so early commits take at most half of the live thread's time.
fn commit_due(
    since_last: Duration,
    last_took: Duration,
    interval: Duration,
    processed: u64,
    budget: u64,
) -> bool {
    let spacing = MIN_COMMIT_SPACING.max(last_took);
    since_last >= interval || (since_last >= spacing && processed > 0 && processed >= budget / 8)
}

/// One poll round of the live lane: up to `POLL_BATCH` messages fed to the partitions'
/// cursors, the appends they prove, and the repositioning of every partition whose chain of
/// proof broke (DESIGN invariant 8).
/// Returns an error of the round the consumer cannot get past by polling on.
fn poll_into_buffer(
    consumer: &BaseConsumer<LiveContext>,
    shared: &Shared,
    budget: &Budget,
) -> Option<(FatalKind, String)> {
    let round = poll_round(consumer, shared);
    let fatal = round.fatal.clone();
    // Positions move past offsets without records (transaction markers, compaction); each
    // cursor decides whether its generation's position can be trusted.
    let positions = consumer.position().ok();
    let appends: Vec<(PartitionId, PendingAppend)> = {
        let mut partitions = shared.partitions();
        for (key, records) in round.messages {
            // Not (or no longer) ours: a rebalance in this round took it away.
            if let Some(runtime) = partitions.get_mut(&key) {
                for record in records {
                    runtime.live_cursor.message(record);
                }
            }
        }
        for element in positions.iter().flat_map(|list| list.elements()) {
            let key = (element.topic().to_owned(), element.partition());
            if let (Offset::Offset(position), Some(runtime)) =
                (element.offset(), partitions.get_mut(&key))
            {
                runtime.live_cursor.position(position);
            }
        }
        partitions
            .iter_mut()
            .filter_map(|(key, runtime)| {
                if round.chain_broken {
                    runtime.live_cursor.break_chain();
                }
                runtime.live_cursor.take_append().map(|a| (key.clone(), a))
            })
            .collect()
    };
    let mut stored = false;
    for (key, append) in appends {
        let answer = append_live(shared, &key, &append);
        stored |= matches!(answer, AppendResult::Stored { .. });
        if let Some(runtime) = shared.partitions().get_mut(&key) {
            if runtime.live_cursor.layout() == append.layout {
                runtime.live_cursor.appended(answer);
            }
        }
    }
    if round.out_of_range {
        skip_truncated(consumer, shared);
    }
    reposition(consumer, shared, budget);
    if stored {
        shared
            .live_appends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.notify.notify_waiters();
    }
    fatal
}

/// What one round of `poll` brought.
#[derive(Default)]
struct LiveRound {
    /// Polled records in runs of one partition, in the order polled.
    messages: Vec<(PartitionId, Vec<Record>)>,
    /// An error that may have skipped messages ended the round.
    chain_broken: bool,
    /// That error was an out-of-range position.
    out_of_range: bool,
    /// That error is one polling on does not get past (an unknown topic, access refused).
    fatal: Option<(FatalKind, String)>,
}

impl LiveRound {
    /// Adds a polled message to the run of its partition (messages come in runs of one
    /// partition: one topic name per run, not per message).
    fn push(&mut self, message: &BorrowedMessage<'_>) {
        let record = to_record(message);
        match self.messages.last_mut() {
            Some(((topic, partition), run))
                if *partition == message.partition() && topic == message.topic() =>
            {
                run.push(record)
            }
            _ => self.messages.push((
                (message.topic().to_owned(), message.partition()),
                vec![record],
            )),
        }
    }
}

fn poll_round(consumer: &BaseConsumer<LiveContext>, shared: &Shared) -> LiveRound {
    let mut round = LiveRound::default();
    let mut timeout = Duration::from_millis(50);
    for _ in 0..POLL_BATCH {
        match consumer.poll(timeout) {
            None => break,
            Some(Ok(message)) => round.push(&message),
            // An error is not the end of what was polled (DESIGN §6): what came before it
            // stays in the round.
            Some(Err(err)) => match classify_poll_error(&err) {
                PollErrorKind::EndOfPartition => {}
                PollErrorKind::Transient => {
                    tracing::debug!(%err, "live fetch: transient client error");
                    break;
                }
                PollErrorKind::OutOfRange => {
                    tracing::warn!(%err, "live fetch: position out of range");
                    round.chain_broken = true;
                    round.out_of_range = true;
                    break;
                }
                PollErrorKind::BreaksChain => {
                    round.fatal = fatal_kind(&err).map(|kind| (kind, err.to_string()));
                    // The client does not say which partition: every chain ends here.
                    shared.emit(Event::Error {
                        message: format!(
                            "live fetch: {err}; refetching from the buffer's positions"
                        ),
                    });
                    round.chain_broken = true;
                    break;
                }
            },
        }
        timeout = Duration::ZERO;
    }
    round
}

/// Appends one partition's proven batch; `None` when the partition was re-laid out meanwhile
/// (its new runtime has a cursor of its own).
fn append_live(shared: &Shared, key: &PartitionId, append: &PendingAppend) -> AppendResult {
    if !shared.may_write() {
        // Below the free-space floor (or after a failed write): refetch later.
        return AppendResult::Failed;
    }
    let result = shared
        .buffer
        .append(Lane::Live, &key.0, key.1, append.as_fetched());
    match &result {
        Ok(outcome) => {
            telemetry::records_fetched(&shared.group, "live", outcome.stored as u64);
            shared.add_buffered(key, Lane::Live, outcome.stored_bytes);
        }
        Err(StoreError::StaleLayout { .. }) => {}
        Err(err) if err.is_io_failure() => shared.write_failed(err),
        Err(err) => shared.emit(Event::Error {
            message: format!("live append of {}/{}: {err}", key.0, key.1),
        }),
    }
    // Only a cursor naming this layout is told (see the callers): a stale one is stale
    // itself and must not wait for an answer forever.
    AppendResult::from_store(&result).unwrap_or(AppendResult::Failed)
}

/// Moves the consumer back to the buffer's position on every partition whose chain broke
/// and that is not held (its position lay past the log end). A seek that fails is retried
/// next round; until then that partition's records are dropped.
fn reposition(consumer: &BaseConsumer<LiveContext>, shared: &Shared, budget: &Budget) {
    let now = Instant::now();
    let targets: Vec<(PartitionId, i64)> = shared
        .partitions()
        .iter()
        .filter(|(_, runtime)| !runtime.live_hold.holds(now))
        .filter_map(|(key, runtime)| Some((key.clone(), runtime.live_cursor.reposition()?)))
        .collect();
    let cooperative = matches!(
        consumer.rebalance_protocol(),
        RebalanceProtocol::Cooperative
    );
    let mut refused = Vec::new();
    for (key, at) in targets {
        let moved = consumer
            .seek(&key.0, key.1, Offset::Offset(at), SEEK_TIMEOUT)
            .map_err(|err| err.to_string());
        let moved = match moved {
            Err(seek) if cooperative => reassign_at(consumer, &key, at)
                .map_err(|reassign| format!("seek: {seek}; reassign: {reassign}")),
            Err(seek) => {
                // Eager: only a new assignment of everything moves it (below).
                refused.push((key, at, seek));
                continue;
            }
            Ok(()) => Ok(()),
        };
        repositioned(shared, &key, at, moved);
    }
    if !refused.is_empty() {
        reassign_all(consumer, shared, budget, refused);
    }
}

/// Records the outcome of moving the live lane of `key` to `at`.
fn repositioned(shared: &Shared, key: &PartitionId, at: i64, moved: Result<(), String>) {
    let mut runtimes = shared.partitions();
    let Some(runtime) = runtimes.get_mut(key) else {
        return;
    };
    match moved {
        Ok(()) => {
            tracing::debug!(
                topic = key.0,
                partition = key.1,
                at,
                "live lane repositioned"
            );
            runtime.live_cursor.repositioned(at);
            runtime.reposition_failures = 0;
        }
        Err(err) => {
            // Retried every round; said on the first failure and every 100th after.
            if runtime.reposition_failures % 100 == 0 {
                shared.emit(Event::Error {
                    message: format!(
                        "live lane of {}/{}: moving back to {at} failed ({err}); retrying",
                        key.0, key.1
                    ),
                });
            }
            runtime.reposition_failures += 1;
        }
    }
}

/// A partition stopped by an out-of-range error cannot be sought (librdkafka refuses a seek
/// outside an active fetch): with an incremental protocol, unassign and assign it again at
/// `at`.
fn reassign_at(
    consumer: &BaseConsumer<LiveContext>,
    (topic, partition): &PartitionId,
    at: i64,
) -> Result<(), rdkafka::error::KafkaError> {
    let mut only = TopicPartitionList::new();
    only.add_partition(topic, *partition);
    consumer.incremental_unassign(&only)?;
    let mut at_offset = TopicPartitionList::new();
    at_offset.add_partition_offset(topic, *partition, Offset::Offset(at))?;
    consumer.incremental_assign(&at_offset)
}

/// Under an eager protocol a partition stopped by an out-of-range error is moved by assigning
/// the whole assignment again: librdkafka refuses the incremental forms outside a rebalance,
/// and a group that stays stable never rebalances. Every partition with a runtime restarts at
/// its buffer's position (its chain starts over: nothing polled before counts); one not
/// reconciled yet stays paused at the log end until it is. Pauses are those of the budget.
fn reassign_all(
    consumer: &BaseConsumer<LiveContext>,
    shared: &Shared,
    budget: &Budget,
    refused: Vec<(PartitionId, i64, String)>,
) {
    let assignment = consumer.assignment();
    let mut everything = TopicPartitionList::new();
    let (mut paused, mut resumed) = (TopicPartitionList::new(), TopicPartitionList::new());
    let mut starts = Vec::new();
    let listed = assignment
        .as_ref()
        .map_err(|err| err.to_string())
        .and_then(|assignment| {
            let runtimes = shared.partitions();
            for element in assignment.elements() {
                let key = (element.topic().to_owned(), element.partition());
                let (offset, pause) = match runtimes.get(&key) {
                    Some(runtime) => {
                        let at = runtime
                            .live_cursor
                            .reposition()
                            .unwrap_or(runtime.live_cursor.stored_next());
                        starts.push((key.clone(), at));
                        (Offset::Offset(at), budget.is_paused(&key))
                    }
                    None => (Offset::End, true),
                };
                everything
                    .add_partition_offset(&key.0, key.1, offset)
                    .map_err(|err| err.to_string())?;
                let list = if pause { &mut paused } else { &mut resumed };
                list.add_partition(&key.0, key.1);
            }
            Ok(())
        });
    let assigned =
        listed.and_then(|()| consumer.assign(&everything).map_err(|err| err.to_string()));
    match assigned {
        Ok(()) => {
            tracing::info!(
                partitions = everything.count(),
                "live lane: assigned the whole assignment again to move a partition stopped out of range (eager protocol)"
            );
            for (key, at) in starts {
                let mut runtimes = shared.partitions();
                if let Some(runtime) = runtimes.get_mut(&key) {
                    runtime.live_cursor.break_chain();
                    runtime.live_cursor.repositioned(at);
                    runtime.reposition_failures = 0;
                }
            }
            for (list, pause) in [(&paused, true), (&resumed, false)] {
                let result = if list.count() == 0 {
                    Ok(())
                } else if pause {
                    consumer.pause(list)
                } else {
                    consumer.resume(list)
                };
                if let Err(err) = result {
                    shared.emit(Event::Error {
                        message: format!(
                            "live lane: pausing or resuming after a new assignment: {err}"
                        ),
                    });
                }
            }
        }
        Err(err) => {
            for (key, at, seek) in refused {
                repositioned(
                    shared,
                    &key,
                    at,
                    Err(format!("seek: {seek}; assign: {err}")),
                );
            }
        }
    }
}

/// After an out-of-range error: where each broken partition's position stands in its log.
/// Retention passed it: report the truncation (DESIGN §5, last row) and record the deleted
/// offsets as covered — they no longer exist in the log — so the lane continues at the log
/// start. The log ends below it: hold the partition (1 s, doubling to 30 s) instead of
/// fetching there again every round. Inside the log: the error was another partition's.
fn skip_truncated(consumer: &BaseConsumer<LiveContext>, shared: &Shared) {
    let now = Instant::now();
    let broken: Vec<(PartitionId, i64)> = shared
        .partitions()
        .iter()
        .filter(|(_, runtime)| !runtime.live_hold.holds(now))
        .filter_map(|(key, runtime)| Some((key.clone(), runtime.live_cursor.reposition()?)))
        .collect();
    for (key, at) in broken {
        let (low, high) = match consumer.fetch_watermarks(&key.0, key.1, REQUEST_TIMEOUT) {
            Ok(watermarks) => watermarks,
            Err(err) => {
                shared.emit(Event::Error {
                    message: format!(
                        "live lane of {}/{}: reading watermarks: {err}",
                        key.0, key.1
                    ),
                });
                continue;
            }
        };
        let append = {
            let mut runtimes = shared.partitions();
            let Some(runtime) = runtimes.get_mut(&key) else {
                continue;
            };
            match standing(at, low, high) {
                Standing::BelowLogStart => {
                    runtime.live_hold.release();
                    runtime.live_cursor.log_starts_at(low)
                }
                Standing::PastLogEnd => {
                    let wait = runtime.live_hold.hold(Instant::now());
                    drop(runtimes);
                    shared.emit(Event::Error {
                        message: format!(
                            "live lane of {}/{}: position {at} is past the log end {high}; fetching there again in {} s",
                            key.0,
                            key.1,
                            wait.as_secs()
                        ),
                    });
                    continue;
                }
                Standing::InsideLog => {
                    runtime.live_hold.release();
                    None
                }
            }
        };
        let Some(append) = append else {
            continue;
        };
        shared.emit(Event::Truncated {
            topic: key.0.clone(),
            partition: key.1,
            from: append.continues_from,
            to: low,
        });
        let answer = append_live(shared, &key, &append);
        if let Some(runtime) = shared.partitions().get_mut(&key) {
            if runtime.live_cursor.layout() == append.layout {
                runtime.live_cursor.appended(answer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_come_every_interval_or_sooner_after_an_eighth_of_the_budget() {
        let ms = Duration::from_millis;
        let second = Duration::from_secs(1);
        let budget = 256 << 20;
        for (since_last, processed, due) in [
            (ms(999), 0, false),
            (ms(1000), 0, true),
            // 32 MiB processed: sooner, but not more often than every 100 ms.
            (ms(150), 32 << 20, true),
            (ms(50), 32 << 20, false),
            (ms(150), (32 << 20) - 1, false),
        ] {
            assert_eq!(
                commit_due(since_last, ms(5), second, processed, budget),
                due,
                "{since_last:?} after the last commit, {processed} bytes processed"
            );
        }
        // A commit that took 300 ms is followed by an early one 300 ms later at the soonest.
        assert!(!commit_due(ms(299), ms(300), second, 32 << 20, budget));
        assert!(commit_due(ms(300), ms(300), second, 32 << 20, budget));
        // A budget too small to divide commits every interval, not every 100 ms for nothing.
        assert!(!commit_due(ms(500), ms(1), second, 0, 7));
    }
}
