//! The log end librdkafka last heard of for a partition (from its fetch responses), without a
//! request: what the progress gauges use every commit cycle. rust-rdkafka wraps only the
//! variant that asks the broker.

use std::ffi::CString;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

/// The high watermark of `topic`/`partition` as `client` last saw it; `None` when it has not
/// fetched the partition yet.
pub(crate) fn cached_high<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: a live handle (borrowed from `client`), a NUL-terminated topic name and two
    // out-parameters that outlive the call, which only reads librdkafka's cached state.
    let err = unsafe {
        rd::rd_kafka_get_watermark_offsets(
            client.native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}
