//! The reader's word to the live thread that a commit is wanted sooner than its timers say.
//!
//! With no live records to fetch (a split whose live lane is at the log end, say) the group
//! member waits for messages up to 50 ms at a time, and looks at its commit schedule only
//! between those waits. A reader processing a backlog at hundreds of MB/s crossed the early
//! commit's mark (`fetch::schedule::early_commit_bytes`) and then its hold for commits
//! (`plan::reader_waits_for_commits`) while the live thread slept: `catchup run` at 1 KiB sat
//! held for a commit a third of the time. The reader now wakes it at those two moments: the
//! live thread waits on a flag that its consumer's queue raises when a message or an event
//! arrives, and that the reader raises too.

use std::sync::OnceLock;

/// How to wake the live thread.
#[derive(Default)]
pub(crate) struct LiveWake {
    /// Registered once, by the live thread.
    wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for LiveWake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveWake").finish_non_exhaustive()
    }
}

impl LiveWake {
    /// Registers how to wake the live thread (a second registration is ignored).
    pub fn wake_with(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.wake.set(Box::new(wake));
    }

    /// Ends the live thread's current wait for messages (or its next one).
    pub fn wake(&self) {
        if let Some(wake) = self.wake.get() {
            wake();
        }
    }
}

/// Whether adding `added` bytes to `before` processed since the last commit crosses `mark`
/// (the early commit's): the reader wakes the live thread once per crossing, not per ack.
pub(crate) fn crosses(before: u64, added: u64, mark: u64) -> bool {
    added > 0 && before < mark.max(1) && before.saturating_add(added) >= mark.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn wakes_once_registered() {
        let wake = LiveWake::default();
        wake.wake(); // nothing registered: nothing happens
        let woken = Arc::new(AtomicUsize::new(0));
        let counter = woken.clone();
        wake.wake_with(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        wake.wake();
        wake.wake();
        assert_eq!(woken.load(Ordering::Relaxed), 2);
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
