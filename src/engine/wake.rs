//! The reader's word to a fetcher thread, which otherwise would learn only by looking again
//! and again:
//!
//! * (the catch-up fetcher) it took catch-up records: the fetcher leaves a partition's queue
//!   untaken while the reader has not taken what the lane read ahead, where the queue is the
//!   partition's alone (`kafka::budget`; a shared one's partition is paused), and a queue left
//!   alone raises no callback;
//! * (the live thread) a commit is wanted sooner than its timers say: with no live records to
//!   fetch (a split's live lane at the log end) the group member waits for messages up to
//!   50 ms at a time and looks at its commit schedule only between. A reader processing a
//!   backlog at hundreds of MB/s crossed the early commit's mark
//!   (`fetch::schedule::early_commit_bytes`) and then its hold for commits
//!   (`plan::reader_waits_for_commits`) while the live thread slept: `catchup run` at 1 KiB
//!   sat held for a commit a third of the time.
//!
//! The fetcher registers a callback raising the flag it waits on (`kafka::wakeup`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a fetcher holds a lane to its read-ahead, and how to wake it.
#[derive(Default)]
pub(crate) struct FetcherWake {
    /// Set by the fetcher after each round: some partition is held to its read-ahead.
    holding: AtomicBool,
    /// Wakes the fetcher (registered once, by the fetcher).
    wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for FetcherWake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetcherWake")
            .field("holding", &self.holding.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl FetcherWake {
    /// Registers how to wake the fetcher (a second registration is ignored).
    pub fn wake_with(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.wake.set(Box::new(wake));
    }

    /// The fetcher says whether it holds a partition to its read-ahead.
    pub fn set_holding(&self, holding: bool) {
        self.holding.store(holding, Ordering::Relaxed);
    }

    /// The reader took records of the fetcher's lane: wakes the fetcher if it holds one.
    /// (Taken just before the fetcher says it holds, the word is missed: the fetcher looks
    /// again after a short wait by itself.)
    pub fn taken(&self) {
        if self.holding.load(Ordering::Relaxed) {
            self.wake();
        }
    }

    /// Wakes the fetcher now, whatever it holds.
    pub fn wake(&self) {
        if let Some(wake) = self.wake.get() {
            wake();
        }
    }
}

/// Whether adding `added` bytes to `before` processed since the last commit crosses `mark`
/// (the early commit's; a mark of 0 is crossed by the first byte): the reader wakes the live
/// thread once per crossing, not per ack.
pub(crate) fn crosses(before: u64, added: u64, mark: u64) -> bool {
    let mark = mark.max(1);
    added > 0 && before < mark && before.saturating_add(added) >= mark
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn wakes_the_fetcher_only_while_it_holds_unless_asked_outright() {
        let fetcher = FetcherWake::default();
        fetcher.taken(); // nothing registered, nothing held: nothing happens
        fetcher.wake();
        let woken = Arc::new(AtomicUsize::new(0));
        let counter = woken.clone();
        fetcher.wake_with(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        fetcher.taken();
        assert_eq!(woken.load(Ordering::Relaxed), 0, "not holding");
        fetcher.set_holding(true);
        fetcher.taken();
        assert_eq!(woken.load(Ordering::Relaxed), 1);
        fetcher.set_holding(false);
        fetcher.taken();
        assert_eq!(woken.load(Ordering::Relaxed), 1, "released");
        fetcher.wake();
        assert_eq!(woken.load(Ordering::Relaxed), 2, "woken outright");
    }

    #[test]
    fn the_mark_is_crossed_once() {
        for (before, added, mark, crossed) in [
            (0, 10, 100, false),
            (90, 10, 100, true), // reaches it
            (90, 50, 100, true), // goes past it
            (100, 10, 100, false),
            (150, 10, 100, false),
            (90, 0, 100, false),
            // A budget under 32 bytes: every first byte processed brings a commit forward.
            (0, 1, 0, true),
            (1, 1, 0, false),
        ] {
            assert_eq!(
                crosses(before, added, mark),
                crossed,
                "{before} + {added} against {mark}"
            );
        }
    }
}
