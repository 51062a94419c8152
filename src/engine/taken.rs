//! The reader's word to the catch-up fetcher that it took catch-up records. The fetcher
//! leaves a partition's queue unpolled while the reader has not taken what the lane read
//! ahead (`kafka::budget`); a queue left alone raises no callback, so without a word the
//! fetcher would only learn that the reader moved on by looking again and again.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the catch-up fetcher holds a queue, and how to wake it.
#[derive(Default)]
pub(crate) struct CatchupTaken {
    /// Set by the fetcher after each round: some partition's queue is left unpolled.
    holding: AtomicBool,
    /// Wakes the fetcher (registered once, by the fetcher).
    wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for CatchupTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatchupTaken")
            .field("holding", &self.holding.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl CatchupTaken {
    /// Registers how to wake the fetcher (a second registration is ignored).
    pub fn wake_with(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.wake.set(Box::new(wake));
    }

    /// The fetcher says whether it leaves a queue unpolled.
    pub fn set_holding(&self, holding: bool) {
        self.holding.store(holding, Ordering::Relaxed);
    }

    /// The reader took catch-up records: wakes the fetcher if it holds a queue. (Taken just
    /// before the fetcher says it holds, the word is missed: the fetcher looks again after a
    /// short wait by itself.)
    pub fn taken(&self) {
        if self.holding.load(Ordering::Relaxed) {
            if let Some(wake) = self.wake.get() {
                wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn wakes_the_fetcher_only_while_it_holds() {
        let taken = CatchupTaken::default();
        taken.taken(); // nothing registered, nothing held: nothing happens
        let woken = Arc::new(AtomicUsize::new(0));
        let counter = woken.clone();
        taken.wake_with(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        taken.taken();
        assert_eq!(woken.load(Ordering::Relaxed), 0, "not holding");
        taken.set_holding(true);
        taken.taken();
        assert_eq!(woken.load(Ordering::Relaxed), 1);
        taken.set_holding(false);
        taken.taken();
        assert_eq!(woken.load(Ordering::Relaxed), 1, "released");
    }
}
