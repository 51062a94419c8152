//! When the group member's periodic work is due, with `now` passed in: commits (every
//! interval, sooner once much was processed, or while the reader holds back for commits that
//! have not landed), the pruning of records nobody owns (every 10 s
//! and after every assignment), retries of partitions that could not be reconciled (1 s,
//! doubling to 30 s while they keep failing), probes of brokers that stopped answering
//! (every 2 s), and giving the allocator's freed memory back (looked at every 250 ms, done
//! when it keeps more than a memory tier's worth). The live thread asks
//! [`due`](Schedule::due) each round, does what is due, and says what it did.

use std::time::{Duration, Instant};

/// Commits brought forward by the amount processed come at most this often (and no sooner
/// after the last one than it took). At 400 MB/s a 32nd of the default budget is processed
/// every 20 ms; spaced by 100 ms, processed records outgrew the memory tier and were
/// written to disk before their commit.
pub const MIN_COMMIT_SPACING: Duration = Duration::from_millis(20);
/// While the reader holds back for commits that have not landed, a commit is tried this
/// soon after the last (and no sooner than the last one took), the wait doubling with each
/// such commit up to [`WAITING_READER_COMMIT_SPACING_MAX`]: it resumes the reader soon after
/// Kafka takes commits again, without waiting out the interval, and a partition whose commits
/// fail for good is not retried ten times a second (each failure is an `Event::Error`).
pub const WAITING_READER_COMMIT_SPACING: Duration = Duration::from_millis(100);
/// The longest wait between commits brought forward for a reader holding back.
pub const WAITING_READER_COMMIT_SPACING_MAX: Duration = Duration::from_secs(2);
/// How often the reconciliation of a partition that failed is tried again.
pub const RECONCILE_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two reconciliation attempts that keep failing.
pub const RECONCILE_RETRY_MAX: Duration = Duration::from_secs(30);
/// How often the buffered records of partitions not assigned here are checked against the
/// group's commits (and after every assignment).
pub const PRUNE_EVERY: Duration = Duration::from_secs(10);
/// How often the brokers are asked whether they answer again while they do not.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How often the memory the process's allocator keeps after frees is looked at (and given
/// back when [`TrimWatch::look`] says so).
pub const TRIM_EVERY: Duration = Duration::from_millis(250);
/// The least kept memory worth giving back, whatever the budget.
pub const TRIM_ABOVE_MIN: u64 = 32 << 20;

/// What the live thread has to do this round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Due {
    /// Commit what is processed.
    pub commit: bool,
    /// Prune records of partitions nobody here owns (and compact if bloated).
    pub prune: bool,
    /// Reconcile the partitions that failed again.
    pub retry: bool,
    /// Ask the brokers whether they answer.
    pub probe: bool,
    /// Give the memory the allocator keeps back to the system.
    pub trim: bool,
}

/// Each timer's wait (see [`Schedule::until_due`]).
struct Waits {
    commit: Option<Duration>,
    prune: Option<Duration>,
    retry: Option<Duration>,
    probe: Option<Duration>,
    trim: Option<Duration>,
}

/// What the schedule needs to know of the consumer this round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// Bytes processed since the last commit.
    pub processed: u64,
    /// Assignments so far (a new one prunes at once).
    pub assignments: u64,
    /// Partitions were found damaged: reconciled again at once, not after a backoff other
    /// partitions ran up.
    pub damaged: bool,
    /// The brokers do not answer, or refuse the credentials.
    pub troubled: bool,
    /// The reader holds back for commits that have not landed
    /// (`plan::reader_waits_for_commits`).
    pub reader_waits: bool,
}

/// The live thread's timers.
#[derive(Debug, Clone)]
pub struct Schedule {
    commit_interval: Duration,
    budget_bytes: u64,
    last_commit: Instant,
    last_commit_took: Duration,
    /// Commits in a row made while the reader held back for commits.
    waiting_commits: u32,
    /// A commit cycle is under way (on the commit thread): none is due until it ended.
    committing: bool,
    last_retry: Instant,
    retry_every: Duration,
    last_prune: Instant,
    pruned_at_assignment: u64,
    last_probe: Instant,
    last_trim: Instant,
}

