//! Taking a fetch queue's messages many at a time (`rd_kafka_consume_batch_queue`), and the
//! handles that forward partitions' queues to it.
//!
//! rust-rdkafka's `PartitionQueue::poll` serves one message per call, and each call reads the
//! clock several times (its own deadline, librdkafka's poll bookkeeping): at 100 B a fifth of
//! the catch-up thread's time went to reading the clock. librdkafka's batch call takes a run
//! of messages under one lock and one clock reading. It serves rebalance events itself when
//! the consumer has no rebalance callback, which is why the group member's queue never uses
//! it; a queue of catchup's that partitions are forwarded to carries only those partitions'
//! messages and errors (librdkafka queues its fetch errors there as consumer errors, handed
//! out like messages), and the catch-up consumer is in no group.
//!
//! One difference matters: the batch call moves the application position one past the
//! offset of everything it hands out, an end of partition or an error included (librdkafka
//! issue 4844; the bundled 2.12 has it). So an error is handed on with the offset it names,
//! and the lane trusts the position only up to it (`fetch::Polled::from_error`).

use std::ffi::{CStr, CString};

use rdkafka::bindings as rd;
use rdkafka::error::KafkaError as RdError;
use rdkafka::types::RDKafkaRespErr;

use super::arena::copy_entries;
use super::ffi::Owned;
use super::{RawMessage, record_of};
use crate::store::Record;

/// What one entry of a run is.
pub(crate) enum Taken {
    /// A message, as the buffer keeps it.
    Record(Record),
    /// An error librdkafka queued in a message's place (rust-rdkafka's forms:
    /// `PartitionEOF`, else `MessageConsumption`), naming the offset the fetch stood at.
    Error {
        /// The error.
        error: RdError,
        /// The offset it names, which the batch call moves the position one past.
        at: i64,
    },
}

/// A handle on the queue of `topic`/`partition` of `rk`; `None` when librdkafka has none.
///
/// # Safety
/// `rk` is a live consumer handle that outlives the returned value.
unsafe fn partition_queue(
    rk: *mut rd::rd_kafka_t,
    topic: &str,
    partition: i32,
) -> Option<Owned<rd::rd_kafka_queue_t>> {
    let topic = CString::new(topic).ok()?;
    // SAFETY: a live handle, as the caller promises; the queue reference is released when
    // the returned value drops.
    let queue = Owned {
        ptr: unsafe { rd::rd_kafka_queue_get_partition(rk, topic.as_ptr(), partition) },
        free: rd::rd_kafka_queue_destroy,
    };
    (!queue.ptr.is_null()).then_some(queue)
}

/// The partition an entry of a run was fetched for.
#[derive(Clone, Copy)]
pub(crate) struct Origin<'a> {
    /// Its topic's name, as librdkafka keeps it.
    pub(crate) topic: &'a [u8],
    /// Its partition.
    pub(crate) partition: i32,
}

impl Origin<'_> {
    /// Whether it is `key`'s partition.
    pub(crate) fn is(&self, key: &(String, i32)) -> bool {
        key.1 == self.partition && key.0.as_bytes() == self.topic
    }

    /// Its partition's name as the buffer keys it.
    pub(crate) fn key(&self) -> (String, i32) {
        (
            String::from_utf8_lossy(self.topic).into_owned(),
            self.partition,
        )
    }
}

