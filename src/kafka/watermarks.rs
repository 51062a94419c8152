//! Reading many partitions' watermarks at once: an offline partition costs one short timeout
//! per group of readers, not a long one per partition, and the thread asking (the group
//! member, whose time between polls counts against `max.poll.interval.ms`, or the catch-up
//! consumer, which answers revokes) is not held for long.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use crate::engine::PartitionId;

/// How long reading one partition's watermarks may take: a partition whose leader does not
/// answer waits and is tried again.
const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(5);
/// Watermarks are read this many partitions at a time.
const WATERMARK_READERS: usize = 16;

/// The watermarks of `partitions`, in order, read concurrently (up to `WATERMARK_READERS` at
/// a time), each within [`WATERMARKS_TIMEOUT`]. A reader that cannot be started or panics
/// reads nothing: that partition waits and is tried again.
pub(crate) fn read_watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[PartitionId],
) -> Vec<rdkafka::error::KafkaResult<(i64, i64)>> {
    let mut watermarks = Vec::with_capacity(partitions.len());
    for group in partitions.chunks(WATERMARK_READERS) {
        std::thread::scope(|scope| {
            let readers: Vec<_> = group
                .iter()
                .map(|(topic, partition)| {
                    std::thread::Builder::new()
                        .name("catchup-watermarks".into())
                        .spawn_scoped(scope, move || {
                            consumer.fetch_watermarks(topic, *partition, WATERMARKS_TIMEOUT)
                        })
                })
                .collect();
            for reader in readers {
                let read = match reader {
                    Ok(reader) => reader
                        .join()
                        .unwrap_or(Err(rdkafka::error::KafkaError::Canceled)),
                    Err(_) => Err(rdkafka::error::KafkaError::Canceled),
                };
                watermarks.push(read);
            }
        });
    }
    watermarks
}
