//! Reading a fetched message's fields from librdkafka directly: rust-rdkafka's header
//! reader panics on a header name that is not UTF-8 (Kafka's format allows any bytes), and
//! one such record would kill the fetcher that read it, on every restart.

use std::ffi::{CStr, c_void};

use rdkafka::bindings as rd;
use rdkafka::types::RDKafkaRespErr;

use crate::store::{Header, Timestamp};

/// A message rust-rdkafka polled or librdkafka handed out, read field by field.
pub(crate) struct RawMessage<'a> {
    message: &'a rd::rd_kafka_message_t,
}

impl<'a> RawMessage<'a> {
    /// A view of `message`.
    pub(crate) fn of(message: &'a rdkafka::message::BorrowedMessage<'_>) -> Self {
        // SAFETY: a polled message's pointer is valid (and non-null) while it is borrowed.
        Self {
            message: unsafe { &*message.ptr() },
        }
    }

    /// A view of a message librdkafka handed out (`kafka::queue_batch`).
    pub(crate) fn from_raw(message: &'a rd::rd_kafka_message_t) -> Self {
        Self { message }
    }

    /// Its offset.
    pub(crate) fn offset(&self) -> i64 {
        self.message.offset
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
