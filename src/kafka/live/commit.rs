//! The commit cycle: every partition's main-log write in one OffsetCommit, then the side-log
//! writes together (`docs/design.md`, "A commit cycle").

use super::*;

impl LiveState {
    /// Offsets of the assignment that the group has not committed yet: from each partition's
    /// committed offset to its log end (a partition still waiting for reconciliation counts
    /// as one, its size being unknown).
    pub(super) fn backlog(&self, consumer: &BaseConsumer<LiveContext>) -> Result<u64, KafkaError> {
        let committed: Vec<(PartitionId, i64)> = self
            .shared
            .partitions()
            .iter()
            .map(|(key, runtime)| (key.clone(), runtime.main_committed))
            .collect();
        let mut backlog = self.unreconciled().len() as u64;
        // Read concurrently, 5 s each: the live thread polls nothing meanwhile, and its time
        // between polls counts against max.poll.interval.ms.
        let keys: Vec<PartitionId> = committed.iter().map(|(key, _)| key.clone()).collect();
        let watermarks = read_watermarks(consumer, &keys);
        for (((topic, partition), main_committed), watermarks) in
            committed.into_iter().zip(watermarks)
        {
            let (_, high) = watermarks.map_err(|e| {
                KafkaError::client(&format!("reading the log end of {topic}/{partition}"), e)
            })?;
            backlog += (high - main_committed).max(0) as u64;
        }
        Ok(backlog)
    }

    /// Reports every partition's progress, with the log ends librdkafka last heard of (no
    /// request is made).
    pub(super) fn report_progress(&self, consumer: &BaseConsumer<LiveContext>) {
        let keys: Vec<PartitionId> = self.shared.partitions().keys().cloned().collect();
        let log_ends = keys
            .into_iter()
            .filter_map(|key| {
                let high =
                    crate::kafka::cached_watermarks::cached_high(consumer.client(), &key.0, key.1)?;
                Some((key, high))
            })
            .collect();
        self.shared.report_progress(&log_ends);
    }

    /// One commit cycle (of every partition, or of `only`) on this thread, after the one
    /// under way on the commit thread ended: the main-log writes of all partitions in one
    /// OffsetCommit, then the side-log writes of those whose main-log write succeeded (or had
    /// none) sent together, then what Kafka now holds recorded in the buffer. The first
    /// error is returned; every one is reported.
    pub(super) fn commit(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        only: Option<&[PartitionId]>,
    ) -> Result<(), KafkaError> {
        self.finish_cycle(Finish::Wait);
        let Some(planned) = self.plan_cycle(only) else {
            return Ok(());
        };
        let sent = self.send_planned(consumer, &planned);
        self.apply_cycle(&planned, sent)
    }

    /// Sends a planned cycle's writes on this thread ([`send_cycle`](Self::send_cycle)).
    pub(super) fn send_planned(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        planned: &PlannedCycle,
    ) -> CycleSent {
        let PlannedCycle { pending, cycle } = planned;
        self.send_cycle(consumer, cycle, |index| pending[index].token.as_ref())
    }

    /// The commits due (of every partition, or of `only`) as one cycle; `None` when nothing
    /// is to be written.
    pub(super) fn plan_cycle(&self, only: Option<&[PartitionId]>) -> Option<PlannedCycle> {
        if only.is_none() {
            // What was processed so far is covered now: the early-commit count restarts.
            self.shared.take_processed_since_commit();
        }
        let pending = self.shared.pending_commits(only);
        if pending.is_empty() {
            return None;
        }
        let cycle = CommitCycle::new(
            pending
                .iter()
                .map(|pending| {
                    tracing::debug!(partition = ?pending.partition, plan = ?pending.plan, "commit");
                    (
                        pending.partition.clone(),
                        pending.plan.writes(pending.token.as_ref()),
                    )
                })
                .collect(),
        );
        Some(PlannedCycle { pending, cycle })
    }

    /// Records what a cycle's writes left in Kafka: the partitions whose every write went
    /// through count as committed (the buffer lets go of what that covers). The first error
    /// is returned; every one is reported.
    pub(super) fn apply_cycle(
        &self,
        planned: &PlannedCycle,
        sent: CycleSent,
    ) -> Result<(), KafkaError> {
        let PlannedCycle { pending, cycle } = planned;
        for err in &sent.errors {
            self.shared.emit(Event::Error {
                message: err.to_string(),
            });
        }
        let applied = cycle.applied(&sent.refused, &sent.side_failed);
        for &index in &applied {
            if let Err(err) = self.shared.commit_applied(&pending[index]) {
                if err.is_io_failure() {
                    self.shared.write_failed(&err);
                }
                self.shared.emit(Event::Error {
                    message: err.to_string(),
                });
            }
        }
        if !applied.is_empty() {
            self.shared.commits_landed();
        }
        sent.errors.into_iter().next().map_or(Ok(()), Err)
    }

