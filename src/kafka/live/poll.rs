//! One poll round of the live lane: messages and positions fed to the partitions' cursors,
//! the appends they prove, out-of-range positions judged, broken chains repositioned
//! (`docs/design.md`, "Out of range").

use super::*;
use crate::fetch::write_failure;
use crate::kafka::queue_batch::Origin;

/// One poll round of the live lane: up to `POLL_BATCH` messages taken without waiting (one
/// while a lane is `held` to its read-ahead) fed to the partitions' cursors, the appends they
/// prove, and the repositioning of every partition whose chain of proof broke (DESIGN
/// invariant 8). Says whether the round polled nothing, and an error of the round the
/// consumer cannot get past by polling on.
pub(super) fn poll_into_buffer(
    consumer: &BaseConsumer<LiveContext>,
    shared: &Shared,
    queues: &MemberQueues,
    budget: &Budget,
    held: bool,
    positions: &mut Positions,
) -> RoundOutcome {
    // Held to its read-ahead, a lane's reader has enough to take: one message keeps the
    // group member polling (rebalances served, `max.poll.interval.ms` kept).
    let most = if held { 1 } else { POLL_BATCH };
    let LiveRound { polled, fatal } = poll_round(consumer, shared, queues, most);
    let quiet = polled.is_empty();
    let appends: Vec<(PartitionId, PendingAppend)> = {
        let mut partitions = shared.partitions();
        // What was polled for a partition under an assignment a rebalance of this round
        // ended is dropped (its key carries the generation it was polled under); an error
        // naming no partition ends every chain (and after an out-of-range error
        // every partition's watermarks tell whose it was).
        polled.feed(
            partitions
                .iter_mut()
                .map(|(key, runtime)| ((key.clone(), runtime.generation), &mut runtime.live)),
        );
        // Positions move past offsets without records (transaction markers, compaction);
        // each cursor decides whether its generation's position can be trusted. Read after
        // the round's polls.
        let running = partitions.keys().cloned().collect();
        for (key, position) in positions.read(consumer, running) {
            if let Some(runtime) = partitions.get_mut(&key) {
                runtime.live.handle_position(position);
            }
        }
        partitions
            .iter_mut()
            .filter_map(|(key, runtime)| runtime.live.poll_append().map(|a| (key.clone(), a)))
            .collect()
    };
    let mut stored = false;
    for (key, append) in appends {
        stored |= store_live(shared, &key, append);
    }
    judge_out_of_range(consumer, shared);
    reposition(consumer, shared, budget);
    if stored {
        shared
            .live_appends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.notify.notify_waiters();
    }
    RoundOutcome { quiet, fatal }
}

/// How a poll round went.
pub(super) struct RoundOutcome {
    /// Nothing was polled (the round's first `poll` found the queue empty, or served only
    /// events).
    pub quiet: bool,
    /// An error of the round the consumer cannot get past by polling on.
    pub fatal: Option<(FatalKind, String)>,
}

/// Events and messages waiting in `consumer`'s queue.
fn queued(consumer: &BaseConsumer<LiveContext>) -> usize {
    // SAFETY: the consumer is alive (borrowed for the call).
    unsafe { crate::kafka::ffi::consumer_queue_length(consumer.client().native_ptr()) }
}

/// What one round of `poll` brought.
#[derive(Default)]
pub(super) struct LiveRound {
    /// Messages in runs of one partition, each run under the generation of the partition's
    /// assignment it was polled in, and the errors between them (those of the consumer queue
    /// name no partition; those taken in a partition's run name it).
    pub(super) polled: Round<(PartitionId, u64)>,
    /// That error is one polling on does not get past (an unknown topic, access refused).
    pub(super) fatal: Option<(FatalKind, String)>,
}

impl LiveRound {
    /// Logs an error polled (from the consumer queue, `key` `None`: it names no partition,
    /// and reaches every lane) or taken in `key`'s run, naming offset `named` (see
    /// `Polled::from_error`), and hands the lanes what it means. Whether it ends the
    /// consumer queue's turn.
    pub(super) fn push_error(
        &mut self,
        shared: &Shared,
        key: Option<&(PartitionId, u64)>,
        err: &rdkafka::error::KafkaError,
        named: Option<i64>,
    ) -> bool {
        let kind = classify_poll_error(err);
        let which = key.map_or_else(
            || "every partition".to_owned(),
            |((topic, partition), _)| format!("{topic}/{partition}"),
        );
        match kind {
            PollErrorKind::EndOfPartition => {}
            PollErrorKind::Transient => {
                tracing::debug!(%err, which, "live fetch: transient client error");
            }
            PollErrorKind::OutOfRange => {
                tracing::warn!(%err, which, "live fetch: position out of range");
            }
            PollErrorKind::BreaksChain => {
                // The first one stands: a partition's ordinary error taken later in the round
                // must not hide it.
                if let Some(kind) = fatal_kind(err) {
                    self.fatal.get_or_insert((kind, err.to_string()));
                }
                shared.emit(Event::Error {
                    message: format!(
                        "live fetch of {which}: {err}; refetching from the buffer's positions"
                    ),
                });
            }
        }
        self.polled.push_error(key.cloned(), kind, named)
    }
}