/// Takes up to `max` waiting entries of `queue` without waiting and hands each, in order, to
/// `each` with the partition it came from (`None`: it names none). Returns how many were
/// taken.
///
/// # Safety
/// `queue` is a live queue handle.
unsafe fn take_from(
    queue: *mut rd::rd_kafka_queue_t,
    max: usize,
    mut each: impl FnMut(Option<Origin<'_>>, Taken),
) -> usize {
    let mut batch = Batch(Vec::with_capacity(max));
    // SAFETY: the queue is alive, as the caller promises; the vector has room for `max`
    // pointers, and librdkafka writes at most that many and says how many.
    let count = unsafe { rd::rd_kafka_consume_batch_queue(queue, 0, batch.0.as_mut_ptr(), max) };
    let Ok(count) = usize::try_from(count) else {
        return 0;
    };
    // SAFETY: librdkafka wrote `count` (at most `max`) message pointers, which `batch`
    // now frees.
    unsafe { batch.0.set_len(count.min(max)) };
    let messages: Vec<_> = batch.messages().collect();
    // The run's keys and values are copied together, into chunks of their own.
    let copies = copy_entries(&messages, |message| {
        (message.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| {
            let message = RawMessage::from_raw(message);
            [message.key(), message.payload()]
        })
    });
    for (message, copied) in messages.into_iter().zip(copies) {
        // An entry without a topic handle (librdkafka gives every fetch entry one) names no
        // partition: `None`.
        let origin = (!message.rkt.is_null()).then(|| Origin {
            // SAFETY: a message holds a reference on its topic handle, whose name is a
            // NUL-terminated string that lives as long as the handle.
            topic: unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(message.rkt)) }.to_bytes(),
            partition: message.partition,
        });
        if let Some([key, payload]) = copied {
            let record = record_of(&RawMessage::from_raw(message), key, payload);
            each(origin, Taken::Record(record));
            continue;
        }
        let error = match message.err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                RdError::PartitionEOF(message.partition)
            }
            err => RdError::MessageConsumption(err.into()),
        };
        each(
            origin,
            Taken::Error {
                error,
                at: message.offset,
            },
        );
    }
    count
}

/// The messages one batch call handed over, freed together.
struct Batch(Vec<*mut rd::rd_kafka_message_t>);

impl Batch {
    fn messages(&self) -> impl Iterator<Item = &rd::rd_kafka_message_t> {
        // SAFETY: messages librdkafka handed over, alive until the batch drops.
        self.0.iter().map(|&ptr| unsafe { &*ptr })
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        for &ptr in &self.0 {
            // SAFETY: each message was handed over once and is freed once, here.
            unsafe { rd::rd_kafka_message_destroy(ptr) };
        }
    }
}

/// The callback a fetch queue calls when something arrives while it is empty. Boxed twice:
/// librdkafka keeps a thin pointer to it.
type WakeCallback = Box<Box<dyn Fn() + Send + Sync>>;

/// A queue of catchup's own that some of a consumer's partitions fetch into instead of the
/// consumer queue (`kafka::fetch_queues`), taken in runs, and calling `wake` when something
/// arrives while it is empty.
///
/// librdkafka bounds what a partition prefetches by what the queue it fetches into holds
/// (`queued.max.messages.kbytes`, `queued.min.messages`, fixed when the consumer is created).
/// A queue of its own for every partition multiplied that bound by the partition count (at 64
/// partitions, `off` peaked at 438–589 MiB); partitions forwarded several to a queue share
/// it, and a fixed number of queues bounds the whole prefetch.
///
/// Partitions are forwarded to it through a [`ForwardedPartition`].
pub(crate) struct FetchQueue(WakingQueue);

impl FetchQueue {
    /// A new queue on the consumer `rk`; `None` when librdkafka cannot make one.
    ///
    /// # Safety
    /// `rk` is a live consumer handle that outlives the returned value.
    pub(crate) unsafe fn new(
        rk: *mut rd::rd_kafka_t,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Option<Self> {
        // SAFETY: a live handle, as the caller promises.
        let queue = unsafe { super::ffi::queue(rk) }.ok()?;
        Some(Self(WakingQueue::new(queue, wake)))
    }

    /// The entries waiting in the queue.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the queue is alive.
        unsafe { rd::rd_kafka_queue_length(self.0.queue.ptr) }
    }

