//! What the calls into librdkafka's bindings share: objects freed when dropped, a queue of
//! our own for one answer, admin options with our timeout, an event checked for errors,
//! librdkafka's strings. Used where rust-rdkafka does not wrap a call (`topic_id`,
//! `group_offsets`, `offset_commit`, the catch-up fetcher's wait).

use std::ffi::{CStr, c_char};
use std::time::Duration;

use rdkafka::bindings as rd;

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

/// `timeout` in librdkafka's milliseconds.
pub(super) fn millis(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX)
}

/// A queue of our own on `rk`, for the answer to one request.
///
/// # Safety
/// `rk` is a live librdkafka handle.
pub(super) unsafe fn queue(rk: *mut rd::rd_kafka_t) -> Result<Owned<rd::rd_kafka_queue_t>, String> {
    // SAFETY: a live handle, as the caller promises.
    let queue = Owned {
        ptr: unsafe { rd::rd_kafka_queue_new(rk) },
        free: rd::rd_kafka_queue_destroy,
    };
    if queue.ptr.is_null() {
        return Err("librdkafka could not allocate a queue".into());
    }
    Ok(queue)
}

/// Events waiting on the consumer queue of `rk` (the queue a consumer's `poll` serves, which
/// the main queue is forwarded to).
///
/// # Safety
/// `rk` is a live librdkafka consumer handle.
pub(super) unsafe fn consumer_queue_length(rk: *mut rd::rd_kafka_t) -> usize {
    // SAFETY: a live handle, as the caller promises; the queue reference is released when
    // `queue` drops.
    unsafe {
        let queue = Owned {
            ptr: rd::rd_kafka_queue_get_consumer(rk),
            free: rd::rd_kafka_queue_destroy,
        };
        if queue.ptr.is_null() {
            return 0;
        }
        rd::rd_kafka_queue_length(queue.ptr)
    }
}

/// Options of an admin request of kind `op` that waits at most `timeout` for the broker.
///
/// # Safety
/// `rk` is a live librdkafka handle.
pub(super) unsafe fn admin_options(
    rk: *mut rd::rd_kafka_t,
    op: rd::rd_kafka_admin_op_t,
    timeout: Duration,
) -> Result<Owned<rd::rd_kafka_AdminOptions_t>, String> {
    // SAFETY: a live handle, as the caller promises; `errstr` outlives the call.
    unsafe {
        let options = Owned {
            ptr: rd::rd_kafka_AdminOptions_new(rk, op),
            free: rd::rd_kafka_AdminOptions_destroy,
        };
        if options.ptr.is_null() {
            return Err(format!(
                "librdkafka could not allocate the options of {op:?}"
            ));
        }
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr,
            millis(timeout),
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        Ok(options)
    }
}

/// The next event on `queue`, waiting at most `timeout` (a null event when none came).
///
/// # Safety
/// `queue` is a live queue.
pub(super) unsafe fn poll_event(
    queue: &Owned<rd::rd_kafka_queue_t>,
    timeout: Duration,
) -> Owned<rd::rd_kafka_event_t> {
    Owned {
        // SAFETY: a live queue, as the caller promises.
        ptr: unsafe { rd::rd_kafka_queue_poll(queue.ptr, millis(timeout)) },
        free: rd::rd_kafka_event_destroy,
    }
}

/// Whether an admin request's result `event` (from [`poll_event`]) is a success.
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
            let reason = text(rd::rd_kafka_event_error_string(event.ptr));
            return Err(format!("{request} failed: {reason}"));
        }
    }
    Ok(())
}

/// A string librdkafka owns, copied ("unknown error" for null).
///
/// # Safety
/// `ptr` is null or a NUL-terminated string that lives for the call.
pub(super) unsafe fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: NUL-terminated and live, as the caller promises.
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    }
}

/// librdkafka's description of an error code.
pub(super) fn error_text(err: rd::rd_kafka_resp_err_t) -> String {
    // SAFETY: librdkafka returns a static string (or null) for every error code.
    unsafe { text(rd::rd_kafka_err2str(err)) }
}