/// How many rebalances ran so far (a callback run by `poll` changes it).
fn rebalances(shared: &Shared) -> u64 {
    shared.assignments.load(Ordering::Relaxed) + shared.revocations.load(Ordering::Relaxed)
}

/// Up to `most` messages (and the events before them) taken without waiting from the consumer
/// queue, then from the partitions' own queues, in runs of one partition and assignment.
pub(super) fn poll_round(
    consumer: &BaseConsumer<LiveContext>,
    shared: &Shared,
    queues: &MemberQueues,
    most: usize,
) -> LiveRound {
    let mut round = LiveRound::default();
    let mut polled_messages = 0;
    // A rebalance inside a `poll` of this round may revoke a partition and assign it again:
    // what was polled before it belongs to the old assignment and must not reach the new
    // one's lane (a record far ahead of the new position would "prove" the offsets between).
    let mut seen = rebalances(shared);
    for _ in 0..most {
        let polled = consumer.poll(Duration::ZERO);
        let now = rebalances(shared);
        if now != seen {
            seen = now;
            round.polled.seal_run();
        }
        match polled {
            // `poll` serves one event (statistics, a log line, a rebalance) and returns
            // nothing: the round goes on while the queue holds more — as one `poll` that
            // waited did — so that events queued during a long rebalance are not served one
            // per turn of the live thread.
            None if queued(consumer) > 0 => {}
            None => break,
            Some(Ok(message)) => {
                polled_messages += 1;
                let origin = Origin {
                    topic: topic_bytes(&message),
                    partition: message.partition(),
                };
                round.polled.push_record(
                    to_record(&message),
                    |(partition, _)| origin.is(partition),
                    // Once per run (runtimes change only in callbacks, which seal the run).
                    || run_key(shared, origin.key()),
                );
            }
            // An error is not the end of what was polled (DESIGN §6): what came before it
            // stays in the round. The client does not say which partition: every chain that
            // could be affected ends here.
            Some(Err(err)) => {
                if round.push_error(shared, None, &err, None) {
                    break;
                }
            }
        }
    }
    // After the consumer queue, whose `poll` ran any rebalance: what the partitions' queues
    // hold was fetched under the assignment their runtimes now have.
    queues.take_into(shared, most - polled_messages, &mut round);
    round
}

/// The key of a run of `partition`'s messages: the partition and the generation of its
/// runtime (`u64::MAX` when it has none, not assigned here or not yet: no lane takes it).
pub(super) fn run_key(shared: &Shared, partition: PartitionId) -> (PartitionId, u64) {
    let generation = shared
        .partitions()
        .get(&partition)
        .map_or(u64::MAX, |runtime| runtime.generation);
    (partition, generation)
}

/// Appends one partition's proven batch; `None` when the partition was re-laid out meanwhile
/// (its new runtime has a cursor of its own).
pub(super) fn append_live(
    shared: &Shared,
    key: &PartitionId,
    append: PendingAppend,
) -> AppendResult {
    if !shared.may_write_live(key) {
        // Below the free-space floor (or after a failed write): refetch later.
        return AppendResult::Failed;
    }
    let notes = shared
        .indexes_keys(key)
        .map(|generation| (generation, key_notes(&append.records)));
    let layout = append.layout;
    let result = shared
        .buffer
        .append_owned(Lane::Live, &key.0, key.1, append);
    if let Ok(outcome) = &result {
        telemetry::records_fetched(&shared.group, "live", outcome.stored as u64);
        shared.add_buffered(
            key,
            Lane::Live,
            layout,
            outcome.fetched_next,
            outcome.stored_bytes,
        );
        if let Some((generation, notes)) = notes {
            shared.note_keys(key, generation, notes);
        }
    }
    match write_failure(&result) {
        Some(err) if err.is_io_failure() => shared.write_failed(err),
        Some(err) => shared.emit(Event::Error {
            message: format!("live append of {}/{}: {err}", key.0, key.1),
        }),
        None => {}
    }
    // Only a cursor naming this layout is told (see the callers): a stale one is stale
    // itself and must not wait for an answer forever.
    AppendResult::from_store(&result).unwrap_or(AppendResult::Failed)
}

