//! The commit thread: a scheduled commit cycle's round trips run beside the live lane's
//! fetching.
//!
//! A cycle waits for the OffsetCommit's answer (and, in a split, the side log's). On the live
//! thread that wait was time no message was polled: about a millisecond of every 20–30 ms
//! in `off` at full speed here, and the whole request timeout (30 s) behind a coordinator that
//! does not answer — the live lane stood still exactly when fresh records matter. The live
//! thread still plans each cycle and records what it left in Kafka (the buffer lets go of
//! what it covers); the commit thread only sends its writes and waits for the answers.
//!
//! One cycle at a time. Whatever on the live thread must not come between a cycle's plan and
//! its record — a rebalance, a command's own commit, the maintenance that discards or
//! reconciles partitions — first waits for the answers of the one under way and records it
//! ([`Finish::Wait`]), as it came after the whole cycle when the cycle ran on the live
//! thread. What now comes between them changes nothing a plan was made from: the live lane's
//! appends (and truncation gaps) only move its fetched end above the planned offsets;
//! repositioning moves the cursor and librdkafka's position; pruning skips every assigned
//! partition; pauses, probes, a backlog count (it reads a committed offset a cycle may be
//! about to move) and a new subscription (its revoke waits) touch no plan. The reader's
//! reads and acks came between them before too, from its own thread; and a runtime made anew
//! meanwhile has a new generation, which the record checks (`Shared::commit_applied`).

use std::thread::{Scope, ScopedJoinHandle};

use crossbeam_channel::TryRecvError;

use super::commit::{CycleSent, PlannedCycle};
use super::*;

/// The commit thread.
pub(super) struct CommitThread<'scope> {
    /// Where cycles go (dropped: the thread ends once its cycle did).
    jobs: Sender<Job>,
    /// Joined when this is dropped: a panic of the thread (it stopped the consumer already)
    /// must not become the scope's, which would lose a close's answer.
    thread: Option<ScopedJoinHandle<'scope, ()>>,
}

/// A cycle's writes for the commit thread to send, and where its answers go.
struct Job {
    cycle: CommitCycle<PartitionId>,
    tokens: Vec<Option<SplitToken>>,
    answer: Sender<Answer>,
}

/// How a cycle's writes went, and when the last answer came.
type Answer = (CycleSent, Instant);

/// The cycle under way: planned by the live thread, sent by the commit thread.
pub(super) struct InFlight {
    planned: PlannedCycle,
    answer: Receiver<Answer>,
    started: Instant,
    reader_waits: bool,
}

/// A cycle that ended: when it began and ended, and whether the reader held back for
/// commits when it was planned (what `fetch::Schedule::committed` needs).
pub(super) type CycleEnded = (Instant, Instant, bool);

/// Whether finishing the cycle under way waits for its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finish {
    /// Until they come (bounded by the OffsetCommit's timeout, 30 s, and in a split by the
    /// side log's).
    Wait,
    /// Only if they came.
    IfAnswered,
}

impl<'scope> CommitThread<'scope> {
    /// Starts the commit thread of `consumer` inside `scope` (which ends only once the thread
    /// did: the consumer outlives every cycle). `None` when it cannot start: the live thread
    /// then runs its cycles itself.
    pub(super) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        consumer: &'scope BaseConsumer<LiveContext>,
        state: &'scope LiveState,
    ) -> Option<Self> {
        let (jobs, queued) = crossbeam_channel::bounded::<Job>(1);
        let thread = std::thread::Builder::new()
            .name("catchup-commit".into())
            .spawn_scoped(scope, move || {
                let _stop_on_panic = state.shared.stop_on_panic("commit");
                for job in queued {
                    let sent = state.send_cycle(consumer, &job.cycle, |index| {
                        job.tokens.get(index).and_then(Option::as_ref)
                    });
                    let _ = job.answer.send((sent, Instant::now()));
                    // The live thread may be waiting for its queue: it records the cycle now.
                    state.shared.live_wake.wake();
                }
            });
        match thread {
            Ok(thread) => Some(Self {
                jobs,
                thread: Some(thread),
            }),
            Err(error) => {
                tracing::warn!(%error, "cannot start the commit thread: the group member commits on its own thread");
                None
            }
        }
    }
}

impl Drop for CommitThread<'_> {
    fn drop(&mut self) {
        // Its queue closed, the thread ends once the cycle it sends did.
        let (closed, _) = crossbeam_channel::bounded(0);
        drop(std::mem::replace(&mut self.jobs, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl LiveState {
    /// Begins a scheduled commit cycle at `now` (`reader_waits`: the reader holds back for
    /// commits): planned here, its writes sent by `thread` while the live thread goes on.
    /// True while it is under way; false when it has ended already (nothing to write, or no
    /// commit thread: it ran here), and [`take_cycle_ended`](Self::take_cycle_ended) says so.
    pub(super) fn begin_cycle(
        &self,
        consumer: &BaseConsumer<LiveContext>,
        thread: Option<&CommitThread<'_>>,
        now: Instant,
        reader_waits: bool,
    ) -> bool {
        self.finish_cycle(Finish::Wait);
        let Some(planned) = self.plan_cycle(None) else {
            *self.cycle_ended() = Some((now, now, reader_waits));
            return false;
        };
        if let Some(thread) = thread {
            let (answer, answered) = crossbeam_channel::bounded(1);
            let job = Job {
                cycle: planned.cycle().clone(),
                tokens: planned.tokens(),
                answer,
            };
            // Full or gone: none is under way (finished above), so the thread is gone.
            if thread.jobs.try_send(job).is_ok() {
                *self.in_flight() = Some(InFlight {
                    planned,
                    answer: answered,
                    started: now,
                    reader_waits,
                });
                return true;
            }
        }
        let sent = self.send_planned(consumer, &planned);
        let _ = self.apply_cycle(&planned, sent);
        *self.cycle_ended() = Some((now, Instant::now(), reader_waits));
        false
    }

    /// Records the cycle under way once its answers came (`how`: waiting for them, or only
    /// if they did). Errors are reported as events; what it did not commit, the next cycle
    /// does.
    pub(super) fn finish_cycle(&self, how: Finish) {
        let Some(cycle) = self.in_flight().take() else {
            return;
        };
        if self.abandoned.load(Ordering::Relaxed) {
            // A simulated crash: the buffer stays as it was (behind Kafka if the commit
            // lands, the safe side).
            return;
        }
        let answer = match how {
            Finish::Wait => cycle.answer.recv().map_err(|_| TryRecvError::Disconnected),
            Finish::IfAnswered => cycle.answer.try_recv(),
        };
        let (sent, ended) = match answer {
            Ok(answer) => answer,
            Err(TryRecvError::Empty) => {
                *self.in_flight() = Some(cycle);
                return;
            }
            // The commit thread stopped (it stopped the consumer): nothing is known to be
            // in Kafka.
            Err(TryRecvError::Disconnected) => (
                cycle.planned.unknown(KafkaError::Stopped("commit")),
                Instant::now(),
            ),
        };
        let _ = self.apply_cycle(&cycle.planned, sent);
        *self.cycle_ended() = Some((cycle.started, ended, cycle.reader_waits));
    }

    /// The scheduled cycle that ended since the last call.
    pub(super) fn take_cycle_ended(&self) -> Option<CycleEnded> {
        self.cycle_ended().take()
    }

    fn in_flight(&self) -> MutexGuard<'_, Option<InFlight>> {
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn cycle_ended(&self) -> MutexGuard<'_, Option<CycleEnded>> {
        self.cycle_ended
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
