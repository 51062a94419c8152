//! Taking a partition queue's messages many at a time (`rd_kafka_consume_batch_queue`).
//!
//! rust-rdkafka's `PartitionQueue::poll` serves one message per call, and each call reads the
//! clock several times (its own deadline, librdkafka's poll bookkeeping): at 100 B a fifth of
//! the catch-up thread's time went to reading the clock. librdkafka's batch call takes a run
//! of messages under one lock and one clock reading. It serves rebalance events itself when
//! the consumer has no rebalance callback, which is why the group member's queue never uses
//! it; a partition's own queue carries only that partition's messages and errors, and the
//! catch-up consumer is in no group.

use std::ffi::{CStr, CString, c_void};

use rdkafka::bindings as rd;
use rdkafka::error::KafkaError as RdError;
use rdkafka::types::RDKafkaRespErr;

use super::ffi::Owned;
use crate::store::{Header, Timestamp};

/// A message taken from a partition's queue (borrowed until the next one is handed out), or
/// one rust-rdkafka polled.
pub(crate) struct RawMessage<'a> {
    message: &'a rd::rd_kafka_message_t,
}

impl<'a> RawMessage<'a> {
    /// A message rust-rdkafka polled, read the same way.
    pub(crate) fn of(message: &'a rdkafka::message::BorrowedMessage<'_>) -> Self {
        // SAFETY: a polled message's pointer is valid (and non-null) while it is borrowed.
        Self {
            message: unsafe { &*message.ptr() },
        }
    }

    /// Its offset.
    pub(crate) fn offset(&self) -> i64 {
        self.message.offset
    }

    /// Its partition.
    pub(crate) fn partition(&self) -> i32 {
        self.message.partition
    }

    /// Its topic's name, as librdkafka holds it.
    pub(crate) fn topic(&self) -> &'a [u8] {
        // SAFETY: a message holds a reference on its topic handle, whose name is a
        // NUL-terminated string living as long as the handle.
        unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(self.message.rkt)) }.to_bytes()
    }

    /// Its key (`None`: a null key).
    pub(crate) fn key(&self) -> Option<&'a [u8]> {
        // SAFETY: librdkafka's key pointer and length describe one allocation the message
        // owns (null for a null key).
        unsafe { slice(self.message.key, self.message.key_len) }
    }

    /// Its value (`None`: a null value, a tombstone).
    pub(crate) fn payload(&self) -> Option<&'a [u8]> {
        // SAFETY: as for the key.
        unsafe { slice(self.message.payload, self.message.len) }
    }

    /// Its timestamp.
    pub(crate) fn timestamp(&self) -> Timestamp {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a live message; `kind` is written once.
        let millis = unsafe { rd::rd_kafka_message_timestamp(self.message, &mut kind) };
        match kind {
            _ if millis == -1 => Timestamp::NotAvailable,
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => {
                Timestamp::CreateTime(millis)
            }
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => {
                Timestamp::LogAppendTime(millis)
            }
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE => {
                Timestamp::NotAvailable
            }
        }
    }

    /// Its headers, copied (a name that is not UTF-8 is read lossily, never refused).
    pub(crate) fn headers(&self) -> Vec<Header> {
        let mut headers_ptr = std::ptr::null_mut();
        // SAFETY: a live message; librdkafka parses its headers once and keeps them with it.
        let found = unsafe {
            rd::rd_kafka_message_headers(self.message, &mut headers_ptr)
                == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        };
        let mut headers = Vec::new();
        if !found || headers_ptr.is_null() {
            return headers;
        }
        for index in 0.. {
            let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0);
            // SAFETY: `headers_ptr` belongs to the live message; the out-pointers are written
            // on success and point into the headers, which outlive this loop.
            let header = unsafe {
                if rd::rd_kafka_header_get_all(headers_ptr, index, &mut name, &mut value, &mut size)
                    != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
                {
                    break;
                }
                Header {
                    key: CStr::from_ptr(name).to_string_lossy().into_owned(),
                    value: slice(value, size).map(<[u8]>::to_vec),
                }
            };
            headers.push(header);
        }
        headers
    }
}

/// A slice over librdkafka's pointer and length (`None` for a null pointer).
///
/// # Safety
/// A non-null `ptr` points to `len` readable bytes that live for `'a`.
unsafe fn slice<'a>(ptr: *const c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY: as the caller promises.
    (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
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

    /// Takes up to `max` waiting messages without waiting and hands each, in order, to
    /// `each`: the message, or the error librdkafka queued in its place (rust-rdkafka's
    /// forms: `PartitionEOF`, else `MessageConsumption`). Each is freed once handed out.
    /// Returns how many were taken.
    pub(crate) fn take(
        &self,
        max: usize,
        mut each: impl FnMut(Result<RawMessage<'_>, RdError>),
    ) -> usize {
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
            if message.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                each(Ok(RawMessage { message }));
            } else if message.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF {
                each(Err(RdError::PartitionEOF(message.partition)));
            } else {
                each(Err(RdError::MessageConsumption(message.err.into())));
            }
        }
        count
    }
}
