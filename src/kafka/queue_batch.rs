//! Taking a partition queue's messages many at a time (`rd_kafka_consume_batch_queue`).
//!
//! rust-rdkafka's `PartitionQueue::poll` serves one message per call, and each call reads the
//! clock several times (its own deadline, librdkafka's poll bookkeeping): at 100 B a fifth of
//! the catch-up thread's time went to reading the clock. librdkafka's batch call takes a run
//! of messages under one lock and one clock reading. It serves rebalance events itself when
//! the consumer has no rebalance callback, which is why the group member's queue never uses
//! it; a partition's own queue carries only that partition's messages and errors (librdkafka
//! queues its fetch errors there as consumer errors, handed out like messages), and the
//! catch-up consumer is in no group.
//!
//! One difference matters: the batch call moves the application position one past the
//! offset of everything it hands out, an end of partition or an error included (librdkafka
//! issue 4844; the bundled 2.12 has it). So an error is handed on with the offset it names,
//! and the lane trusts the position only up to it (`fetch::Polled::from_error`).

use std::ffi::CString;

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

/// A second handle on one partition's own queue, for librdkafka's batch call.
pub(crate) struct PartitionBatches {
    queue: Owned<rd::rd_kafka_queue_t>,
}

// SAFETY: librdkafka's queues are thread-safe (a queue handle may be used from any thread).
unsafe impl Send for PartitionBatches {}

impl PartitionBatches {
    /// The queue of `topic`/`partition` of the consumer `rk`.
    ///
    /// # Safety
    /// `rk` is a live consumer handle whose partition queue was split off (its forwarding to
    /// the consumer queue removed), and it outlives the returned value.
    pub(crate) unsafe fn new(rk: *mut rd::rd_kafka_t, topic: &str, partition: i32) -> Option<Self> {
        let topic = CString::new(topic).ok()?;
        // SAFETY: a live handle, as the caller promises; the queue reference is released
        // when `queue` drops.
        let queue = Owned {
            ptr: unsafe { rd::rd_kafka_queue_get_partition(rk, topic.as_ptr(), partition) },
            free: rd::rd_kafka_queue_destroy,
        };
        (!queue.ptr.is_null()).then_some(Self { queue })
    }

    /// Takes up to `max` waiting entries without waiting and hands each, in order, to
    /// `each`. Returns how many were taken.
    pub(crate) fn take(&self, max: usize, mut each: impl FnMut(Taken)) -> usize {
        let mut batch = Batch(Vec::with_capacity(max));
        // SAFETY: the queue is alive; the vector has room for `max` pointers, and librdkafka
        // writes at most that many and says how many.
        let count = unsafe {
            rd::rd_kafka_consume_batch_queue(self.queue.ptr, 0, batch.0.as_mut_ptr(), max)
        };
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
            if let Some([key, payload]) = copied {
                let record = record_of(&RawMessage::from_raw(message), key, payload);
                each(Taken::Record(record));
                continue;
            }
            let error = match message.err {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                    RdError::PartitionEOF(message.partition)
                }
                err => RdError::MessageConsumption(err.into()),
            };
            each(Taken::Error {
                error,
                at: message.offset,
            });
        }
        count
    }
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

/// The callback a split queue calls when something arrives while it is empty. Boxed twice:
/// librdkafka keeps a thin pointer to it.
type WakeCallback = Box<Box<dyn Fn() + Send + Sync>>;

/// A partition's queue split off the consumer queue by catchup itself (where rust-rdkafka's
/// `split_partition_queue` needs the consumer in an `Arc`, which the group member's rebalance
/// callback does not have), taken in runs, and calling `wake` when something arrives.
///
/// Split before the partition is assigned, its fetched messages never reach the consumer
/// queue: librdkafka forwards a partition's queue to the consumer queue when its fetch starts
/// only if the application never forwarded it (`RD_KAFKA_Q_F_FWD_APP`, which a split sets and
/// nothing clears while the partition object lives). Split after its fetch started, messages
/// already on their way to the consumer queue would arrive there after later ones were taken
/// here — which is why the group member splits in its rebalance callback, before it assigns.
pub(crate) struct SplitQueue {
    batches: PartitionBatches,
    /// Held for librdkafka, which calls it through a pointer until the queue is dropped.
    _wake: WakeCallback,
}

// SAFETY: the queue is librdkafka's (thread-safe) and the callback is `Send + Sync`.
unsafe impl Send for SplitQueue {}

impl SplitQueue {
    /// Splits the queue of `topic`/`partition` off the consumer queue of `rk`; `None` when
    /// librdkafka has no queue for it (its messages then stay on the consumer queue).
    ///
    /// # Safety
    /// `rk` is a live consumer handle that outlives the returned value.
    pub(crate) unsafe fn split(
        rk: *mut rd::rd_kafka_t,
        topic: &str,
        partition: i32,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Option<Self> {
        // SAFETY: a live handle, as the caller promises.
        let batches = unsafe { PartitionBatches::new(rk, topic, partition) }?;
        let wake: WakeCallback = Box::new(Box::new(wake));
        // SAFETY: the queue is alive; `wake` lives in the returned value, whose drop switches
        // the callback off before it frees it.
        unsafe {
            rd::rd_kafka_queue_forward(batches.queue.ptr, std::ptr::null_mut());
            rd::rd_kafka_queue_cb_event_enable(
                batches.queue.ptr,
                Some(call_wake),
                &*wake as *const Box<dyn Fn() + Send + Sync> as *mut std::ffi::c_void,
            );
        }
        Some(Self {
            batches,
            _wake: wake,
        })
    }

    /// The entries waiting in the queue.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the queue is alive.
        unsafe { rd::rd_kafka_queue_length(self.batches.queue.ptr) }
    }

    /// See [`PartitionBatches::take`].
    pub(crate) fn take(&self, max: usize, each: impl FnMut(Taken)) -> usize {
        self.batches.take(max, each)
    }
}

impl Drop for SplitQueue {
    fn drop(&mut self) {
        // SAFETY: the queue is alive (freed after this, with `batches`). librdkafka calls the
        // callback under the queue's lock, which switching it off takes: once this returns,
        // `wake` is no longer called.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.batches.queue.ptr, None, std::ptr::null_mut())
        };
    }
}

/// librdkafka's side of [`SplitQueue`]'s callback.
unsafe extern "C" fn call_wake(_: *mut rd::rd_kafka_t, opaque: *mut std::ffi::c_void) {
    // SAFETY: `opaque` is the `Box<dyn Fn>` a live `SplitQueue` holds (its drop switches the
    // callback off first).
    let wake = unsafe { &*(opaque as *const Box<dyn Fn() + Send + Sync>) };
    wake();
}
