//! What a commit cycle commits: each partition's plan from what its lanes processed, and
//! what the runtime records once Kafka holds it.

use super::*;

impl Shared {
    /// Bytes acknowledged since the last call, which a commit is about to cover.
    pub fn take_processed_since_commit(&self) -> u64 {
        self.processed_since_commit.swap(0, Ordering::Relaxed)
    }

    /// Bytes acknowledged since the last commit.
    pub fn processed_since_commit(&self) -> u64 {
        self.processed_since_commit.load(Ordering::Relaxed)
    }

    /// Counts `bytes` more processed since the last commit; the live thread is woken when
    /// they bring the next commit forward (`fetch::schedule::early_commit_bytes`).
    pub(super) fn add_processed(&self, bytes: u64) {
        let before = self
            .processed_since_commit
            .fetch_add(bytes, Ordering::Relaxed);
        let mark = crate::fetch::early_commit_bytes(self.config.buffer_budget_bytes);
        if wake::crosses(before, bytes, mark) {
            self.live_wake.wake();
        }
    }

    /// The commits due for `only` (or every assigned partition).
    pub fn pending_commits(&self, only: Option<&[PartitionId]>) -> Vec<PendingCommit> {
        let mut partitions = self.partitions();
        let mut lag = [0i64; 2];
        let mut damaged = Vec::new();
        for (key, runtime) in partitions.iter_mut() {
            let state = match self.buffer.partition_state(&key.0, key.1) {
                Ok(Some(state)) => state,
                Ok(None) => continue,
                Err(err) => {
                    self.emit(Event::Error {
                        message: err.to_string(),
                    });
                    continue;
                }
            };
            for lane in Lane::ALL {
                let fetched_next = state.lane(lane).fetched_next;
                let account = &mut *runtime.lanes_mut()[lane_index(lane)];
                if let Err(reason) = self.skip_trailing_gap(key, lane, account, fetched_next) {
                    // Outside `only` nothing is planned now: the next cycle finds it again.
                    if only.is_none_or(|only| only.contains(key)) {
                        damaged.push((key.clone(), reason));
                    }
                    break;
                }
                let processed = runtime.acks(lane_index(lane)).committable();
                lag[lane_index(lane)] += (fetched_next - processed).max(0);
            }
        }
        for lane in Lane::ALL {
            // Offsets fetched into the buffer and not yet processed.
            let bytes: u64 = partitions.values().map(|r| r.buffered(lane)).sum();
            telemetry::lag(&self.group, lane.as_str(), lag[lane_index(lane)], bytes);
        }
        let spilled = self.buffer.spilled_bytes();
        let reported = self.spilled_reported.swap(spilled, Ordering::Relaxed);
        telemetry::spilled(&self.group, spilled.saturating_sub(reported));
        let mut woken = false;
        let pending = partitions
            .iter_mut()
            .filter(|(key, _)| only.is_none_or(|only| only.contains(key)))
            .filter_map(|(key, runtime)| {
                let catchup_processed = runtime.acks(0).committable();
                let plan = plan_commit(&Progress {
                    token: runtime.token,
                    side: runtime.side.as_ref(),
                    layout: &runtime.layout,
                    main_committed: runtime.main_committed,
                    catchup_processed,
                    live_processed: runtime.acks(1).committable(),
                });
                let awaited = runtime.awaiting_commit() > 0;
                let Some(acked) = crate::plan::commit_planned(runtime.lanes_mut(), &plan) else {
                    // Nothing acknowledged waits for a commit of this partition any more.
                    woken |= awaited;
                    return None;
                };
                Some(PendingCommit {
                    partition: key.clone(),
                    generation: runtime.generation,
                    token: runtime.token,
                    plan,
                    catchup_processed,
                    acked,
                })
            })
            .collect();
        // Taken off as the reader takes off a partition whose read finds damage, once what
        // was acknowledged of it is planned above (those records were verified when read):
        // read no more, and refetched by the live thread once this cycle is recorded.
        for (key, _) in &damaged {
            partitions.remove(key);
        }
        if woken {
            // A reader holding back for commits may read this partition again.
            self.awaiting_commits(&partitions);
            self.notify.notify_waiters();
        }
        drop(partitions);
        for (key, reason) in damaged {
            self.damaged_on_read(&key, reason);
        }
        pending
    }

    /// Offsets past the last delivered record that hold no record (transaction markers,
    /// compaction) count as processed once everything delivered is acknowledged — even when
    /// the reader has not been asked for more since. The damage its read finds, if any, for
    /// the caller to discard the partition as the reader would (reported once, not once a
    /// cycle until the reader reads there).
    pub(super) fn skip_trailing_gap(
        &self,
        key: &PartitionId,
        lane: Lane,
        account: &mut LaneAccount,
        fetched_next: i64,
    ) -> Result<(), String> {
        let from = account.acks().delivered_next();
        // Only a lane read through everything it delivered, with fetched offsets beyond, can
        // have such a gap; anything else needs no read.
        if account.acks().unacked() > 0 || from >= fetched_next {
            return Ok(());
        }
        match self.buffer.read(lane, &key.0, key.1, from, 1) {
            Ok(batch) if batch.records.is_empty() && batch.next > from => {
                account.read_through(batch.next)
            }
            Ok(_) => {}
            Err(StoreError::Damaged { reason, .. }) => return Err(reason),
            Err(err) => self.emit(Event::Error {
                message: err.to_string(),
            }),
        }
        Ok(())
    }

    /// After a commit cycle's commits were recorded: whether the reader still holds back for
    /// commits is looked at again (a reader that stopped asking must not keep the live thread
    /// committing sooner), and a reader holding back (`plan::may_read`) may go on.
    pub fn commits_landed(&self) {
        self.awaiting_commits(&self.partitions());
        self.notify.notify_waiters();
    }

    /// Records a commit that Kafka now holds, and lets the buffer delete what it covers.
    pub fn commit_applied(&self, commit: &PendingCommit) -> Result<(), StoreError> {
        let (topic, partition) = &commit.partition;
        let mut partitions = self.partitions();
        let Some(runtime) = partitions
            .get_mut(&commit.partition)
            .filter(|runtime| runtime.generation == commit.generation)
        else {
            return Ok(());
        };
        // A reader holding back for it is told by `commits_landed`, once per cycle.
        crate::plan::commit_landed(runtime.lanes_mut(), commit.acked);
        match &commit.plan {
            CommitPlan::Nothing => {}
            CommitPlan::Plain { offset } => {
                runtime.main_committed = *offset;
                self.buffer
                    .record_committed(Lane::Live, topic, *partition, *offset)?;
            }
            CommitPlan::Split { main, side } => {
                if let Some(main) = main {
                    runtime.main_committed = *main;
                    self.buffer
                        .record_committed(Lane::Catchup, topic, *partition, *main)?;
                }
                if let Some(side) = side {
                    runtime.side = Some(side.clone());
                    self.buffer
                        .record_committed(Lane::Live, topic, *partition, side.live_next)?;
                }
            }
            CommitPlan::Merge { offset } => {
                runtime.main_committed = *offset;
                runtime.token = None;
                runtime.side = None;
                self.buffer.record_committed(
                    Lane::Catchup,
                    topic,
                    *partition,
                    commit.catchup_processed,
                )?;
                self.buffer
                    .record_committed(Lane::Live, topic, *partition, *offset)?;
                drop(partitions);
                tracing::info!(
                    topic,
                    partition,
                    offset,
                    "split merged into the group's offsets"
                );
                telemetry::merged(&self.group);
                self.emit(Event::Merged {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: *offset,
                });
            }
        }
        Ok(())
    }
}
