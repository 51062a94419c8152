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

use super::RawMessage;
use super::ffi::Owned;

/// What one entry of a run is.
pub(crate) enum Taken<'a> {
    /// A message (borrowed until the next entry is handed out).
    Message(RawMessage<'a>),
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
    /// `each`; each is freed once handed out. Returns how many were taken.
    pub(crate) fn take(&self, max: usize, mut each: impl FnMut(Taken<'_>)) -> usize {
        let mut taken: Vec<*mut rd::rd_kafka_message_t> = Vec::with_capacity(max);
        // SAFETY: the queue is alive; `taken` has room for `max` pointers, and librdkafka
        // writes at most that many and says how many.
        let count =
            unsafe { rd::rd_kafka_consume_batch_queue(self.queue.ptr, 0, taken.as_mut_ptr(), max) };
        let Ok(count) = usize::try_from(count) else {
            return 0;
        };
        // SAFETY: librdkafka wrote `count` (at most `max`) message pointers.
        unsafe { taken.set_len(count.min(max)) };
        for ptr in taken {
            let owned = Owned {
                ptr,
                free: rd::rd_kafka_message_destroy,
            };
            // SAFETY: a message librdkafka handed over, alive until `owned` drops below.
            let message = unsafe { &*owned.ptr };
            let error = match message.err {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => {
                    each(Taken::Message(RawMessage::from_raw(message)));
                    continue;
                }
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
