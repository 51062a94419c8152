//! What stops the consumer: a condition on the Kafka side it cannot poll past, a fetcher
//! that died, a failed write to the buffer. The public API maps each to its `Error`.

use super::*;

/// A condition on the Kafka side the consumer cannot get past by polling on (the public API
/// maps each to its `Error`, with the same words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Stopped {
    /// A subscribed topic the cluster does not know.
    #[error("topic {0} does not exist")]
    TopicMissing(String),
    /// Authentication or authorization failed.
    #[error("the cluster refused access: {0}")]
    Refused(String),
    /// A batch this build of librdkafka cannot decode.
    #[error(
        "a fetched batch cannot be decoded by this build ({0}): its compression codec is missing or its record format is newer (zstd needs catchup's `zstd` feature, on by default); nothing after it can be read"
    )]
    Undecodable(String),
    /// rdkafka refused the subscription (a malformed pattern, say).
    #[error("configuration: {0}")]
    Subscription(String),
    /// A fetcher thread ended by a panic (a bug): its lane gets no more records.
    #[error(
        "the {fetcher} fetcher stopped unexpectedly ({reason}); nothing processed is lost — close the consumer and start it again"
    )]
    FetcherDied {
        /// Which one.
        fetcher: &'static str,
        /// What happened (the panic's own message is in the log).
        reason: String,
    },
}

impl Stopped {
    /// Whether a new subscription ends it.
    fn cleared_by_subscribing(&self) -> bool {
        matches!(self, Stopped::TopicMissing(_) | Stopped::Subscription(_))
    }
}

/// A write to the buffer failed: the consumer stops fetching (the public API reports it as
/// `Error::BufferFailed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BufferFailure {
    /// The buffer directory.
    pub dir: std::path::PathBuf,
    /// The failed write.
    pub reason: String,
}

/// See [`Shared::stop_on_panic`].
pub(crate) struct StopOnPanic<'a> {
    shared: &'a Shared,
    fetcher: &'static str,
}

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(
                fetcher = self.fetcher,
                "a fetcher thread panicked; the consumer stops"
            );
            self.shared.stop_with(Stopped::FetcherDied {
                fetcher: self.fetcher,
                reason: "it panicked (the message is in the log)".into(),
            });
        }
    }
}

impl Shared {
    /// Records what stopped the consumer (the first one wins), with an event, and wakes the
    /// reader so that `recv` reports it.
    pub fn stop_with(&self, stopped: Stopped) {
        let slot = self.stopped_slot();
        self.record_stop(slot, stopped);
    }

    /// [`stop_with`](Self::stop_with) for what is wrong with subscription `generation` (a
    /// topic missing, the subscription refused): dropped if the application subscribed
    /// again since — the live thread may still be busy with the old one when `subscribe`
    /// returns.
    pub fn stop_for_subscription(&self, generation: u64, stopped: Stopped) {
        let slot = self.stopped_slot();
        // Read under the lock `subscribing` clears the slot under, after its increment.
        if self.subscription.load(Ordering::SeqCst) == generation {
            self.record_stop(slot, stopped);
        }
    }

    /// A new subscription (`subscribe`): its generation. What was wrong with the last one
    /// no longer stops the consumer, from now on.
    pub fn subscribing(&self) -> u64 {
        let generation = self.subscription.fetch_add(1, Ordering::SeqCst) + 1;
        self.resubscribed();
        // A stream waiting out the last subscription's error goes on.
        self.notify.notify_waiters();
        generation
    }

    /// The current subscription's generation ([`subscribing`](Self::subscribing)).
    pub fn subscription(&self) -> u64 {
        self.subscription.load(Ordering::SeqCst)
    }

    pub(super) fn record_stop(&self, mut slot: MutexGuard<'_, Option<Stopped>>, stopped: Stopped) {
        // The first reason wins, except that a dead fetcher replaces what a new subscription
        // clears (a missing topic, a refused subscription): that must not revive a consumer
        // without a fetcher.
        let replaces = slot.as_ref().is_some_and(Stopped::cleared_by_subscribing)
            && matches!(stopped, Stopped::FetcherDied { .. });
        if slot.is_some() && !replaces {
            return;
        }
        // Returned by `recv`, where the application decides what to say: logged here only
        // for whoever debugs.
        tracing::debug!("{stopped}");
        self.emit(Event::Error {
            message: stopped.to_string(),
        });
        *slot = Some(stopped);
        drop(slot);
        self.notify.notify_waiters();
    }

