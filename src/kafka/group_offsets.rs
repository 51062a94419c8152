//! The partitions a group has committed offsets for, as `kafka-consumer-groups --describe`
//! finds them: librdkafka's `ListConsumerGroupOffsets` without a partition list, which
//! rust-rdkafka does not wrap, called through the bindings on a client's own handle.

use std::ffi::CString;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

use super::ffi::{Owned, admin_options, admin_result, poll_event, queue, text};

/// Every `(topic, partition)` `group` has a committed offset for, sorted.
pub(crate) fn committed_partitions<C: ClientContext>(
    client: &Client<C>,
    group: &str,
    timeout: Duration,
) -> Result<Vec<(String, i32)>, String> {
    let group_id = CString::new(group).map_err(|_| format!("group id {group:?} holds NUL"))?;
    let rk = client.native_ptr();
    // SAFETY: every pointer passed is either from librdkafka (and freed by `Owned`) or
    // borrowed from `group_id`, which outlives the calls (librdkafka copies it); the request
    // array holds one live request for the duration of the call.
    unsafe {
        let queue = queue(rk)?;
        let options = admin_options(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS,
            timeout,
        )?;
        let request = Owned {
            ptr: rd::rd_kafka_ListConsumerGroupOffsets_new(group_id.as_ptr(), std::ptr::null()),
            free: rd::rd_kafka_ListConsumerGroupOffsets_destroy,
        };
        if request.ptr.is_null() {
            return Err("librdkafka could not allocate a ListConsumerGroupOffsets request".into());
        }
        let mut requests = [request.ptr];
        rd::rd_kafka_ListConsumerGroupOffsets(
            rk,
            requests.as_mut_ptr(),
            requests.len(),
            options.ptr,
            queue.ptr,
        );
        let event = poll_event(&queue, timeout + Duration::from_secs(1));
        admin_result(&event, "ListConsumerGroupOffsets", timeout)?;
        let result = rd::rd_kafka_event_ListConsumerGroupOffsets_result(event.ptr);
        if result.is_null() {
            return Err("ListConsumerGroupOffsets returned no result".into());
        }
        let mut count = 0;
        let groups = rd::rd_kafka_ListConsumerGroupOffsets_result_groups(result, &mut count);
        let mut partitions = Vec::new();
        for index in 0..count {
            let group_result = *groups.add(index);
            if group_result.is_null() {
                continue;
            }
            let error = rd::rd_kafka_group_result_error(group_result);
            if !error.is_null() {
                let reason = text(rd::rd_kafka_error_string(error));
                return Err(format!("the offsets of group {group}: {reason}"));
            }
            let list = rd::rd_kafka_group_result_partitions(group_result);
            if list.is_null() {
                continue;
            }
            let elems = (*list).elems;
            let cnt = usize::try_from((*list).cnt).unwrap_or(0);
            for at in 0..cnt {
                let element = &*elems.add(at);
                // A partition without a commit comes back with an invalid offset.
                if element.topic.is_null() || element.offset < 0 {
                    continue;
                }
                let topic = text(element.topic);
                partitions.push((topic, element.partition));
            }
        }
        partitions.sort();
        Ok(partitions)
    }
}
