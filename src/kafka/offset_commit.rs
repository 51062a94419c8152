//! One OffsetCommit for many partitions, with each partition's own outcome. rust-rdkafka's
//! synchronous `commit` reports an error only when every partition failed (librdkafka's
//! rule), so a commit refused for one partition would pass for done; this commits through
//! librdkafka's `rd_kafka_commit_queue` and reads the result's partition list, within a
//! timeout of ours.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

use super::ffi::{error_text, poll_event, queue, text};

/// Commits `offsets` (their offsets and metadata) and returns, per `(topic, partition)`, why
/// its commit failed (`None`: committed). An error when the request as a whole failed or did
/// not answer within `timeout` (then nothing counts as committed; a commit that lands later
/// is repeated by the next cycle).
pub(crate) fn commit_each<C: ClientContext>(
    client: &Client<C>,
    offsets: &TopicPartitionList,
    timeout: Duration,
) -> Result<HashMap<(String, i32), Option<String>>, String> {
    let rk = client.native_ptr();
    // SAFETY: the queue is librdkafka's and freed by `Owned`; `offsets` outlives the call
    // (librdkafka copies it); the event is freed by `Owned` and its partition list belongs to
    // it, read before the event is freed.
    unsafe {
        let queue = queue(rk)?;
        let err =
            rd::rd_kafka_commit_queue(rk, offsets.ptr(), queue.ptr, None, std::ptr::null_mut());
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(error_text(err));
        }
        let event = poll_event(&queue, timeout);
        if event.ptr.is_null() {
            return Err(format!("no answer within {timeout:?}"));
        }
        let global = rd::rd_kafka_event_error(event.ptr);
        let list = rd::rd_kafka_event_topic_partition_list(event.ptr);
        if list.is_null() {
            return match global {
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => {
                    Err("the commit's answer names no partition".into())
                }
                err => Err(error_text(err)),
            };
        }
        let mut outcomes = HashMap::new();
        let count = usize::try_from((*list).cnt).unwrap_or(0);
        for at in 0..count {
            let element = &*(*list).elems.add(at);
            if element.topic.is_null() {
                continue;
            }
            let topic = text(element.topic);
            let outcome = match element.err {
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => None,
                err => Some(error_text(err)),
            };
            outcomes.insert((topic, element.partition), outcome);
        }
        Ok(outcomes)
    }
}
