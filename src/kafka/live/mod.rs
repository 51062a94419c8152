//! The live fetcher: the group member. Its rebalance context reconciles every assigned
//! partition (`assign`) and assigns it at absolute offsets; its thread fetches the live lane
//! into the buffer (`poll`), commits processed offsets (`commit`) — the only client that
//! commits (invariant 4) — and keeps the buffer in order (`upkeep`).

mod assign;
mod commit;
mod committer;
mod poll;
mod queues;
mod upkeep;

use committer::{CommitThread, CycleEnded, Finish, InFlight};
use poll::poll_into_buffer;
use queues::MemberQueues;
use upkeep::give_back_freed_memory;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};

use super::side_log::SideLogWrite;
use super::wakeup::Wakeup;
use super::watermarks::read_watermarks;
use super::{
    Budget, CatchupCommand, KafkaError, Positions, Rebootstrap, SideLog, to_record, topic_bytes,
};
use crate::engine::telemetry;
use crate::engine::types::{Event, Mode};
use crate::engine::{PartitionId, PartitionRuntime, PendingCommit, Shared, Stopped, key_notes};
use crate::fetch::{
    AfterOutOfRange, AppendResult, Facts, FatalKind, PendingAppend, PollErrorKind, Round, Schedule,
    TrimWatch, classify_poll_error, fatal_kind,
};
use crate::plan::{
    CommitCycle, CommitWrites, Committed, Decision, Inputs, LocalStep, MainLogCommit, OffsetReset,
    PlanEvent, SideValue, SideWrite, SplitSecret, SplitToken, UnownedAction, reconcile,
    unowned_action,
};
use crate::store::{Lane, LayoutId, PartitionState, StoreError};

/// Timeout of one broker request made during a rebalance or a commit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long repositioning one partition of the live lane may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the check of records nobody here owns may wait for the committed offsets.
const PRUNE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most messages taken from one poll round before they are appended.
const POLL_BATCH: usize = 2000;
/// The longest a poll round waits for a first message (less when a timer is due sooner).
const EMPTY_WAIT: Duration = Duration::from_millis(50);
/// While a partition is held to its read-ahead: how long apart the group member takes one
/// message (and looks again whether its reader took enough).
const HELD_WAIT: Duration = Duration::from_millis(5);

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
    /// A simulated crash: revokes leave Kafka and the buffer as they are.
    abandoned: AtomicBool,
    /// The member is leaving the group (closing, or abandoned): assignments still delivered
    /// are not reconciled (see `rebalance`).
    leaving: AtomicBool,
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
    /// The scheduled commit cycle whose writes the commit thread sends (`committer`).
    in_flight: Mutex<Option<InFlight>>,
    /// The scheduled cycle that ended since the live thread last looked.
    cycle_ended: Mutex<Option<CycleEnded>>,
    /// The assigned partitions' own queues, taken in runs.
    queues: MemberQueues,
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

/// How long the live thread's metadata request may take while the brokers are unreachable
/// (asked every `fetch::schedule::PROBE_EVERY`, to tell when they are back).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a subscribed topic reported unknown is looked up in the cluster's metadata.
const TOPIC_CHECK_EVERY: Duration = Duration::from_secs(5);

