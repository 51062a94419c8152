//! Reconciling an assignment: the committed offsets, watermarks (read concurrently), side
//! entries and incarnations gathered for every partition, `plan::reconcile` deciding, and its
//! writes carried out in order — main log, side log, local buffer, runtime, catch-up.

use super::*;

impl LiveState {
    /// Reconciles every assigned partition and sets its start offset in `tpl`; returns the
    /// partitions that could not be reconciled (to pause and retry).
    pub(super) fn on_assign(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        tpl: &mut TopicPartitionList,
    ) -> TopicPartitionList {
        let partitions = partitions_of(tpl);
        tracing::info!(count = partitions.len(), "partitions assigned: reconciling");
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

    /// Reconciles `partitions` and hands each start offset to `start_at`; returns those that
    /// failed. Without the committed offsets nothing can be decided; without the side log
    /// only the partitions with a split token must wait (their side entry holds the live
    /// progress; treating it as missing would reprocess far more than needed).
    pub(super) fn reconcile_all(
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
        let undecided = self.check_incarnations(consumer, partitions);
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
        let mut decided = Vec::new();
        let watermarks = read_watermarks(consumer, partitions);
        for ((topic, partition), watermarks) in partitions.iter().zip(watermarks) {
            let key = (topic.clone(), *partition);
            let offset = committed.find_partition(topic, *partition);
            if crate::plan::waits_unreconciled(
                offset.as_ref().map(|entry| entry.metadata()),
                side_entries.is_some(),
                undecided.contains(&key),
            ) {
                failed.push(key);
                continue;
            }
            match self.decide(&committed, side_entries.as_ref(), &key, watermarks) {
                Ok(decision) => decided.push(decision),
                Err(err) => self.assign_failed(key, &err, &mut failed),
            }
        }
        // Every decision's writes to Kafka as one cycle: one OffsetCommit, then the side-log
        // writes together (a rebalance callback's time counts against max.poll.interval.ms;
        // one request per partition, 30 s each at worst, could exceed it).
        let cycle = CommitCycle::new(
            decided
                .iter()
                .map(|decided| (decided.key.clone(), decided.writes.clone()))
                .collect(),
        );
        let sent = self.send_cycle(consumer, &cycle, |index| {
            decided[index].decision.token.as_ref()
        });
        for err in &sent.errors {
            self.shared.emit(Event::Error {
                message: format!(
                    "assigning: {err}; what it names waits paused and reconciliation is retried"
                ),
            });
        }
        for index in cycle.unapplied(&sent.refused, &sent.side_failed) {
            let key = decided[index].key.clone();
            self.shared.partitions().remove(&key);
            failed.push(key);
        }
        for index in cycle.applied(&sent.refused, &sent.side_failed) {
            let decided = &decided[index];
            let (topic, partition) = &decided.key;
            let result = self.apply_locally(decided).and_then(|start| {
                start_at(topic, *partition, start).map_err(|err| {
                    KafkaError::client(&format!("setting the start offset {start}"), err).into()
                })
            });
            if let Err(err) = result {
                self.assign_failed(decided.key.clone(), &err, &mut failed);
            }
        }
        failed
    }

    /// Reports why `key`'s assignment failed and leaves it to be reconciled again (a failed
    /// write to the buffer stops the consumer: retrying cannot help, see `write_failed`).
    fn assign_failed(&self, key: PartitionId, err: &AssignError, failed: &mut Vec<PartitionId>) {
        if let AssignError::Store(store) = err {
            if store.is_io_failure() {
                self.shared.write_failed(store);
            }
        }
        let (topic, partition) = &key;
        self.shared.emit(Event::Error {
            message: format!(
                "assigning {topic}/{partition}: {err}; the partition waits paused and reconciliation is retried"
            ),
        });
        self.shared.partitions().remove(&key);
        failed.push(key);
    }

    /// Tries the failed reconciliations again. A partition that succeeds gets its runtime,
    /// and its consumer is moved to the start (its cursor begins broken, so the live loop
    /// repositions it like any broken chain) and resumed.
    /// Returns whether nothing is left to retry.
    pub(super) fn retry_unreconciled(&self, consumer: &BaseConsumer<LiveContext>) -> bool {
        let partitions: Vec<PartitionId> = std::mem::take(&mut *self.unreconciled())
            .into_iter()
            .collect();
        if partitions.is_empty() {
            return true;
        }
        // Reconciliation writes commits of its own, and gives the partitions their runtimes:
        // after the cycle under way is recorded (as an assignment does).
        self.finish_cycle(Finish::Wait);
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
                    runtime.live.break_chain();
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

    /// Drops the buffered records of every topic among `partitions` that was deleted and
    /// recreated since they were fetched (Kafka's topic id changed): the new topic's offsets
    /// restart with other data. Without topic ids (an old broker, a failed request) nothing
    /// buffered of the partitions being assigned is reused; a topic never recorded before is
    /// recorded.
    pub(super) fn check_incarnations(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        partitions: &[PartitionId],
    ) -> Vec<PartitionId> {
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
            return Vec::new();
        }
        let ids = match crate::kafka::topic_id::topic_ids(
            consumer.client(),
            &topics,
            TOPIC_ID_TIMEOUT,
        ) {
            Ok(ids) => ids,
            Err(err) => {
                tracing::debug!(%err, "topic ids unavailable; the incarnation check is skipped");
                Default::default()
            }
        };
        // Records of a topic whose incarnation cannot be told now — kept across a revoke in
        // this process, or left by an earlier process — may be of a topic deleted and
        // recreated meanwhile, the same offsets holding other data. Refetching costs only time.
        // A partition whose records could not be dropped waits (it is reconciled again).
        let mut undecided = Vec::new();
        for key in crate::plan::incarnation_unknown(partitions, &topics, &ids) {
            self.shared.forget_live_handed(&key.0, Some(key.1));
            match self.shared.buffer.discard_partition(&key.0, key.1) {
                Ok(false) => {}
                Ok(true) => self.shared.emit(Event::LocalDiscarded {
                    topic: key.0.clone(),
                    partition: key.1,
                    reason: "the topic's id (its incarnation) cannot be read now, so nothing proves the buffered records are of the topic as it is".into(),
                }),
                Err(err) => {
                    self.shared.emit(Event::Error {
                        message: err.to_string(),
                    });
                    undecided.push(key.clone());
                }
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
                    self.shared.forget_live_handed(&topic, None);
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
                    // Not recorded: what is buffered of the topic is not proven its own.
                    undecided.extend(partitions.iter().filter(|(t, _)| *t == topic).cloned());
                }
            }
        }
        undecided
    }