    /// Sends a cycle's writes to Kafka: the main-log writes in one OffsetCommit, then the
    /// side-log writes of the partitions whose main-log write went through (or had none),
    /// sent together. `token_of(index)` is the split token the partition at `index` seals its
    /// side entry under. Nothing is emitted; the caller reports `errors`.
    pub(super) fn send_cycle<'a>(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        cycle: &CommitCycle<PartitionId>,
        token_of: impl Fn(usize) -> Option<&'a SplitToken>,
    ) -> CycleSent {
        let mains = cycle.mains();
        let mut errors = Vec::new();
        // Partitions whose main-log write failed: none of their writes after it happen.
        let refused: Vec<PartitionId> = match commit_main_all(consumer, &mains) {
            Ok(refused) => {
                // A partition committed is a request that got through: an outage announced
                // ends here, not at the next probe (which a slow broker may time out).
                if refused.len() < mains.len() {
                    self.shared.health.reached();
                    self.shared.health.accepted();
                }
                refused
                    .into_iter()
                    .map(|(key, err)| {
                        errors.push(err);
                        key
                    })
                    .collect()
            }
            Err(err) => {
                errors.push(err);
                mains.iter().map(|(key, _)| (*key).clone()).collect()
            }
        };
        let mut side_failed = Vec::new();
        let mut sides: Vec<(usize, SideLogWrite<'_>)> = Vec::new();
        for (index, (topic, partition), side) in cycle.sides(&refused) {
            let entry = match side {
                SideWrite::Keep => continue,
                SideWrite::Tombstone => None,
                SideWrite::Write(entry) => match token_of(index) {
                    Some(token) => Some((entry, &token.secret)),
                    // A bug of the plan: nothing to seal it with, so it is not written, and
                    // the partition does not count as having written it.
                    None => {
                        errors.push(KafkaError::Assignment(format!(
                            "{topic}/{partition}: a side entry to write without a split token"
                        )));
                        side_failed.push(index);
                        continue;
                    }
                },
            };
            sides.push((index, (topic.as_str(), *partition, entry)));
        }
        let side_entries: Vec<_> = sides.iter().map(|(_, entry)| *entry).collect();
        for ((index, _), result) in sides.iter().zip(self.side_log.write_all(&side_entries)) {
            if let Err(err) = result {
                errors.push(err);
                side_failed.push(*index);
            }
        }
        CycleSent {
            refused,
            side_failed,
            errors,
        }
    }
}

/// A commit cycle planned: each partition's commit, and the cycle's writes (in the same
/// order).
pub(super) struct PlannedCycle {
    pending: Vec<PendingCommit>,
    cycle: CommitCycle<PartitionId>,
}

impl PlannedCycle {
    /// The split token each partition seals its side entry under, by index in the cycle.
    pub(super) fn tokens(&self) -> Vec<Option<SplitToken>> {
        self.pending.iter().map(|pending| pending.token).collect()
    }

    /// The cycle's writes.
    pub(super) fn cycle(&self) -> &CommitCycle<PartitionId> {
        &self.cycle
    }

    /// How its writes went when nothing is known of them (`error` says why): none counts as
    /// done.
    pub(super) fn unknown(&self, error: KafkaError) -> CycleSent {
        CycleSent {
            refused: self.pending.iter().map(|p| p.partition.clone()).collect(),
            side_failed: (0..self.pending.len()).collect(),
            errors: vec![error],
        }
    }
}

/// How a commit cycle's writes to Kafka went (see [`LiveState::send_cycle`]).
pub(super) struct CycleSent {
    /// The partitions whose main-log write failed.
    pub refused: Vec<PartitionId>,
    /// The indices (in the cycle) of the partitions whose side-log write failed.
    pub side_failed: Vec<usize>,
    /// Every error, in the order they came.
    pub errors: Vec<KafkaError>,
}

/// Commits every partition's offset and metadata in one OffsetCommit request, waiting at
/// most `REQUEST_TIMEOUT`. Returns the partitions whose commit the broker refused, with why
/// (empty: all committed); an error when the request as a whole failed (nothing counts as
/// committed).
pub(super) fn commit_main_all(
    consumer: &BaseConsumer<LiveContext>,
    commits: &[(&PartitionId, &MainLogCommit)],
) -> Result<Vec<(PartitionId, KafkaError)>, KafkaError> {
    if commits.is_empty() {
        return Ok(Vec::new());
    }
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), commit) in commits {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(commit.offset))
            .map_err(|e| KafkaError::client("building a commit", e))?;
        if let Some(mut element) = tpl.find_partition(topic, *partition) {
            element.set_metadata(&commit.metadata);
        }
    }
    let what = |commits: &[(&PartitionId, &MainLogCommit)]| match commits {
        [((topic, partition), commit)] => {
            format!("committing {topic}/{partition} at {}", commit.offset)
        }
        _ => format!("committing {} partitions", commits.len()),
    };
    let outcomes =
        crate::kafka::commit_each(consumer.client(), &tpl, REQUEST_TIMEOUT).map_err(|reason| {
            KafkaError::Request {
                action: what(commits),
                reason,
            }
        })?;
    Ok(commits
        .iter()
        .filter_map(|&(key, commit)| {
            // A partition the answer does not name is not known to be committed.
            let reason = outcomes
                .get(key)
                .cloned()
                .unwrap_or_else(|| Some("not in the broker's answer".into()))?;
            let action = what(&[(key, commit)]);
            Some((key.clone(), KafkaError::Request { action, reason }))
        })
        .collect())
}
