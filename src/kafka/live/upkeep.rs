//! What the live thread does besides fetching: revokes, damaged partitions, the buffer's
//! upkeep (pruning records nobody owns, compaction), the allocator's freed memory, and errors
//! it cannot poll past.

use super::*;

impl LiveState {
    /// Takes `partitions` from the catch-up fetcher and waits (bounded) until it has stopped
    /// appending for them: their records are discarded or their layout retired next.
    pub(super) fn stop_catchup(&self, partitions: &[PartitionId]) {
        let (done, stopped) = crossbeam_channel::bounded(1);
        let command = CatchupCommand::Remove {
            partitions: partitions.to_vec(),
            done,
        };
        if self.catchup.send(command).is_ok() {
            let _ = stopped.recv_timeout(REQUEST_TIMEOUT);
        }
    }

    /// An error polling on does not get past: access refused and an undecodable batch stop
    /// the consumer at once;
    /// an unknown topic only once the cluster's metadata confirms that a subscribed topic
    /// does not exist (it may be created a moment later; looked up at most every 5 s).
    pub(super) fn on_fatal_error(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        kind: FatalKind,
        message: String,
    ) {
        match kind {
            FatalKind::Refused => self.shared.stop_with(Stopped::Refused(message)),
            FatalKind::Undecodable => self.shared.stop_with(Stopped::Undecodable(message)),
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

    /// Starts a compaction of the buffer on its own thread, unless one is running; it
    /// compacts when sled holds far more disk than the buffer stores
    /// ([`Buffer::compact_if_bloated`](crate::store::Buffer::compact_if_bloated)). A
    /// failure changes nothing stored (the old generation stays): a WARN, and the next
    /// round tries again.
    pub(super) fn compact_if_bloated(&self) {
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
    pub(super) fn finish_compaction(&self) {
        let running = self.compacting().take();
        if let Some(running) = running {
            let _ = running.join();
        }
    }

    /// Discards the buffered records of partitions not assigned here (revoked, or held
    /// before a restart) that a reassignment could never reuse, by the group's commits
    /// ([`unowned_action`]). A failed lookup leaves them for the next round.
    pub(super) fn prune_unowned(&self, consumer: &BaseConsumer<LiveContext>) {
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
    pub(super) fn refetch_damaged(
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
        // The cycle under way may commit theirs: it is recorded first.
        self.finish_cycle(Finish::Wait);
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

    pub(super) fn on_revoke(&self, consumer: &BaseConsumer<LiveContext>, tpl: &TopicPartitionList) {
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
                telemetry::partition_gone(&self.shared.group, key);
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
        // While not ours the topic may be deleted and recreated: checked again on return, and
        // at the next assignment of any of its partitions.
        self.kept().extend(partitions.iter().cloned());
        {
            let mut checked = self
                .incarnations_checked
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for (topic, _) in &partitions {
                checked.remove(topic);
            }
        }
        // Not ours to refetch any more, should the reader have found it damaged meanwhile.
        self.shared.forget_damaged(&partitions);
        self.shared.emit(Event::Revoked { partitions, lost });
    }
}

/// Gives the memory glibc's allocator keeps after frees back to the system when `watch`
/// says it is worth it for `budget` (elsewhere: nothing).
///
/// Records are allocated on the fetchers' threads and freed on the application's, in bursts
/// (a backlog fetched at full speed, spilled, read, committed): glibc keeps what each
/// thread's arena freed for that arena's next allocations, and returns to the system only
/// what lies at the top of a heap. Behind a 1M-record backlog the process peaked at
/// 328–434 MiB, nearly all of it in five arenas, and held 150–200 MiB once trimmed (240–267
/// MiB peaks since, in the burst before the first trim). `malloc_trim` hands every arena's
/// free pages back; it does not change the allocator (an application with its own global
/// allocator frees little through glibc, and the call finds little to do). Where glibc
/// cannot say what it keeps (`mallinfo2` came with glibc 2.33), it is trimmed every time.
pub(super) fn give_back_freed_memory(watch: &mut TrimWatch, budget: u64) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let kept = glibc::kept_free();
        if kept.is_none_or(|kept| watch.look(kept, budget)) {
            // SAFETY: malloc_trim only releases free memory of glibc's allocator; it takes
            // the allocator's own locks.
            unsafe {
                libc::malloc_trim(0);
            }
            if let Some(after) = glibc::kept_free() {
                watch.trimmed(after);
            }
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (watch, budget);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::sync::OnceLock;

    type Mallinfo2 = unsafe extern "C" fn() -> libc::mallinfo2;

    /// The bytes glibc's allocator counts free in all its arenas, if this glibc can say
    /// (`mallinfo2`, looked up when first needed: linked, it would keep the crate from
    /// building and running against a glibc older than 2.33; nor is it found in a static
    /// build). Where it is missing, the caller trims every time, as before the bar.
    pub(super) fn kept_free() -> Option<u64> {
        static MALLINFO2: OnceLock<Option<Mallinfo2>> = OnceLock::new();
        let mallinfo2 = MALLINFO2.get_or_init(|| {
            // SAFETY: a lookup of a symbol by a NUL-terminated name.
            let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr()) };
            // SAFETY: glibc's `mallinfo2` has this signature.
            (!symbol.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Mallinfo2>(symbol) })
        });
        // SAFETY: mallinfo2 only reads the allocator's counters, under its own locks.
        mallinfo2.map(|mallinfo2| unsafe { mallinfo2() }.fordblks as u64)
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    #[test]
    fn glibc_says_what_it_keeps_free() {
        // Found at run time on the glibc this runs on (2.33 or later): the trim is decided.
        assert!(super::glibc::kept_free().is_some());
    }
}