impl Schedule {
    /// The timers of a member started at `now` that commits every `commit_interval` (at
    /// least [`MIN_COMMIT_SPACING`]: a shorter one would have an idle member commit, and
    /// nothing else, in a loop) and buffers up to `budget_bytes`.
    pub fn new(now: Instant, commit_interval: Duration, budget_bytes: u64) -> Self {
        Self {
            commit_interval: commit_interval.max(MIN_COMMIT_SPACING),
            budget_bytes,
            last_commit: now,
            last_commit_took: Duration::ZERO,
            waiting_commits: 0,
            committing: false,
            last_retry: now,
            retry_every: RECONCILE_RETRY,
            last_prune: now,
            pruned_at_assignment: 0,
            last_probe: now,
            last_trim: now,
        }
    }

    /// What is due at `now`.
    pub fn due(&self, now: Instant, facts: Facts) -> Due {
        let waits = self.waits(now, facts);
        let now_due = |wait: Option<Duration>| wait == Some(Duration::ZERO);
        Due {
            commit: now_due(waits.commit),
            prune: now_due(waits.prune),
            retry: now_due(waits.retry),
            probe: now_due(waits.probe),
            trim: now_due(waits.trim),
        }
    }

    /// How long from `now` until something is due if `facts` stay as they are: how long the
    /// live thread may wait for messages before it looks at the schedule again. (What
    /// changes the facts sooner — a reader that processed enough for an early commit, or
    /// that starts holding back for commits — wakes it: `engine::FetcherWake`.)
    pub fn until_due(&self, now: Instant, facts: Facts) -> Duration {
        let waits = self.waits(now, facts);
        [
            waits.commit,
            waits.prune,
            waits.retry,
            waits.probe,
            waits.trim,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::MAX)
    }

    /// Each timer's wait from `now` (zero: due; `None`: not due whatever the time, as long
    /// as `facts` stay).
    fn waits(&self, now: Instant, facts: Facts) -> Waits {
        let left = |then: Instant, every: Duration| {
            every.saturating_sub(now.saturating_duration_since(then))
        };
        let mut commit = commit_wait(
            now.saturating_duration_since(self.last_commit),
            self.last_commit_took,
            self.commit_interval,
            facts.processed,
            self.budget_bytes,
        );
        if facts.reader_waits {
            commit = commit.min(left(self.last_commit, self.waiting_reader_spacing()));
        }
        Waits {
            // The cycle under way is what the reader waits for; its end is looked at every
            // turn of the live thread (the commit thread wakes it).
            commit: (!self.committing).then_some(commit),
            prune: Some(if facts.assignments != self.pruned_at_assignment {
                Duration::ZERO
            } else {
                left(self.last_prune, PRUNE_EVERY)
            }),
            retry: Some(if facts.damaged {
                Duration::ZERO
            } else {
                left(self.last_retry, self.retry_every)
            }),
            probe: facts.troubled.then(|| left(self.last_probe, PROBE_EVERY)),
            trim: Some(left(self.last_trim, TRIM_EVERY)),
        }
    }

    /// A commit cycle began and runs on while the live thread goes on fetching: no commit
    /// is due until [`committed`](Self::committed) says it ended.
    pub fn commit_started(&mut self) {
        self.committing = true;
    }

    /// A commit that began at `started` ended at `now`; `reader_waited`: the reader held
    /// back for commits when it was decided ([`Facts::reader_waits`]).
    pub fn committed(&mut self, started: Instant, now: Instant, reader_waited: bool) {
        self.committing = false;
        self.last_commit = now;
        self.last_commit_took = now.saturating_duration_since(started);
        self.waiting_commits = if reader_waited {
            self.waiting_commits.saturating_add(1)
        } else {
            0
        };
    }

