//! Wakes a fetcher thread when one of its consumer's queues receives something, or its reader
//! has word for it (`engine::FetcherWake`).
//!
//! The catch-up fetcher takes every fetch queue without waiting, then waits when all were empty. It
//! used to wait on the consumer's main queue, which a partition's records never reach (they go to
//! the fetch queues, `kafka::fetch_queues`), so a fetcher that had drained its queues slept its
//! whole wait while records arrived: a third of the machine stood idle, and a split read 500–600k
//! records/s where a bare loop read 1.8M. librdkafka calls a queue's callback when something is put
//! on it while empty; each queue's callback raises one flag here.
//!
//! The group member's thread waits the same way on its one consumer queue (messages,
//! rebalances, errors), no longer than its next timer; its reader raises the flag when a
//! commit is wanted sooner. (It used to wait inside rust-rdkafka's `poll`, which no word from
//! another thread can end: it loops until its timeout even when librdkafka's queue is woken.)

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

/// A flag raised by the queues' callbacks, and waited for by the fetcher.
#[derive(Clone, Default)]
pub(super) struct Wakeup {
    raised: Arc<(Mutex<bool>, Condvar)>,
}

impl Wakeup {
    /// The callback to give a queue: raises the flag. It runs on librdkafka's threads and
    /// calls nothing of librdkafka's.
    pub fn callback(&self) -> impl Fn() + Send + Sync + 'static {
        let raised = self.raised.clone();
        move || {
            let (flag, condvar) = &*raised;
            *flag.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = true;
            condvar.notify_one();
        }
    }

    /// Waits until the flag is raised or `timeout` passes, and lowers it. A flag raised
    /// since the last wait (while the fetcher was polling) returns at once: at worst one
    /// round too many. (A queue raises it only when something arrives while it is empty: the
    /// fetcher does not wait while its main queue still holds events.)
    pub fn wait(&self, timeout: Duration) {
        let (flag, condvar) = &*self.raised;
        let raised = flag.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (mut raised, _) = condvar
            .wait_timeout_while(raised, timeout, |raised| !*raised)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *raised = false;
    }

    /// Waits as [`wait`](Self::wait) does, unless something waits in `consumer`'s queue
    /// already (its callback fires only when it was empty: a round that served one event of
    /// several leaves the rest there) or `timeout` is zero.
    pub fn wait_unless_queued<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        timeout: Duration,
    ) {
        // SAFETY: the consumer is alive (borrowed for the call).
        let queued = unsafe { super::ffi::consumer_queue_length(consumer.client().native_ptr()) };
        if queued == 0 && !timeout.is_zero() {
            self.wait(timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_raise_before_the_wait_is_not_lost() {
        let wakeup = Wakeup::default();
        (wakeup.callback())();
        let started = Instant::now();
        wakeup.wait(Duration::from_secs(10));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_raise_from_another_thread_ends_the_wait_and_is_used_up() {
        let wakeup = Wakeup::default();
        let callback = wakeup.callback();
        let raiser = std::thread::spawn(callback);
        let started = Instant::now();
        wakeup.wait(Duration::from_secs(10));
        assert!(started.elapsed() < Duration::from_secs(5));
        raiser.join().unwrap();
        // Lowered: the next wait lasts its timeout.
        let started = Instant::now();
        wakeup.wait(Duration::from_millis(50));
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