    /// A guard for the body of the `fetcher` thread, to be held as its first local: if the
    /// thread unwinds from a panic (a bug), the consumer stops with
    /// [`Error::FetcherDied`](crate::Error::FetcherDied) rather than leaving the application
    /// waiting in `recv` for records that will never come. Declared inside the body, it runs
    /// before the body's parameters — the thread's Kafka consumer among them — are dropped:
    /// closing a consumer can wait on the brokers.
    pub fn stop_on_panic(&self, fetcher: &'static str) -> StopOnPanic<'_> {
        StopOnPanic {
            shared: self,
            fetcher,
        }
    }

    pub(super) fn stopped_slot(&self) -> MutexGuard<'_, Option<Stopped>> {
        self.stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What was wrong with the last subscription (a missing topic, looked up again if still
    /// missing; a refused subscription) no longer stops the consumer. Access refused stays.
    pub(super) fn resubscribed(&self) {
        let mut slot = self.stopped_slot();
        if slot.as_ref().is_some_and(Stopped::cleared_by_subscribing) {
            *slot = None;
        }
    }

    /// What stopped the consumer on the Kafka side: what a fetcher recorded, else
    /// credentials the brokers refused (any client's).
    pub fn stopped(&self) -> Option<Stopped> {
        self.stopped_slot()
            .clone()
            .or_else(|| self.health.refused().map(Stopped::Refused))
    }

    /// The write failure that stopped the consumer.
    pub fn failure(&self) -> Option<BufferFailure> {
        self.writability.failure().map(|reason| BufferFailure {
            dir: self.buffer.dir().to_path_buf(),
            reason: reason.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn shared(dir: &std::path::Path) -> Shared {
        Shared::for_tests(dir)
    }

    #[test]
    pub(super) fn what_an_old_subscription_reports_is_dropped() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = shared(dir.path());
        let first = shared.subscribing();
        shared.stop_for_subscription(first, Stopped::TopicMissing("orders".into()));
        assert!(matches!(shared.stopped(), Some(Stopped::TopicMissing(_))));
        // The application subscribes again while the live thread still checks the first.
        let second = shared.subscribing();
        assert!(shared.stopped().is_none(), "cleared by subscribing");
        shared.stop_for_subscription(first, Stopped::TopicMissing("orders".into()));
        assert!(shared.stopped().is_none(), "the first subscription's news");
        shared.stop_for_subscription(second, Stopped::Subscription("refused".into()));
        assert!(matches!(shared.stopped(), Some(Stopped::Subscription(_))));
        // Access refused is not the subscription's: subscribing again keeps it.
        let third = shared.subscribing();
        shared.stop_with(Stopped::Refused("denied".into()));
        shared.subscribing();
        shared.stop_for_subscription(third, Stopped::TopicMissing("orders".into()));
        assert!(matches!(shared.stopped(), Some(Stopped::Refused(_))));
    }

    #[test]
    pub(super) fn a_fetcher_that_panics_stops_the_consumer_with_an_error() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let shared = Arc::new(shared(dir.path()));
        let mut events = shared.subscribe_events();
        let body = |shared: Arc<Shared>, fail: bool| {
            std::thread::spawn(move || {
                let _guard = shared.stop_on_panic("catch-up");
                assert!(!fail, "injected failure");
            })
            .join()
        };
        assert!(body(shared.clone(), false).is_ok());
        assert!(
            shared.stopped().is_none(),
            "a body that returns stops nothing"
        );
        // A missing topic is replaced (a new subscription would clear it), and stays so.
        shared.stop_with(Stopped::TopicMissing("orders".into()));
        assert!(body(shared.clone(), true).is_err());
        shared.resubscribed();
        match shared.stopped() {
            Some(Stopped::FetcherDied { fetcher, .. }) => assert_eq!(fetcher, "catch-up"),
            other => panic!("expected FetcherDied, got {other:?}"),
        }
        let messages: Vec<String> = std::iter::from_fn(|| events.try_recv().ok())
            .filter_map(|event| match event {
                Event::Error { message } => Some(message),
                _ => None,
            })
            .collect();
        assert!(
            messages
                .iter()
                .any(|m| m.contains("catch-up fetcher stopped")),
            "the stop is reported as an event too: {messages:?}"
        );
    }

    /// Handing out generations prunes the index once it outgrows the assignment — without
    /// locking the partitions twice (a guard kept to the end of its statement deadlocked the
    /// live thread at the 65th assignment).
    #[test]
    fn generations_are_pruned_without_a_deadlock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = Arc::new(shared(dir.path()));
        let (done, finished) = std::sync::mpsc::channel();
        let worker = shared.clone();
        std::thread::spawn(move || {
            let first = worker.next_generation(&("t".into(), 0));
            for _ in 0..500 {
                worker.next_generation(&("t".into(), 0));
            }
            let _ = done.send(first);
        });
        let first = finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("500 generations handed out within 10 s");
        let generations = shared.generations();
        // Nothing assigned: at most 64 entries and the newest.
        assert!(generations.len() <= 65, "pruned: {}", generations.len());
        assert!(!generations.contains_key(&first), "the first is gone");
    }
}
