//! The catch-up fetcher: one consumer outside the group (manual assignment, its own group id,
//! never commits) for every partition under catch-up. A partition leaves it when its position
//! reaches the end of its last range — position, not "saw offset B-1", because compaction and
//! transaction markers leave gaps. With nothing left, the consumer is closed.
//!
//! In `Mode::Latest` a second one reads the keys a split partition's application may have
//! seen before this assignment, into the partition's key index instead of the buffer
//! ([`rebuild`]): the same lanes, positions, holds and out-of-range judgement, another sink.

mod rebuild;

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::fetch_queues::FetchQueues;
use super::prefetch::CATCHUP_QUEUES;
use super::side_log::for_other_consumers;
use super::wakeup::Wakeup;
use super::watermarks::read_watermarks;
use super::{Budget, KafkaError, Positions, Rebootstrap, RoleContext, Taken, for_role, to_record};
use crate::engine::telemetry;
use crate::engine::types::Event;
use crate::engine::{PartitionId, Shared, Stopped, key_notes};
use crate::fetch::{
    AfterOutOfRange, AppendResult, FatalKind, Hold, LanePartition, PendingAppend, PollErrorKind,
    Polled, QueueOwner, QueueTake, Round, classify_poll_error, fatal_kind, next_run, queue_take,
    write_failure,
};
use crate::store::{Lane, LayoutId, OffsetRange};

/// Most entries taken in a round from a fetch queue of one partition. A queue several
/// partitions share is taken for what it holds when its turn comes (bounded by librdkafka's
/// limits, which apply to the queue as a whole): a held partition there is paused after the
/// round, and librdkafka drops what it prefetched of it; a resume fetches again from the
/// position, and the broker answers with the whole record batch around it. Taking 2,000
/// entries a round left most of each batch to be dropped: at 128 partitions, 100 B,
/// `ordered` moved 745–860 MiB over the loopback for a 250 MB topic (283–284 with a queue per
/// partition); taking what the queue held moved 313–318 MiB, and read in 1.68–1.87 s against
/// 2.40–2.62.
const POLL_BATCH: usize = 2000;
/// The longest a fetcher whose queues are all empty waits before it looks again.
const EMPTY_WAIT: Duration = Duration::from_millis(20);
/// The longest a fetcher that leaves a held partition's queue untaken (`Budget::holds`)
/// waits: the reader wakes it when it takes catch-up records, and this covers a word it
/// missed.
const HELD_WAIT: Duration = Duration::from_millis(5);
/// Most entries taken from a fetch queue in one call.
const MAX_RUN: usize = 256;

/// Requests to the catch-up thread.
pub(crate) enum CatchupCommand {
    /// Fetch the `ranges` of a partition, resuming at `position`.
    Add {
        topic: String,
        partition: i32,
        /// The layout the partition was laid out under; appends name it.
        layout: LayoutId,
        position: i64,
        ranges: Vec<OffsetRange>,
    },
    /// Stop fetching these partitions; `done` is signalled once nothing more is appended.
    Remove {
        partitions: Vec<PartitionId>,
        done: Sender<()>,
    },
    /// Stop the thread.
    Shutdown,
}

struct Tracked {
    /// The partition's catch-up lane: its chain of proof, ranges, holds.
    lane: LanePartition,
}

/// What a fetcher fetches for, and where its records go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The backlog, into the buffer's catch-up lanes; partitions come with `Add`.
    Catchup,
    /// `Mode::Latest`: the keys to read again, into the partitions' key indexes; the
    /// partitions are those whose index waits for it (`Shared::rebuilds_wanted`).
    Rebuild,
}

impl Role {
    /// The client id's suffix and the role's name in logs and metrics.
    fn client_role(self) -> &'static str {
        match self {
            Role::Catchup => "catchup",
            Role::Rebuild => "rebuild",
        }
    }

    /// How logs and errors name it.
    fn name(self) -> &'static str {
        match self {
            Role::Catchup => "catch-up",
            Role::Rebuild => "key rebuild",
        }
    }
}

