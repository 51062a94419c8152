//! Kafka's topic ids: what tells two incarnations of a topic name apart (a topic deleted and
//! recreated restarts its offsets with other data). rust-rdkafka does not wrap librdkafka's
//! `DescribeTopics`, so this calls it through the bindings, on the consumer's own handle.

use std::collections::HashMap;
use std::ffi::{CString, c_char};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

use super::ffi::{Owned, admin_options, admin_result, poll_event, queue, text};

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
    // SAFETY: every pointer passed is either from librdkafka (and freed by `Owned`) or
    // borrowed from `names`/`pointers`, which outlive the calls; librdkafka copies the topic
    // names into the collection.
    unsafe {
        let queue = queue(rk)?;
        let options = admin_options(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            timeout,
        )?;
        let collection = Owned {
            ptr: rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len()),
            free: rd::rd_kafka_TopicCollection_destroy,
        };
        if collection.ptr.is_null() {
            return Err("librdkafka could not allocate a DescribeTopics request".into());
        }
        rd::rd_kafka_DescribeTopics(rk, collection.ptr, options.ptr, queue.ptr);
        let event = poll_event(&queue, timeout + Duration::from_secs(1));
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
            ids.insert(text(name), id);
        }
        Ok(ids)
    }
}