    /// How long after the last commit the next is brought forward for a reader holding back.
    fn waiting_reader_spacing(&self) -> Duration {
        let doubled = WAITING_READER_COMMIT_SPACING
            .saturating_mul(1 << self.waiting_commits.min(16))
            .min(WAITING_READER_COMMIT_SPACING_MAX);
        doubled.max(self.last_commit_took)
    }

    /// Pruned at `now`, with `assignments` so far.
    pub fn pruned(&mut self, now: Instant, assignments: u64) {
        self.last_prune = now;
        self.pruned_at_assignment = assignments;
    }

    /// Retried at `now`; `settled`: nothing is left to reconcile. Each attempt asks the
    /// brokers (up to 30 s per request while they are down): the wait doubles while
    /// attempts keep failing, so the live lane keeps fetching and committing.
    pub fn retried(&mut self, now: Instant, settled: bool) {
        self.last_retry = now;
        self.retry_every = if settled {
            RECONCILE_RETRY
        } else {
            (self.retry_every * 2).min(RECONCILE_RETRY_MAX)
        };
    }

    /// Probed the brokers at `now`.
    pub fn probed(&mut self, now: Instant) {
        self.last_probe = now;
    }

    /// Gave the allocator's freed memory back at `now`.
    pub fn trimmed(&mut self, now: Instant) {
        self.last_trim = now;
    }
}

/// When the memory the allocator keeps free is worth giving back to the system: once what
/// was freed since the last time exceeds a quarter of the budget (the memory tier's size),
/// and at least [`TRIM_ABOVE_MIN`].
///
/// At full speed the allocator keeps 20–45 MiB free from one moment to the next (measured
/// every 250 ms at the default budget, 100 B and 1 KiB records): the tier's records, handed
/// out and committed, are freed as the next ones arrive. Given back every 250 ms, those
/// pages were faulted in again at once — a fetcher thread spent about 12 % of its time
/// zeroing them, and `off` ran 10–15 % slower at 100 B. What a burst leaves (a backlog
/// fetched, spilled and read: 150–200 MiB) is well above the bar and given back.
///
/// The allocator's count of free bytes (glibc's `mallinfo2`) still counts what was given
/// back (the chunks stay free; only their pages go), so the bar is measured from the lowest
/// count since the last trim: free bytes above it were freed since, and are resident.
#[derive(Debug, Default)]
pub struct TrimWatch {
    /// The fewest free bytes counted since the last trim (after it, at first).
    floor: u64,
}

impl TrimWatch {
    /// Whether to give memory back now, with `kept` free bytes counted, for a consumer
    /// buffering up to `budget` bytes.
    pub fn look(&mut self, kept: u64, budget: u64) -> bool {
        self.floor = self.floor.min(kept);
        kept - self.floor > (budget / 4).max(TRIM_ABOVE_MIN)
    }

    /// Memory was given back; `kept` free bytes are counted after it.
    pub fn trimmed(&mut self, kept: u64) {
        self.floor = kept;
    }
}

/// How long until a commit is due: every `interval`, and sooner once a 32nd of the byte
/// budget ([`early_commit_bytes`]) was processed since the last commit. The buffer drops
/// processed records only once their commit is in Kafka, and its memory tier holds them
/// until then (a quarter of the budget, counting what records take in memory, about twice
/// their payload at 100 B): committed sooner than that, they are never written to disk. (At hundreds of MB/s a one-second
/// interval held over 400 MiB, 1 KiB records; an eighth of the budget still made the memory
/// tier spill processed records.) An early commit waits at least
/// [`MIN_COMMIT_SPACING`] and as long as the last one took, so early commits take at most
/// half of the live thread's time.
fn commit_wait(
    since_last: Duration,
    last_took: Duration,
    interval: Duration,
    processed: u64,
    budget: u64,
) -> Duration {
    let on_time = interval.saturating_sub(since_last);
    if processed > 0 && processed >= early_commit_bytes(budget) {
        let spacing = MIN_COMMIT_SPACING.max(last_took);
        on_time.min(spacing.saturating_sub(since_last))
    } else {
        on_time
    }
}