/// The catch-up fetcher thread.
pub(crate) struct CatchupFetcher;

impl CatchupFetcher {
    /// Starts the thread; partitions arrive through the returned sender.
    pub fn spawn(
        client: &ClientConfig,
        shared: Arc<Shared>,
    ) -> Result<(Sender<CatchupCommand>, JoinHandle<()>), KafkaError> {
        Self::spawn_as(Role::Catchup, client, shared)
    }

    /// `Mode::Latest`: starts the key-rebuild thread (it finds its partitions by itself;
    /// the sender only stops it).
    pub fn spawn_rebuild(
        client: &ClientConfig,
        shared: Arc<Shared>,
    ) -> Result<(Sender<CatchupCommand>, JoinHandle<()>), KafkaError> {
        Self::spawn_as(Role::Rebuild, client, shared)
    }

    fn spawn_as(
        role: Role,
        client: &ClientConfig,
        shared: Arc<Shared>,
    ) -> Result<(Sender<CatchupCommand>, JoinHandle<()>), KafkaError> {
        let mut config = for_role(&for_other_consumers(client), role.client_role());
        config
            .set("group.id", format!("{}.catchup", shared.group))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "true");
        let budget = shared.config.buffer_budget_bytes;
        // The rebuild buffers nothing: no budget pauses it. The catch-up consumer's fetch is
        // sized as `ensure_consumer` creates it.
        let catchup_budget = (role == Role::Catchup).then(|| {
            let mut sized = config.clone();
            super::prefetch::apply(&mut sized, &super::prefetch::catchup(budget));
            let fetch_bytes = super::prefetch::partition_fetch_bytes(&sized);
            Budget::new("catch-up", Lane::Catchup, budget, fetch_bytes)
        });
        let (commands, receiver) = crossbeam_channel::unbounded();
        let wakeup = Wakeup::default();
        if role == Role::Catchup {
            shared.catchup_taken.wake_with(wakeup.callback());
        }
        let thread = std::thread::Builder::new()
            .name(format!("catchup-{}", role.client_role()))
            .spawn(move || {
                Fetcher {
                    rebootstrap: Rebootstrap::new(&config),
                    config,
                    shared,
                    queues: FetchQueues::new(CATCHUP_QUEUES),
                    consumer: None,
                    create_hold: Hold::default(),
                    tracked: HashMap::new(),
                    budget: catchup_budget,
                    role,
                    rebuilding: HashMap::new(),
                    wakeup,
                    positions: Positions::default(),
                }
                .run(receiver)
            })
            .map_err(|error| KafkaError::Spawn {
                thread: role.name(),
                error,
            })?;
        Ok((commands, thread))
    }
}

struct Fetcher {
    config: ClientConfig,
    shared: Arc<Shared>,
    /// The queues the consumer's partitions fetch into (`kafka::fetch_queues`). Declared
    /// before the consumer, so dropped before it.
    queues: FetchQueues,
    consumer: Option<Arc<BaseConsumer<RoleContext>>>,
    /// After a failed creation of the consumer: no attempt before it ends (1 s, doubling to
    /// 30 s while creation keeps failing). The partitions stay tracked meanwhile (a dropped
    /// `Add` is never sent again).
    create_hold: Hold,
    tracked: HashMap<PartitionId, Tracked>,
    budget: Option<Budget>,
    rebootstrap: Rebootstrap,
    role: Role,
    /// `Role::Rebuild`: per partition tracked, the assignment it reads for and the end of
    /// what it reads.
    rebuilding: HashMap<PartitionId, rebuild::Rebuilding>,
    /// Raised when one of the consumer's queues receives something.
    wakeup: Wakeup,
    /// Where the consumer's positions are read into.
    positions: Positions,
}