/// How long the topic-id lookup may take: it is a check on top, and runs inside the rebalance.
const TOPIC_ID_TIMEOUT: Duration = Duration::from_secs(5);

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
        // The cycle under way is recorded before the assignment changes: it was planned
        // under the assignment it commits (a revoke's own commit follows).
        self.state.finish_cycle(Finish::Wait);
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS
                if self.state.leaving.load(Ordering::Relaxed) =>
            {
                // Nothing is fetched for the group any more, and reconciling would ask the
                // coordinator for committed offsets while the member leaves: under the
                // consumer protocol that request waits out its whole timeout, and a close or
                // a drop with it. Taken paused, without a runtime: nothing is committed for
                // them, and the revoke that follows finds nothing to do.
                let assigned = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                assigned.and_then(|()| consumer.pause(tpl))
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let deferred = self.state.on_assign(consumer, tpl);
                // Before their fetch starts (see `queues`).
                self.state.queues.split_assigned(consumer, tpl);
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
                let unassigned = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                self.state.queues.let_go(tpl);
                unassigned
            }
            other => {
                self.state.shared.emit(Event::Error {
                    message: format!("rebalance error: {other:?}"),
                });
                if cooperative {
                    Ok(())
                } else {
                    self.state.queues.let_go_all();
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

    fn unreconciled(&self) -> MutexGuard<'_, BTreeSet<PartitionId>> {
        self.unreconciled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
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
        // client must never jump by itself: a reset would skip records silently, so an
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
        let budget = Budget::new(
            "live",
            Lane::Live,
            shared.config.buffer_budget_bytes,
            super::prefetch::partition_fetch_bytes(&config),
        );
        // Messages, rebalances and errors arrive on the consumer queue, and the partitions'
        // messages on their own queues: the live thread waits for any of them, or for its
        // reader's word (`engine::FetcherWake`).
        let wakeup = Wakeup::default();
        let state = Arc::new(LiveState {
            shared: shared.clone(),
            side_log,
            catchup,
            reset,
            abandoned: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            unreconciled: Mutex::new(BTreeSet::new()),
            incarnations_checked: Mutex::new(BTreeSet::new()),
            kept: Mutex::new(BTreeSet::new()),
            compacting: Mutex::new(None),
            subscribed: Mutex::new(Subscription::default()),
            in_flight: Mutex::new(None),
            cycle_ended: Mutex::new(None),
            queues: MemberQueues::new(wakeup.clone()),
        });
        let rebootstrap = Rebootstrap::new(&config);
        let mut consumer: BaseConsumer<LiveContext> = config
            .create_with_context(LiveContext {
                state: state.clone(),
            })
            .map_err(|e| KafkaError::client("creating the group consumer", e))?;
        consumer.set_nonempty_callback(wakeup.callback());
        shared.live_wake.wake_with(wakeup.callback());
        let (commands, receiver) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("catchup-live".into())
            .spawn(move || run(consumer, receiver, state, rebootstrap, wakeup, budget))
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
    rebootstrap: Rebootstrap,
    wakeup: Wakeup,
    budget: Budget,
) {
    let shared = state.shared.clone();
    let _stop_on_panic = shared.stop_on_panic("live");
    // The partitions' queues go before the consumer, even when the thread panics.
    let queues_first = LetGoQueues(&state);
    // The commit thread borrows the consumer: the scope ends once it did, before the
    // consumer goes.
    let closed = std::thread::scope(|scope| {
        let commit_thread = CommitThread::start(scope, &consumer, &state);
        turns(
            &consumer,
            &commands,
            &state,
            rebootstrap,
            &wakeup,
            commit_thread,
            budget,
        )
    });
    drop(queues_first);
    drop(consumer);
    if let Some((reply, result)) = closed {
        let _ = reply.send(result);
    }
}

/// Lets go of the partitions' queues when dropped, and splits none after: librdkafka's
/// handles must not outlive the consumer.
struct LetGoQueues<'a>(&'a LiveState);

impl Drop for LetGoQueues<'_> {
    fn drop(&mut self) {
        self.0.queues.close();
    }
}

