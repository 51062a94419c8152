//! Kafka's topic ids: what tells two incarnations of a topic name apart (a topic deleted and
//! recreated restarts its offsets with other data). rust-rdkafka does not wrap librdkafka's
//! `DescribeTopics`, so this calls it through the bindings, on the consumer's own handle.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

/// Frees a librdkafka object when dropped.
pub(super) struct Owned<T> {
    pub(super) ptr: *mut T,
    pub(super) free: unsafe extern "C" fn(*mut T),
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` came from the librdkafka constructor `free` belongs to, and is
            // freed once.
            unsafe { (self.free)(self.ptr) }
        }
    }
}

/// The ids of `topics` (the 128-bit UUID as 32 hex digits), by name. A topic whose
/// description failed (missing, not authorized) is left out; an error when the request as a
/// whole failed (an old broker, a timeout).
pub(crate) fn topic_ids<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<HashMap<String, String>, String> {
    if topics.is_empty() {
        return Ok(HashMap::new());
    }
    let names: Vec<CString> = topics
        .iter()
        .map(|topic| CString::new(*topic).map_err(|_| format!("topic name {topic:?} holds NUL")))
        .collect::<Result<_, _>>()?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|name| name.as_ptr()).collect();
    let rk = client.native_ptr();
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: every pointer passed is either from librdkafka (and freed by `Owned`) or
    // borrowed from `names`/`pointers`, which outlive the calls; librdkafka copies the topic
    // names into the collection.
    unsafe {
        let queue = Owned {
            ptr: rd::rd_kafka_queue_new(rk),
            free: rd::rd_kafka_queue_destroy,
        };
        let collection = Owned {
            ptr: rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len()),
            free: rd::rd_kafka_TopicCollection_destroy,
        };
        let options = Owned {
            ptr: rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            ),
            free: rd::rd_kafka_AdminOptions_destroy,
        };
        if queue.ptr.is_null() || collection.ptr.is_null() || options.ptr.is_null() {
            return Err("librdkafka could not allocate a DescribeTopics request".into());
        }
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        rd::rd_kafka_DescribeTopics(rk, collection.ptr, options.ptr, queue.ptr);
        let event = Owned {
            ptr: rd::rd_kafka_queue_poll(queue.ptr, timeout_ms.saturating_add(1000)),
            free: rd::rd_kafka_event_destroy,
        };
        admin_result(&event, "DescribeTopics", timeout)?;
        let result = rd::rd_kafka_event_DescribeTopics_result(event.ptr);
        if result.is_null() {
            return Err("DescribeTopics returned no result".into());
        }
        let mut count = 0;
        let descriptions = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        let mut ids = HashMap::new();
        for index in 0..count {
            let description = *descriptions.add(index);
            if description.is_null() {
                continue;
            }
            let error = rd::rd_kafka_TopicDescription_error(description);
            if !error.is_null()
                && rd::rd_kafka_error_code(error)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                continue;
            }
            let name = rd::rd_kafka_TopicDescription_name(description);
            let uuid = rd::rd_kafka_TopicDescription_topic_id(description);
            if name.is_null() || uuid.is_null() {
                continue;
            }
            let (high, low) = (
                rd::rd_kafka_Uuid_most_significant_bits(uuid),
                rd::rd_kafka_Uuid_least_significant_bits(uuid),
            );
            // The zero id: the broker does not know topic ids (older than Kafka 2.8).
            if (high, low) == (0, 0) {
                continue;
            }
            let id = format!("{:016x}{:016x}", high as u64, low as u64);
            ids.insert(CStr::from_ptr(name).to_string_lossy().into_owned(), id);
        }
        Ok(ids)
    }
}

/// Whether an admin request's result `event` (from `rd_kafka_queue_poll`) is a success.
///
/// # Safety
/// `event.ptr` is null or a live librdkafka event.
pub(super) unsafe fn admin_result(
    event: &Owned<rd::rd_kafka_event_t>,
    request: &str,
    timeout: Duration,
) -> Result<(), String> {
    if event.ptr.is_null() {
        return Err(format!("{request} timed out after {timeout:?}"));
    }
    // SAFETY: a live event, as the caller promises.
    unsafe {
        if rd::rd_kafka_event_error(event.ptr)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            let reason = rd::rd_kafka_event_error_string(event.ptr);
            let reason = if reason.is_null() {
                "unknown error".into()
            } else {
                CStr::from_ptr(reason).to_string_lossy().into_owned()
            };
            return Err(format!("{request} failed: {reason}"));
        }
    }
    Ok(())
}