impl Fetcher {
    fn run(mut self, commands: Receiver<CatchupCommand>) {
        // Dropped before `self` (the consumer) on a panic: see `Shared::stop_on_panic`.
        let shared = self.shared.clone();
        let _stop_on_panic = shared.stop_on_panic(self.role.name());
        loop {
            if self.role == Role::Rebuild {
                self.follow_rebuilds();
            }
            let idle = if self.tracked.is_empty() {
                // None left: leave the brokers alone (the queues go first).
                self.queues.close();
                self.consumer = None;
                self.create_hold.release();
                // The catch-up fetcher is woken by its commands; the rebuild looks for work.
                Some(match self.role {
                    Role::Catchup => Duration::from_secs(1),
                    Role::Rebuild => rebuild::IDLE,
                })
            } else if self.consumer.is_none() {
                // Waiting to create the consumer again: only commands can change anything.
                Some(self.create_hold.remaining(Instant::now()))
            } else {
                None
            };
            let command = match idle {
                Some(wait) if !wait.is_zero() => match commands.recv_timeout(wait) {
                    Ok(command) => Some(command),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                _ => commands.try_recv().ok(),
            };
            if let Some(command) = command {
                match command {
                    CatchupCommand::Add {
                        topic,
                        partition,
                        layout,
                        position,
                        ranges,
                    } => self.add(
                        (topic, partition),
                        Tracked {
                            lane: LanePartition::catchup(layout, position, ranges),
                        },
                    ),
                    CatchupCommand::Remove { partitions, done } => {
                        for key in &partitions {
                            self.leave(key);
                        }
                        let _ = done.send(());
                    }
                    CatchupCommand::Shutdown => return,
                }
                continue; // drain all commands before fetching
            }
            if let Some(consumer) = &self.consumer {
                // Its own reports count for it: the group member's probe, which ends an
                // announced outage, does not speak for this client (`plan::ClientOutage`).
                self.rebootstrap.follow(
                    consumer,
                    self.shared.health.is_unreachable(),
                    self.tracked.keys().next().map(|(topic, _)| topic.as_str()),
                    self.role.client_role(),
                );
            }
            if !self.tracked.is_empty() {
                if let Err(message) = self.fetch() {
                    self.shared.emit(Event::Error { message });
                }
            }
        }
    }

    fn error(&self, message: String) {
        self.shared.emit(Event::Error { message });
    }

    fn add(&mut self, key: PartitionId, mut tracked: Tracked) {
        if tracked.lane.is_fetched() {
            return;
        }
        // What was tracked for the key goes first: its handle on the partition's queue,
        // dropped, would switch off the callback of the new one.
        self.leave(&key);
        // Without a consumer the partition waits, tracked, for the next attempt to create it.
        if self.ensure_consumer() {
            self.attach(&key, &mut tracked);
        }
        self.tracked.insert(key, tracked);
    }

    /// Routes a tracked partition to a fetch queue and assigns it at the buffer's position.
    fn attach(&mut self, key: &PartitionId, tracked: &mut Tracked) {
        self.route(key);
        let at = tracked.lane.cursor().stored_next();
        if let Err(err) = self.assign_at(key, at) {
            self.error(err);
            tracked.lane.break_chain(); // repositioned (assigned) next round
        }
    }

    /// Forwards `key`'s queue to a fetch queue: before it is assigned (its messages then never
    /// reach the consumer queue), and again after each assignment made to move it (which
    /// removed the forward).
    fn route(&mut self, key: &PartitionId) {
        if let Some(consumer) = &self.consumer {
            // SAFETY: the consumer is alive, and the queues go before it (`queues.close()`
            // before the consumer is let go; declared before it for a drop).
            unsafe {
                self.queues
                    .route(consumer.client().native_ptr(), key, &self.wakeup)
            };
        }
    }

    /// Creates the catch-up consumer unless it exists, or a failed creation is still backing
    /// off; a consumer created for partitions already tracked attaches them. Whether there is
    /// a consumer now.
    fn ensure_consumer(&mut self) -> bool {
        if self.consumer.is_some() {
            return true;
        }
        if self.create_hold.holds(Instant::now()) {
            return false;
        }
        let context = RoleContext::new(self.shared.health.clone(), self.role.client_role());
        let mut config = self.config.clone();
        let budget = self.shared.config.buffer_budget_bytes;
        super::prefetch::apply(&mut config, &super::prefetch::catchup(budget));
        if self.role == Role::Rebuild {
            // It keeps keys only; what it prefetches is not the budget's.
            config.set("queued.max.messages.kbytes", rebuild::QUEUE_KIB);
        }
        tracing::debug!(
            queue_kib = config.get("queued.max.messages.kbytes"),
            "creating the {} consumer",
            self.role.name()
        );
        match super::create_consumer(&config, context) {
            Ok(mut consumer) => {
                // Callbacks and errors arrive on the main queue.
                consumer.set_nonempty_callback(self.wakeup.callback());
                self.consumer = Some(Arc::new(consumer));
                self.queues = FetchQueues::new(CATCHUP_QUEUES);
                self.rebootstrap.new_client();
                self.create_hold.release();
            }
            Err(err) => {
                let wait = self.create_hold.hold(Instant::now());
                self.error(format!(
                    "creating the {} consumer: {err}; its partitions wait, retrying in {} s",
                    self.role.name(),
                    wait.as_secs()
                ));
                return false;
            }
        }
        let mut waiting = std::mem::take(&mut self.tracked);
        for (key, tracked) in &mut waiting {
            self.attach(key, tracked);
        }
        self.tracked = waiting;
        true
    }

    /// Assigns the partition at `position`.
    fn assign_at(&self, key: &PartitionId, position: i64) -> Result<(), String> {
        let (topic, partition) = key;
        let Some(consumer) = &self.consumer else {
            return Err(format!(
                "{} assign of {topic}/{partition}: no consumer",
                self.role.name()
            ));
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, *partition, Offset::Offset(position))
            .and_then(|_| consumer.incremental_assign(&tpl))
            .map_err(|err| {
                format!(
                    "{} assign of {topic}/{partition} at {position}: {err}",
                    self.role.name()
                )
            })?;
        // librdkafka keeps an application pause across unassign and assign: make the
        // partition's pause state the budget's, whatever it was before.
        let _ = if self
            .budget
            .as_ref()
            .is_some_and(|budget| budget.is_paused(key))
        {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        Ok(())
    }

    /// Stops fetching `key`, if it is tracked.
    fn leave(&mut self, key: &PartitionId) {
        if self.tracked.remove(key).is_some() {
            self.unassign(key);
            self.queues.let_go(key);
        }
    }

    fn unassign(&self, (topic, partition): &PartitionId) {
        let Some(consumer) = &self.consumer else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, *partition);
        if let Err(err) = consumer.incremental_unassign(&tpl) {
            self.error(format!(
                "{} unassign of {topic}/{partition}: {err}",
                self.role.name()
            ));
        }
    }

    /// One round: take every fetch queue, feed the cursors, read the positions, append
    /// what is proven, handle truncation, reposition broken chains, apply the budget.
    fn fetch(&mut self) -> Result<(), String> {
        if !self.ensure_consumer() {
            return Ok(());
        }
        let Some(consumer) = self.consumer.clone() else {
            return Ok(());
        };
        let mut polled = self.poll_round(&consumer);
        if polled.is_empty() {
            // Nothing anywhere: wait until a queue receives something, or a little, and poll
            // again. A queue's callback fires only when it was empty, and a round serves one
            // event of the main queue: with events still queued there (errors, callbacks that
            // yield nothing) there is no wait.
            let holding = self.budget.as_ref().is_some_and(Budget::holds_any);
            self.wakeup
                .wait_unless_queued(&consumer, if holding { HELD_WAIT } else { EMPTY_WAIT });
            polled = self.poll_round(&consumer);
        }
        polled.feed(
            self.tracked
                .iter_mut()
                .map(|(key, tracked)| (key.clone(), &mut tracked.lane)),
        );
        // Positions move past offsets without records (compaction, transaction markers);
        // each lane decides whether its generation's position can be trusted.
        let running = self.tracked.keys().cloned().collect();
        for (key, position) in self.positions.read(&consumer, running) {
            if let Some(tracked) = self.tracked.get_mut(&key) {
                tracked.lane.handle_position(position);
            }
        }
        let keys: Vec<PartitionId> = self.tracked.keys().cloned().collect();
        for key in &keys {
            self.append(key);
        }
        self.judge_out_of_range(&consumer, &keys);
        self.reposition();
        let (tracked, queues) = (&self.tracked, &self.queues);
        if let Some(budget) = &mut self.budget {
            budget.apply(
                &self.shared,
                &consumer,
                |key| tracked.contains_key(key),
                |key| queues.shares_queue(key),
            );
            self.shared.catchup_taken.set_holding(budget.holds_any());
        }
        Ok(())
    }

    /// Polls the main queue (callbacks, and the messages of a partition that fetches into no
    /// fetch queue) and every fetch queue, in runs of one partition. A queue of one partition
    /// is taken up to `POLL_BATCH` and what that partition may still read ahead, and not at
    /// all while the budget holds it: its records and events wait there, in order, for a
    /// later round, and librdkafka stops fetching once it is full. A queue several partitions
    /// share is taken for what it holds when its turn comes (a held one of them is paused:
    /// `Budget::apply`). An error ends a queue's turn, never the round: what was taken before
    /// it is kept.
    fn poll_round(&mut self, consumer: &BaseConsumer<RoleContext>) -> Round<PartitionId> {
        let mut polled = Round::new();
        self.poll_main(consumer, Duration::ZERO, &mut polled);
        self.queues.forward_again();
        for index in self.queues.turn() {
            let Some(queue) = self.queues.queue(index) else {
                continue;
            };
            // Up to the lane's read-ahead, not a fixed count past it (2,000 records of 1 KiB
            // ran 2 MB over it): a first message tells the size, each run after it is sized
            // to the room left.
            let owner = match (self.queues.sole_partition(index), &self.budget) {
                (Some(key), Some(budget)) => QueueOwner::Sole {
                    held: budget.holds(key),
                    room: budget.read_ahead_room(key),
                },
                (Some(_), None) => QueueOwner::Sole {
                    held: false,
                    room: u64::MAX,
                },
                (None, _) => QueueOwner::Shared,
            };
            let Some(QueueTake { most, mut room }) = queue_take(owner, queue.len(), POLL_BATCH)
            else {
                continue;
            };
            let (mut taken, mut bytes) = (0, 0u64);
            let mut stopped = false;
            while taken < most && room > 0 && !stopped {
                let run = next_run(room, taken, bytes, MAX_RUN);
                let count = queue.take(run.min(most - taken), |origin, taken| {
                    match (origin, taken) {
                        (Some(origin), Taken::Record(record)) => {
                            let size = record.payload_bytes() as u64;
                            room = room.saturating_sub(size);
                            bytes += size;
                            polled.push_record(record, |key| origin.is(key), || origin.key());
                            return;
                        }
                        // An end of partition or an error ends the queue's turn, after what
                        // its partition had before it.
                        (Some(origin), Taken::Error { error, at }) => {
                            let key = origin.key();
                            let kind = self.partition_error(Some(&key), &error, Some(at));
                            polled.push_error(Some(key), kind, Some(at));
                        }
                        // Whichever partition it was, what its lane takes next may not follow
                        // what it took before: every chain ends here.
                        (None, taken) => {
                            if let Taken::Error { error, .. } = taken {
                                let kind = self.partition_error(None, &error, None);
                                if let Some(event @ Polled::OutOfRange) =
                                    Polled::from_error(kind, None)
                                {
                                    polled.push(None, event);
                                }
                            }
                            polled.push(None, Polled::BreaksChain);
                        }
                    }
                    stopped = true;
                });
                if count == 0 {
                    break;
                }
                taken += count;
            }
        }
        polled
    }

    fn poll_main(
        &self,
        consumer: &BaseConsumer<RoleContext>,
        timeout: Duration,
        polled: &mut Round<PartitionId>,
    ) {
        match consumer.poll(timeout) {
            None => {}
            Some(Ok(message)) => polled.push(
                Some((message.topic().to_owned(), message.partition())),
                Polled::Messages(vec![to_record(&message)]),
            ),
            Some(Err(err)) => {
                // The main queue does not say which partition an error is about: every
                // chain that could be affected ends (an end of partition or a transient
                // error polled there moved nothing).
                let kind = self.partition_error(None, &err, None);
                polled.push_error(None, kind, None);
            }
        }
    }

    /// Appends what the partition's cursor proved, and follows the lane: out of the fetcher
    /// once every range is fetched.
    fn append(&mut self, key: &PartitionId) {
        let Some(append) = self
            .tracked
            .get_mut(key)
            .and_then(|tracked| tracked.lane.poll_append())
        else {
            return;
        };
        self.store(key, append);
    }

    /// Hands an append of the partition's cursor to the buffer and the answer back to the
    /// cursor. A writer whose layout is gone leaves: a newer Add (or a Remove) is on its way,
    /// and it must not touch the new layout.
    fn store(&mut self, key: &PartitionId, append: PendingAppend) {
        if self.role == Role::Rebuild {
            return self.note_keys(key, append);
        }
        if !self.shared.may_write() {
            // The disk is below its floor (or a write failed): refetch later from the
            // buffer's position; the budget keeps the partition paused meanwhile.
            self.appended(key, AppendResult::Failed);
            return;
        }
        let notes = self
            .shared
            .indexes_keys(key)
            .map(|generation| (generation, key_notes(&append.records)));
        let layout = append.layout;
        let result = self
            .shared
            .buffer
            .append_owned(Lane::Catchup, &key.0, key.1, append);
        if let Ok(outcome) = &result {
            if outcome.stored > 0 {
                telemetry::records_fetched(&self.shared.group, "catchup", outcome.stored as u64);
            }
            // Reported with no record too: an append that only moved the lane past a gap may
            // end the backlog, and the reader must look again.
            self.shared.add_buffered(
                key,
                Lane::Catchup,
                layout,
                outcome.fetched_next,
                outcome.stored_bytes,
            );
            if let Some((generation, notes)) = notes.filter(|_| outcome.stored > 0) {
                self.shared.note_keys(key, generation, notes);
            }
            self.shared.notify.notify_waiters();
        }
        match write_failure(&result) {
            Some(err) if err.is_io_failure() => self.shared.write_failed(err),
            Some(err) => self.error(format!("catch-up append of {}/{}: {err}", key.0, key.1)),
            None => {}
        }
        match AppendResult::from_store(&result) {
            Some(answer) => self.appended(key, answer),
            None => {
                tracing::debug!(
                    topic = key.0,
                    partition = key.1,
                    "stale catch-up writer dropped"
                );
                self.leave(key);
            }
        }
    }

    /// Tells the partition's lane how its append went; a partition whose every range is
    /// fetched leaves the fetcher.
    fn appended(&mut self, key: &PartitionId, answer: AppendResult) {
        let Some(tracked) = self.tracked.get_mut(key) else {
            return;
        };
        tracked.lane.handle_appended(answer);
        if !tracked.lane.is_fetched() {
            return;
        }
        if self.role == Role::Rebuild {
            self.stop_rebuilding(key);
        } else {
            tracing::info!(
                topic = key.0,
                partition = key.1,
                "catch-up lane fetched; partition leaves the catch-up consumer"
            );
            self.leave(key);
            self.shared.emit(Event::CatchupFetched {
                topic: key.0.clone(),
                partition: key.1,
            });
            self.shared.notify.notify_waiters();
        }
    }

    /// Moves the consumer to the buffer's position on every partition whose chain broke
    /// (after an error, a refused append, or a range that ended where the next does not
    /// start) and that is not held: a new assignment, so nothing polled before it counts.
    fn reposition(&mut self) {
        let now = Instant::now();
        let targets: Vec<(PartitionId, i64)> = self
            .tracked
            .iter()
            .filter_map(|(key, t)| Some((key.clone(), t.lane.poll_move(now)?)))
            .collect();
        for (key, at) in targets {
            self.unassign(&key);
            let moved = self.assign_at(&key, at);
            self.route(&key);
            let report = self
                .tracked
                .get_mut(&key)
                .and_then(|tracked| tracked.lane.handle_moved(at, moved));
            if let Some(reason) = report {
                self.error(format!("{reason}; retrying"));
            }
        }
    }

    /// After an out-of-range error, what each partition's position means once its watermarks
    /// are read (`LanePartition::handle_watermarks`): retention removed offsets the lane still
    /// needed — report it and continue at the log start; the log ends below the position —
    /// wait for it to grow back; inside the log — the error was another partition's.
    fn judge_out_of_range(&mut self, consumer: &BaseConsumer<RoleContext>, keys: &[PartitionId]) {
        let now = Instant::now();
        let waiting: Vec<PartitionId> = keys
            .iter()
            .filter(|key| {
                self.tracked
                    .get(*key)
                    .is_some_and(|tracked| tracked.lane.poll_watermarks(now))
            })
            .cloned()
            .collect();
        if waiting.is_empty() {
            return;
        }
        // Read concurrently, 5 s each: an error naming no partition ends every chain, and
        // one request after the other, with leaders down, held this thread (and the revokes
        // it answers) for as many timeouts as partitions.
        let watermarks = read_watermarks(consumer, &waiting);
        for (key, watermarks) in waiting.iter().zip(watermarks) {
            self.judge_watermarks(key, watermarks.map_err(|err| err.to_string()), now);
        }
    }

    /// What `key`'s position means given its `watermarks` (see `judge_out_of_range`).
    fn judge_watermarks(
        &mut self,
        key: &PartitionId,
        watermarks: Result<(i64, i64), String>,
        now: Instant,
    ) {
        let Some(tracked) = self.tracked.get_mut(key) else {
            return;
        };
        match tracked.lane.handle_watermarks(watermarks, now) {
            AfterOutOfRange::Truncated { from, to, append } => {
                if self.role == Role::Catchup {
                    self.shared.emit(Event::Truncated {
                        topic: key.0.clone(),
                        partition: key.1,
                        from,
                        to,
                    });
                } else {
                    // Nobody can be handed those records again, and older ones of their
                    // keys are deleted too — unless the buffer still holds them.
                    tracing::warn!(
                        topic = key.0,
                        partition = key.1,
                        from,
                        to,
                        "retention deleted records before their keys were read again"
                    );
                }
                self.store(key, append);
            }
            AfterOutOfRange::PastLogEnd { at, high, wait } => self.error(format!(
                "{} of {}/{}: position {at} is past the log end {high}; fetching there again in {} s",
                self.role.name(),
                key.0,
                key.1,
                wait.as_secs()
            )),
            AfterOutOfRange::Unknown { reason, wait } => self.error(format!(
                "{} watermarks of {}/{}: {reason}; trying again in {} s",
                self.role.name(),
                key.0,
                key.1,
                wait.as_secs()
            )),
            AfterOutOfRange::InsideLog => {}
        }
    }

    /// Classifies an error polled for `key` (`None`: the main queue, which names no
    /// partition), `named`: the offset it names, taken in a run, and reports a chain it
    /// breaks (what it means for the lanes: `Round::push_error`).
    fn partition_error(
        &self,
        key: Option<&PartitionId>,
        err: &RdError,
        named: Option<i64>,
    ) -> PollErrorKind {
        let kind = classify_poll_error(err);
        match kind {
            PollErrorKind::EndOfPartition | PollErrorKind::OutOfRange => {}
            PollErrorKind::Transient => {
                if named.is_some() {
                    tracing::debug!(role = self.role.name(), ?key, %err, "a transient error taken in a run; refetching from where the lane got");
                }
            }
            PollErrorKind::BreaksChain => {
                let which = key.map_or_else(
                    || "every partition".to_owned(),
                    |(topic, partition)| format!("{topic}/{partition}"),
                );
                // Refetching would meet the same batch again, for ever (the group member's
                // errors are judged on the live thread).
                if fatal_kind(err) == Some(FatalKind::Undecodable) {
                    self.shared.stop_with(Stopped::Undecodable(format!(
                        "{} fetch of {which}: {err}",
                        self.role.name()
                    )));
                }
                self.error(format!(
                    "{} fetch of {which}: {err}; refetching from where it got",
                    self.role.name()
                ));
            }
        }
        kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::types::CatchupConfig;
    use crate::kafka::BrokerHealth;
    use crate::store::{Buffer, BufferOptions};

    /// A catch-up consumer that cannot be created keeps its partitions tracked and is created
    /// again later: an `Add` is sent once, and a dropped one would stall the partition for
    /// good (`Ordered` never delivers it, no mode merges it).
    #[test]
    fn partitions_wait_for_a_consumer_that_could_not_be_created() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let buffer =
            Buffer::open(dir.path().join("buf"), BufferOptions::default()).expect("buffer");
        let shared = Arc::new(Shared::new(
            Arc::new(buffer),
            CatchupConfig::new(dir.path()),
            "group".into(),
            Arc::new(BrokerHealth::new("group", None)),
        ));
        let mut events = shared.subscribe_events();
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "group.catchup")
            // librdkafka refuses it: creation fails, as with a rotated certificate file.
            .set("session.timeout.ms", "not a number");
        let mut fetcher = Fetcher {
            rebootstrap: Rebootstrap::new(&config),
            config,
            shared,
            queues: FetchQueues::new(CATCHUP_QUEUES),
            consumer: None,
            create_hold: Hold::default(),
            tracked: HashMap::new(),
            budget: Some(Budget::new("catch-up", Lane::Catchup, 1 << 20, 1 << 20)),
            role: Role::Catchup,
            rebuilding: HashMap::new(),
            wakeup: Wakeup::default(),
            positions: Positions::default(),
        };
        let key: PartitionId = ("orders".into(), 3);
        fetcher.add(
            key.clone(),
            Tracked {
                lane: LanePartition::catchup(
                    LayoutId(1),
                    70,
                    vec![OffsetRange {
                        start: 70,
                        end: 120,
                    }],
                ),
            },
        );
        assert!(fetcher.consumer.is_none());
        assert!(
            fetcher.tracked.contains_key(&key),
            "the partition waits for the consumer"
        );
        let reported = std::iter::from_fn(|| events.try_recv().ok()).any(|event| {
            matches!(event, Event::Error { message } if message.contains("creating the catch-up consumer"))
        });
        assert!(reported, "the failure is reported");
        // Backing off: a round does not try again before its time.
        assert!(fetcher.fetch().is_ok());
        assert!(fetcher.consumer.is_none());

        // The settings work again and the next attempt is due.
        fetcher.config.set("session.timeout.ms", "45000");
        fetcher.create_hold.release();
        assert!(fetcher.fetch().is_ok());
        let consumer = fetcher.consumer.clone().expect("created on the retry");
        let assignment = consumer.assignment().expect("assignment");
        assert!(
            assignment
                .elements()
                .iter()
                .any(|e| (e.topic(), e.partition()) == ("orders", 3)),
            "assigned once created: {assignment:?}"
        );
        assert!(
            fetcher.queues.is_routed(&key),
            "it fetches into a fetch queue"
        );
    }
}