/// Bytes processed since the last commit that bring the next one forward (a 32nd of the
/// byte budget, see [`Schedule::due`]); the reader wakes the live thread when it crosses it.
pub fn early_commit_bytes(budget: u64) -> u64 {
    budget / 32
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn the_allocator_is_trimmed_only_of_more_than_a_memory_tiers_worth() {
        const MIB: u64 = 1 << 20;
        for (budget, looks) in [
            // The default budget (its tier: 64 MiB). Steady churn stays below the bar; a
            // burst is given back once; what it left, counted free still, does not bring
            // the trim back while the churn goes on; a second burst does.
            (
                256 * MIB,
                vec![
                    (45 * MIB, false, 45 * MIB),
                    (64 * MIB, false, 64 * MIB),
                    (200 * MIB, true, 190 * MIB),
                    (230 * MIB, false, 230 * MIB),
                    (190 * MIB, false, 190 * MIB),
                    (254 * MIB, false, 254 * MIB),
                    (255 * MIB, true, 255 * MIB),
                ],
            ),
            // Allocated again and freed again: measured from the lowest count.
            (
                256 * MIB,
                vec![
                    (300 * MIB, true, 300 * MIB),
                    (100 * MIB, false, 100 * MIB),
                    (170 * MIB, true, 170 * MIB),
                ],
            ),
            // A small budget: the floor holds.
            (16 * MIB, vec![(20 * MIB, false, 0), (33 * MIB, true, MIB)]),
            // A large one: its tier's churn is allowed for.
            (
                1024 * MIB,
                vec![(200 * MIB, false, 0), (300 * MIB, true, 0)],
            ),
            (u64::MAX, vec![(u64::MAX, true, 0), (0, false, 0)]),
        ] {
            let mut watch = TrimWatch::default();
            for (step, (kept, trim, after)) in looks.into_iter().enumerate() {
                assert_eq!(
                    watch.look(kept, budget),
                    trim,
                    "step {step}: {kept} kept, budget {budget}"
                );
                if trim {
                    watch.trimmed(after);
                }
            }
        }
    }

    #[test]
    fn commits_come_every_interval_or_sooner_after_a_32nd_of_the_budget() {
        let ms = Duration::from_millis;
        let budget = 256 << 20;
        for (since_last, processed, due) in [
            (ms(999), 0, false),
            (ms(1000), 0, true),
            // 8 MiB processed: sooner, but not more often than every 20 ms.
            (ms(25), 8 << 20, true),
            (ms(15), 8 << 20, false),
            (ms(150), (8 << 20) - 1, false),
        ] {
            assert_eq!(
                commit_wait(since_last, ms(5), SECOND, processed, budget).is_zero(),
                due,
                "{since_last:?} after the last commit, {processed} bytes processed"
            );
        }
        // A commit that took 300 ms is followed by an early one 300 ms later at the soonest.
        assert_eq!(
            commit_wait(ms(299), ms(300), SECOND, 8 << 20, budget),
            ms(1)
        );
        assert!(commit_wait(ms(300), ms(300), SECOND, 8 << 20, budget).is_zero());
        // A budget too small to divide commits every interval, not every 100 ms for nothing.
        assert_eq!(commit_wait(ms(500), ms(1), SECOND, 0, 31), ms(500));
    }

    #[test]
    fn a_reader_holding_back_for_commits_brings_them_forward() {
        let start = Instant::now();
        // An interval longer than every wait below.
        let mut schedule = Schedule::new(start, 60 * SECOND, 256 << 20);
        let waiting = Facts {
            reader_waits: true,
            ..Facts::default()
        };
        let after = |ms: u64| start + Duration::from_millis(ms);
        assert!(!schedule.due(after(99), waiting).commit);
        assert!(
            schedule.due(after(100), waiting).commit,
            "100 ms after the last"
        );
        assert!(!schedule.due(after(100), Facts::default()).commit);
        // Commits made while it holds back are spaced twice as far each time: 200 ms, then
        // 400 ms, ... up to 2 s.
        schedule.committed(after(100), after(100), true);
        assert!(!schedule.due(after(299), waiting).commit);
        assert!(schedule.due(after(300), waiting).commit);
        schedule.committed(after(300), after(300), true);
        assert!(!schedule.due(after(699), waiting).commit);
        assert!(schedule.due(after(700), waiting).commit);
        let mut at = 700;
        for _ in 0..10 {
            schedule.committed(after(at), after(at), true);
            at += 2_000;
        }
        assert!(!schedule.due(after(at - 1), waiting).commit);
        assert!(schedule.due(after(at), waiting).commit, "at most 2 s apart");
        // A commit made while it did not hold back starts over; one that took 400 ms is
        // tried again 400 ms after it ended.
        schedule.committed(after(at), after(at + 400), false);
        assert!(!schedule.due(after(at + 799), waiting).commit);
        assert!(schedule.due(after(at + 800), waiting).commit);
    }

    #[test]
    fn the_live_thread_waits_for_the_next_timer_and_no_longer() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let quiet = Facts::default();
        let processed = |bytes| Facts {
            processed: bytes,
            ..quiet
        };
        let waiting = |bytes| Facts {
            reader_waits: true,
            ..processed(bytes)
        };
        let troubled = Facts {
            troubled: true,
            ..quiet
        };
        let assigned = Facts {
            assignments: 1,
            ..quiet
        };
        let damaged = Facts {
            damaged: true,
            ..quiet
        };
        // From `start`: a commit at 495 ms that took 5 (the next at 1,495 ms, or 20 ms after
        // it once enough was processed), a trim at 480 ms (the next at 730), a retry at
        // 500 ms (the next at 1.5 s), a prune at 10 s, a probe at 2 s.
        let mut schedule = Schedule::new(start, SECOND, 256 << 20);
        schedule.committed(start + ms(490), start + ms(495), false);
        schedule.trimmed(start + ms(480));
        schedule.retried(start + ms(500), true);
        // Two more with the commit far: a probe at 2,010 ms and a trim at 2,150; a retry at
        // 2,500 ms and a trim at 2,540.
        let mut far = Schedule::new(start, 60 * SECOND, 256 << 20);
        far.probed(start + ms(10));
        far.retried(start + ms(1_500), true);
        far.trimmed(start + ms(1_900));
        let mut retrying = Schedule::new(start, 60 * SECOND, 256 << 20);
        retrying.retried(start + ms(1_500), true);
        retrying.trimmed(start + ms(2_290));
        for (schedule, at, facts, expected, why) in [
            (&schedule, 500, quiet, 230, "the trim"),
            (&schedule, 800, quiet, 0, "the trim is late"),
            (
                &schedule,
                505,
                processed(8 << 20),
                10,
                "20 ms after the last commit",
            ),
            (&schedule, 520, processed(8 << 20), 0, "early commit due"),
            (
                &schedule,
                540,
                waiting(0),
                55,
                "100 ms after the last commit",
            ),
            (
                &schedule,
                540,
                waiting(1),
                55,
                "too little to bring it forward",
            ),
            (
                &schedule,
                540,
                troubled,
                190,
                "a probe is 2 s apart: the trim",
            ),
            (&schedule, 540, assigned, 0, "a new assignment prunes"),
            (&schedule, 540, damaged, 0, "damage is retried at once"),
            (&far, 1_990, troubled, 20, "the probe"),
            (&far, 1_990, quiet, 160, "the trim"),
            (&retrying, 2_300, quiet, 200, "the retry"),
        ] {
            let now = start + ms(at);
            let until = schedule.until_due(now, facts);
            assert_eq!(until, ms(expected), "{why}: {facts:?} at {at} ms");
            assert_ne!(schedule.due(now + until, facts), Due::default(), "{why}");
            if !until.is_zero() {
                assert_eq!(
                    schedule.due(now + until - ms(1), facts),
                    Due::default(),
                    "{why}: nothing due before"
                );
            }
        }
        // An interval of zero commits every 20 ms, not in a loop.
        let zero = Schedule::new(start, Duration::ZERO, 256 << 20);
        assert_eq!(zero.until_due(start, quiet), MIN_COMMIT_SPACING);
    }

    #[test]
    fn the_schedule_follows_what_was_done() {
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut schedule = Schedule::new(start, SECOND, 256 << 20);
        let quiet = Facts::default();
        assert_eq!(
            schedule.due(start, quiet),
            Due::default(),
            "nothing at once"
        );

        let due = schedule.due(at(1), quiet);
        assert!(due.commit && due.retry && due.trim && !due.prune && !due.probe);
        schedule.trimmed(at(1));
        assert!(!schedule.due(at(1) + TRIM_EVERY / 2, quiet).trim);
        assert!(schedule.due(at(1) + TRIM_EVERY, quiet).trim, "every 250 ms");
        schedule.committed(at(1), at(1), false);
        assert!(!schedule.due(at(1), quiet).commit);

        // A new assignment prunes at once; then every 10 s.
        let assigned = Facts {
            assignments: 1,
            ..quiet
        };
        assert!(schedule.due(at(1), assigned).prune);
        schedule.pruned(at(1), 1);
        assert!(!schedule.due(at(10), assigned).prune);
        assert!(schedule.due(at(11), assigned).prune);

        // Brokers that do not answer are probed every 2 s.
        let troubled = Facts {
            troubled: true,
            ..quiet
        };
        assert!(schedule.due(at(2), troubled).probe);
        schedule.probed(at(2));
        assert!(!schedule.due(at(3), troubled).probe);
        assert!(schedule.due(at(4), troubled).probe);
    }

    #[test]
    fn no_commit_is_due_while_one_is_under_way() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let mut schedule = Schedule::new(start, SECOND, 256 << 20);
        // Everything that brings a commit forward: much processed, the reader holding back.
        let pressing = Facts {
            processed: 64 << 20,
            reader_waits: true,
            ..Facts::default()
        };
        schedule.trimmed(start + ms(1_000));
        schedule.retried(start + ms(1_000), true);
        assert!(schedule.due(start + ms(1_000), pressing).commit);
        schedule.commit_started();
        for at in [1_000, 1_500, 5_000] {
            let now = start + ms(at);
            assert!(!schedule.due(now, pressing).commit, "under way at {at} ms");
            // The live thread waits for its other timers only (the commit thread wakes it).
            assert_eq!(
                schedule.until_due(now, pressing),
                schedule.until_due(now, Facts::default()),
                "{at} ms"
            );
        }
        // It ended 30 ms after it began: the next is at least as far apart.
        schedule.committed(start + ms(1_000), start + ms(1_030), true);
        assert!(!schedule.due(start + ms(1_059), pressing).commit);
        assert!(schedule.due(start + ms(1_060), pressing).commit);
    }

    #[test]
    fn retries_back_off_while_they_fail_and_damage_skips_the_wait() {
        let start = Instant::now();
        let mut schedule = Schedule::new(start, SECOND, 256 << 20);
        let quiet = Facts::default();
        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..7 {
            let mut waited = 0;
            while !schedule.due(now, quiet).retry {
                now += SECOND;
                waited += 1;
            }
            waits.push(waited);
            schedule.retried(now, false);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        let damaged = Facts {
            damaged: true,
            ..quiet
        };
        assert!(schedule.due(now, damaged).retry, "damage does not wait");
        schedule.retried(now, true);
        assert!(!schedule.due(now, quiet).retry);
        assert!(
            schedule.due(now + SECOND, quiet).retry,
            "settled: back to 1 s"
        );
    }
}