/// Appends `append` and tells the partition's lane how it went (only a lane of the same
/// layout: a stale one is stale itself). Whether records were stored.
fn store_live(shared: &Shared, key: &PartitionId, append: PendingAppend) -> bool {
    let layout = append.layout;
    let answer = append_live(shared, key, append);
    if let Some(runtime) = shared.partitions().get_mut(key) {
        if runtime.live.cursor().layout() == layout {
            runtime.live.handle_appended(answer);
        }
    }
    matches!(answer, AppendResult::Stored { .. })
}

/// Moves the consumer back to the buffer's position on every partition whose chain broke
/// and that is not held (its position lay past the log end). A seek that fails is retried
/// next round; until then that partition's records are dropped.
pub(super) fn reposition(consumer: &BaseConsumer<LiveContext>, shared: &Shared, budget: &Budget) {
    let now = Instant::now();
    let targets: Vec<(PartitionId, i64)> = shared
        .partitions()
        .iter()
        .filter_map(|(key, runtime)| Some((key.clone(), runtime.live.poll_move(now)?)))
        .collect();
    if targets.is_empty() {
        // Most rounds: the protocol is a request to librdkafka's main thread.
        return;
    }
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
pub(super) fn repositioned(shared: &Shared, key: &PartitionId, at: i64, moved: Result<(), String>) {
    let mut runtimes = shared.partitions();
    let Some(runtime) = runtimes.get_mut(key) else {
        return;
    };
    if moved.is_ok() {
        tracing::debug!(
            topic = key.0,
            partition = key.1,
            at,
            "live lane repositioned"
        );
    }
    if let Some(err) = runtime.live.handle_moved(at, moved) {
        drop(runtimes);
        shared.emit(Event::Error {
            message: format!(
                "live lane of {}/{}: moving back to {at} failed ({err}); retrying",
                key.0, key.1
            ),
        });
    }
}

/// A partition stopped by an out-of-range error cannot be sought (librdkafka refuses a seek
/// outside an active fetch): with an incremental protocol, unassign and assign it again at
/// `at`.
pub(super) fn reassign_at(
    consumer: &BaseConsumer<LiveContext>,
    (topic, partition): &PartitionId,
    at: i64,
) -> Result<(), rdkafka::error::KafkaError> {
    // An earlier attempt may have unassigned it and failed to assign it again: unassigning
    // what is not assigned is refused, which would keep it from ever being assigned.
    let assigned = consumer
        .assignment()?
        .find_partition(topic, *partition)
        .is_some();
    if assigned {
        let mut only = TopicPartitionList::new();
        only.add_partition(topic, *partition);
        consumer.incremental_unassign(&only)?;
    }
    let mut at_offset = TopicPartitionList::new();
    at_offset.add_partition_offset(topic, *partition, Offset::Offset(at))?;
    consumer.incremental_assign(&at_offset)
}

/// Under an eager protocol a partition stopped by an out-of-range error is moved by assigning
/// the whole assignment again: librdkafka refuses the incremental forms outside a rebalance,
/// and a group that stays stable never rebalances. Every partition with a runtime restarts at
/// its buffer's position (its chain starts over: nothing polled before counts); one not
/// reconciled yet stays paused at the log end until it is. Pauses are those of the budget.
pub(super) fn reassign_all(
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
                        let cursor = runtime.live.cursor();
                        let at = cursor.reposition().unwrap_or(cursor.stored_next());
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
                    runtime.live.restarted_at(at);
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

/// After an out-of-range error: what each partition's position means once its watermarks
/// are read (`LanePartition::handle_watermarks`). Retention passed it: report the truncation
/// (DESIGN §5, last row) and record the deleted offsets as covered — they no longer exist in
/// the log — so the lane continues at the log start. The log ends below it: hold it (1 s,
/// doubling to 30 s) instead of fetching there again every round. Inside the log: the error
/// was another partition's, and it moves at once.
fn judge_out_of_range(consumer: &BaseConsumer<LiveContext>, shared: &Shared) {
    let now = Instant::now();
    let waiting: Vec<(PartitionId, LayoutId)> = shared
        .partitions()
        .iter()
        .filter(|(_, runtime)| runtime.live.poll_watermarks(now))
        .map(|(key, runtime)| (key.clone(), runtime.live.cursor().layout()))
        .collect();
    // Read concurrently, 5 s each: partitions whose leader is down must not hold the live
    // thread (its time between polls counts against max.poll.interval.ms).
    let keys: Vec<PartitionId> = waiting.iter().map(|(key, _)| key.clone()).collect();
    let watermarks = read_watermarks(consumer, &keys);
    for ((key, layout), watermarks) in waiting.into_iter().zip(watermarks) {
        let watermarks = watermarks.map_err(|err| err.to_string());
        let after = {
            let mut runtimes = shared.partitions();
            match runtimes.get_mut(&key) {
                // Laid out again meanwhile: its new lane judges for itself.
                Some(runtime) if runtime.live.cursor().layout() == layout => {
                    runtime.live.handle_watermarks(watermarks, now)
                }
                _ => continue,
            }
        };
        let (topic, partition) = (&key.0, key.1);
        match after {
            AfterOutOfRange::Truncated { from, to, append } => {
                shared.emit(Event::Truncated {
                    topic: topic.clone(),
                    partition,
                    from,
                    to,
                });
                store_live(shared, &key, append);
            }
            AfterOutOfRange::PastLogEnd { at, high, wait } => shared.emit(Event::Error {
                message: format!(
                    "live lane of {topic}/{partition}: position {at} is past the log end {high}; fetching there again in {} s",
                    wait.as_secs()
                ),
            }),
            AfterOutOfRange::Unknown { reason, wait } => shared.emit(Event::Error {
                message: format!(
                    "live lane of {topic}/{partition}: reading watermarks: {reason}; trying again in {} s",
                    wait.as_secs()
                ),
            }),
            AfterOutOfRange::InsideLog => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError as RdError;
    use rdkafka::types::RDKafkaErrorCode as Code;

    /// What an error does to the round: whether it ends the consumer queue's turn, what the
    /// lanes are handed (`Debug` of the round), and whether it stops the member.
    #[test]
    fn errors_of_the_consumer_queue_and_of_runs() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = Shared::for_tests(dir.path());
        let key: (PartitionId, u64) = (("orders".into(), 3), 1);
        let consumption = RdError::MessageConsumption;
        // (from a run, the error, ends the turn, handed to the lanes, fatal)
        let cases: [(bool, RdError, bool, Option<&str>, bool); 8] = [
            // Polled one at a time: an end of partition moved nothing, and the turn goes on.
            (false, RdError::PartitionEOF(3), false, None, false),
            (false, consumption(Code::RequestTimedOut), true, None, false),
            (
                false,
                consumption(Code::OffsetOutOfRange),
                true,
                Some("(None, OutOfRange)"),
                false,
            ),
            (
                false,
                consumption(Code::InvalidRecord),
                true,
                Some("(None, BreaksChain)"),
                false,
            ),
            (
                false,
                consumption(Code::TopicAuthorizationFailed),
                true,
                Some("BreaksChain"),
                true,
            ),
            // Taken in a run: the position stands one past the offset named.
            (
                true,
                RdError::PartitionEOF(3),
                true,
                Some("EndOfPartition { at: Some(7) }"),
                false,
            ),
            (
                true,
                consumption(Code::RequestTimedOut),
                true,
                Some("3), 1)), BreaksChain"),
                false,
            ),
            (
                true,
                consumption(Code::OffsetOutOfRange),
                true,
                Some("3), 1)), OutOfRange"),
                false,
            ),
        ];
        for (in_run, error, ends, handed, fatal) in cases {
            let mut round = LiveRound::default();
            let (key, named) = if in_run {
                (Some(&key), Some(7))
            } else {
                (None, None)
            };
            let ended = round.push_error(&shared, key, &error, named);
            let polled = format!("{:?}", round.polled);
            assert_eq!(ended, ends, "{error:?} in a run: {in_run}");
            match handed {
                Some(event) => assert!(polled.contains(event), "{error:?}: {polled}"),
                None => assert!(round.polled.is_empty(), "{error:?}: {polled}"),
            }
            assert_eq!(round.fatal.is_some(), fatal, "{error:?}");
        }
    }

    /// A partition's ordinary error taken later in a round does not hide a fatal one taken
    /// before it: the member must still stop and say why.
    #[test]
    fn a_fatal_error_stands_for_the_round() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = Shared::for_tests(dir.path());
        let refused: (PartitionId, u64) = (("orders".into(), 0), 1);
        let damaged: (PartitionId, u64) = (("payments".into(), 0), 1);
        let mut round = LiveRound::default();
        round.push_error(
            &shared,
            Some(&refused),
            &RdError::MessageConsumption(Code::TopicAuthorizationFailed),
            Some(10),
        );
        round.push_error(
            &shared,
            Some(&damaged),
            &RdError::MessageConsumption(Code::InvalidRecord),
            Some(20),
        );
        assert_eq!(
            round.fatal.map(|(kind, _)| kind),
            Some(FatalKind::Refused),
            "the refusal is reported"
        );
    }
}