/// The live thread's turns until it is closed (the close's answer, sent once the consumer
/// is gone) or abandoned (`None`).
fn turns(
    consumer: &BaseConsumer<LiveContext>,
    commands: &Receiver<LiveCommand>,
    state: &LiveState,
    mut rebootstrap: Rebootstrap,
    wakeup: &Wakeup,
    commit_thread: Option<CommitThread<'_>>,
    mut budget: Budget,
) -> Option<(Reply<()>, Result<(), KafkaError>)> {
    let shared = &state.shared;
    let mut schedule = Schedule::new(
        Instant::now(),
        shared.config.commit_interval,
        shared.config.buffer_budget_bytes,
    );
    let mut positions = Positions::default();
    let mut trim_watch = TrimWatch::default();
    // Whether the last round polled nothing: the next waits for the queue (or the reader).
    let mut quiet = false;
    loop {
        rebootstrap.observe(
            consumer.client(),
            shared.health.is_unreachable(),
            Instant::now(),
            "live",
        );
        state.side_log.serve_reader();
        // While a lane is held to its read-ahead, the group member takes a message at a time
        // (`kafka::budget`), a little apart: the wait ends at a command. Decided once a turn,
        // by the last `Budget::apply`.
        let held = budget.holds_any();
        let waited = if held {
            match commands.recv_timeout(HELD_WAIT) {
                Ok(command) => Some(command),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(HELD_WAIT);
                    None
                }
            }
        } else {
            None
        };
        for command in waited
            .into_iter()
            .chain(std::iter::from_fn(|| commands.try_recv().ok()))
        {
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
                    let _ = reply.send(state.commit(consumer, None));
                }
                LiveCommand::Backlog(reply) => {
                    let _ = reply.send(state.backlog(consumer));
                }
                LiveCommand::Close(reply) => {
                    state.finish_compaction();
                    let result = state.commit(consumer, None);
                    state.leaving.store(true, Ordering::Relaxed);
                    consumer.unsubscribe();
                    // Serve the revocation this triggers before the consumer goes.
                    let deadline = Instant::now() + REQUEST_TIMEOUT;
                    while consumer.assignment().is_ok_and(|a| a.count() > 0)
                        && Instant::now() < deadline
                    {
                        let _ = consumer.poll(Duration::from_millis(50));
                    }
                    return Some((reply, result));
                }
                LiveCommand::Abandon => {
                    state.finish_compaction();
                    state.abandoned.store(true, Ordering::Relaxed);
                    state.leaving.store(true, Ordering::Relaxed);
                    return None;
                }
            }
        }
        state.finish_cycle(Finish::IfAnswered);
        let damaged = shared.take_damaged();
        let facts_now = facts(shared, !damaged.is_empty());
        let due = schedule.due(Instant::now(), facts_now);
        if due.trim {
            give_back_freed_memory(&mut trim_watch, shared.config.buffer_budget_bytes);
            schedule.trimmed(Instant::now());
        }
        if due.prune {
            state.prune_unowned(consumer);
            state.compact_if_bloated();
            schedule.pruned(Instant::now(), shared.assignments.load(Ordering::Relaxed));
        }
        if !damaged.is_empty() {
            state.refetch_damaged(consumer, &damaged);
            damaged.iter().for_each(|key| budget.forget(key));
        }
        if due.retry {
            let settled = state.retry_unreconciled(consumer);
            schedule.retried(Instant::now(), settled);
        }
        // After the maintenance that would wait for it (damage, retries): a cycle begun
        // before them would be waited for at once.
        if due.commit {
            let under_way = state.begin_cycle(
                consumer,
                commit_thread.as_ref(),
                Instant::now(),
                facts_now.reader_waits,
            );
            if under_way {
                schedule.commit_started();
            }
        }
        // A cycle that ended (here, or in a rebalance or a command that waited for it).
        if let Some((started, ended, reader_waited)) = state.take_cycle_ended() {
            schedule.committed(started, ended, reader_waited);
            state.report_progress(consumer);
        }
        // Unreachable brokers say nothing when they come back, nor refusing ones when they
        // accept the credentials again: ask (a round trip: messages polled may have been
        // fetched before the brokers went away).
        if due.probe {
            match consumer.fetch_metadata(None, PROBE_TIMEOUT) {
                Ok(_) => {
                    shared.health.reached();
                    shared.health.accepted();
                }
                Err(error) => shared.health.probe_failed(&error.to_string()),
            }
            schedule.probed(Instant::now());
        }
        // After a round that polled nothing, wait for the queue to receive something, no
        // longer than until the next timer — or until the reader brings a commit forward.
        // (The queue's callback fires only when it was empty: nothing may wait in it.)
        if quiet && !held && !state.queues.any_waiting() {
            let wait = schedule
                .until_due(Instant::now(), facts(shared, false))
                .min(EMPTY_WAIT);
            wakeup.wait_unless_queued(consumer, wait);
        }
        let round = poll_into_buffer(
            consumer,
            shared,
            &state.queues,
            &budget,
            held,
            &mut positions,
        );
        quiet = round.quiet;
        if let Some((kind, message)) = round.fatal {
            state.on_fatal_error(consumer, kind, message);
        }
        // Its read-ahead holds are its own (`poll_into_buffer`): none is a pause.
        budget.apply(shared, consumer, |_| true, |_| false);
    }
}

/// What the schedule needs to know this round; `damaged`: partitions were found damaged.
fn facts(shared: &Shared, damaged: bool) -> Facts {
    Facts {
        processed: shared.processed_since_commit(),
        assignments: shared.assignments.load(Ordering::Relaxed),
        damaged,
        troubled: shared.health.in_doubt() || shared.health.is_refusing(),
        reader_waits: shared.reader_waits_for_commits(),
    }
}