    pub(super) fn checked(&self, topic: String) {
        self.incarnations_checked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(topic);
    }

    /// Reconciles one partition: its decision, and the writes to Kafka that carry it out.
    /// `side_entries` is `None` when the side log could not be read: then a decision that
    /// writes to it must wait (it could not see an entry it would overwrite or trust).
    fn decide(
        &self,
        committed: &TopicPartitionList,
        side_entries: Option<&crate::kafka::side_log::SideEntries>,
        key: &PartitionId,
        watermarks: rdkafka::error::KafkaResult<(i64, i64)>,
    ) -> Result<Decided, AssignError> {
        let (topic, partition) = (key.0.as_str(), key.1);
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
            .and_then(|e| e.get(key))
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
        if decision.waits_for_side_log(side_entries.is_some()) {
            return Err(KafkaError::side(
                self.side_log.topic(),
                "unreadable, and this partition's decision writes to it".into(),
            )
            .into());
        }
        let writes = decision
            .writes()
            .map_err(|reason| KafkaError::Assignment(format!("{topic}/{partition}: {reason}")))?;
        Ok(Decided {
            key: key.clone(),
            main_committed: decision.main_committed(main.as_ref(), low),
            decision,
            writes,
            local,
            high,
        })
    }

    /// Takes a decision's local step once its writes to Kafka happened, gives the partition
    /// its runtime and, while its backlog is not fetched, hands it to the catch-up fetcher.
    /// Returns the live lane's start.
    fn apply_locally(&self, decided: &Decided) -> Result<i64, AssignError> {
        let (topic, partition) = (decided.key.0.as_str(), decided.key.1);
        let _span = tracing::info_span!("assign", topic, partition).entered();
        let shared = &self.shared;
        let decision = &decided.decision;
        match decision.local_step() {
            LocalStep::Reuse {
                catchup_committed,
                live_committed,
            } => {
                let buffer = &shared.buffer;
                let reused = buffer
                    .record_resumed(Lane::Catchup, topic, partition, catchup_committed)
                    .and_then(|_| {
                        buffer.record_resumed(Lane::Live, topic, partition, live_committed)
                    });
                match reused {
                    Ok(_) => {
                        let range = decision
                            .local
                            .reused_range(&decision.layout, decided.local.as_ref());
                        if let Some((from, to)) = range {
                            shared.emit(Event::LocalReused {
                                topic: topic.into(),
                                partition,
                                from,
                                to,
                            });
                        }
                    }
                    // What cannot be reused is fetched again.
                    Err(err) => {
                        shared.emit(Event::LocalDiscarded {
                            topic: topic.into(),
                            partition,
                            reason: err.to_string(),
                        });
                        buffer.reset_partition(topic, partition, decision.layout.clone())?;
                    }
                }
            }
            LocalStep::Reset { layout, reason } => {
                if let Some(reason) = reason.filter(|reason| !reason.is_empty()) {
                    shared.emit(Event::LocalDiscarded {
                        topic: topic.into(),
                        partition,
                        reason: reason.to_owned(),
                    });
                }
                shared
                    .buffer
                    .reset_partition(topic, partition, layout.clone())?;
            }
        }
        let vanished =
            || KafkaError::Assignment(format!("{topic}/{partition} vanished from the buffer"));
        let generation = shared.next_generation(&decided.key);
        let handed = shared.live_handed_next(&decided.key);
        // The state is read and the runtime inserted under the partitions' lock. A writer
        // still appending under this layout (the catch-up fetcher of an earlier attempt that
        // failed after its `Add`) counts its append under that lock too: its records are then
        // either in the state read, or counted once the runtime is there — never counted
        // nowhere while the runtime's count starts past them.
        let mut partitions = shared.partitions();
        let state = shared
            .buffer
            .partition_state(topic, partition)?
            .ok_or_else(vanished)?;
        let layout_id = shared
            .buffer
            .layout_id(topic, partition)?
            .ok_or_else(vanished)?;
        let mut runtime = PartitionRuntime::new(
            topic,
            generation,
            &state,
            layout_id,
            decision.token,
            decision.side_entry.clone(),
            decided.main_committed,
        );
        if shared.config.mode == Mode::Latest {
            runtime.index_keys(&state, decided.high.max(handed.unwrap_or(decided.high)));
        }
        partitions.insert(decided.key.clone(), runtime);
        drop(partitions);
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
}

/// One partition's reconciliation, decided and not yet carried out.
struct Decided {
    key: PartitionId,
    decision: Decision,
    /// Its writes to Kafka, for the assignment's cycle.
    writes: CommitWrites,
    /// What the buffer held of the partition when it was decided.
    local: Option<PartitionState>,
    /// The offset the main log holds once the writes are done.
    main_committed: i64,
    /// The log end when it was decided.
    high: i64,
}

pub(super) fn plan_event(topic: &str, partition: i32, event: &PlanEvent) -> Event {
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
pub(super) enum AssignError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