    /// Takes up to `max` waiting entries without waiting and hands each, in order, to `each`
    /// with the partition it was fetched for (`None`: it names none). Returns how many were
    /// taken.
    pub(crate) fn take(&self, max: usize, each: impl FnMut(Option<Origin<'_>>, Taken)) -> usize {
        // SAFETY: the queue is alive while `self` is.
        unsafe { take_from(self.0.queue.ptr, max, each) }
    }
}

/// A handle on one partition's queue, forwarded to a [`FetchQueue`], and calling `wake` when
/// something arrives in it while it is empty and not forwarded.
///
/// Forwarded before the partition is assigned, its fetched messages never reach the consumer
/// queue: librdkafka forwards a partition's queue to the consumer queue when its fetch starts
/// only if the application never forwarded it (`RD_KAFKA_Q_F_FWD_APP`, which a forward sets
/// and nothing clears while the partition object lives). Forwarded after its fetch started,
/// messages already on their way to the consumer queue would arrive there after later ones
/// were taken from the fetch queue — which is why the group member forwards in its rebalance
/// callback, and the catch-up fetcher before it assigns.
///
/// But every stop of the partition's fetch removes the forward itself (an unassign, and an
/// assignment the member makes again outside a rebalance to move a partition whose position went
/// out of range, or the catch-up fetcher makes to move one), and the start after it, seeing the
/// flag, does not forward to the consumer queue either: the messages then wait in the partition's
/// own queue. So both forward again before each round ([`ForwardedPartition::forward_to`] moves
/// what waits to the fetch queue's end, in order), and this handle's callback wakes it for what
/// arrives meanwhile.
///
/// The callback belongs to the partition's queue (librdkafka has one per partition): a newer
/// handle on it is made after this one is dropped, or this drop would switch the newer one's
/// callback off.
pub(crate) struct ForwardedPartition(WakingQueue);

impl ForwardedPartition {
    /// A handle on the queue of `topic`/`partition` of the consumer `rk`, calling `wake`;
    /// `None` when librdkafka has no queue for it.
    ///
    /// # Safety
    /// `rk` is a live consumer handle that outlives the returned value.
    pub(crate) unsafe fn new(
        rk: *mut rd::rd_kafka_t,
        topic: &str,
        partition: i32,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Option<Self> {
        // SAFETY: a live handle, as the caller promises.
        let queue = unsafe { partition_queue(rk, topic, partition) }?;
        Some(Self(WakingQueue::new(queue, wake)))
    }

    /// Forwards the partition's queue to `target` (again: nothing but a lock when it is
    /// forwarded there already); what waits in it moves to `target`'s end, in order.
    pub(crate) fn forward_to(&self, target: &FetchQueue) {
        // SAFETY: both queues are alive; the forward holds a reference on `target`'s queue.
        unsafe { rd::rd_kafka_queue_forward(self.0.queue.ptr, target.0.queue.ptr) };
    }
}

/// A queue handle that calls `wake` when something arrives in the queue while it is empty,
/// until the handle is dropped.
struct WakingQueue {
    queue: Owned<rd::rd_kafka_queue_t>,
    /// Held for librdkafka, which calls it through a pointer until the handle is dropped.
    _wake: WakeCallback,
}

// SAFETY: the queue is librdkafka's (thread-safe) and the callback is `Send + Sync`.
unsafe impl Send for WakingQueue {}

impl WakingQueue {
    /// `queue`, calling `wake` from now on.
    fn new(queue: Owned<rd::rd_kafka_queue_t>, wake: impl Fn() + Send + Sync + 'static) -> Self {
        let wake: WakeCallback = Box::new(Box::new(wake));
        // SAFETY: the queue is alive; `wake` lives in the returned value, whose drop switches
        // the callback off before it frees it.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(
                queue.ptr,
                Some(call_wake),
                &*wake as *const Box<dyn Fn() + Send + Sync> as *mut std::ffi::c_void,
            );
        }
        Self { queue, _wake: wake }
    }
}

impl Drop for WakingQueue {
    fn drop(&mut self) {
        // SAFETY: the queue is alive (freed after this, with `queue`). librdkafka calls the
        // callback under the queue's lock, which switching it off takes: once this returns,
        // `wake` is no longer called.
        unsafe { rd::rd_kafka_queue_cb_event_enable(self.queue.ptr, None, std::ptr::null_mut()) };
    }
}

/// librdkafka's side of [`WakingQueue`]'s callback.
unsafe extern "C" fn call_wake(_: *mut rd::rd_kafka_t, opaque: *mut std::ffi::c_void) {
    // SAFETY: `opaque` is the `Box<dyn Fn>` a live `WakingQueue` holds (its drop switches the
    // callback off first).
    let wake = unsafe { &*(opaque as *const Box<dyn Fn() + Send + Sync>) };
    wake();
}
