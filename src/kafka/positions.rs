//! A consumer's positions on the partitions a fetcher runs, read from librdkafka's partition
//! objects after every poll round.
//!
//! rust-rdkafka's `position()` first asks for the assignment, a request to librdkafka's main
//! thread and a wait for its answer. A fetcher asks after every round, and at full speed a
//! round is a few hundred records: the live thread spent a tenth of its waits on those
//! answers. The fetchers name the partitions they run (a runtime or a tracked partition)
//! instead; `rd_kafka_position` reads each under the partition's own lock. Such a partition
//! may not be assigned at that moment (an assignment that failed, a reassignment between its
//! unassign and its assign): librdkafka resets a position when the partition's fetch stops
//! and when it is sought, so what is read is either nothing or the last record handed out
//! under the lane's own positioning — and a cursor trusts a position only once its current
//! positioning handed out a record (`fetch::cursor`).

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::engine::PartitionId;

/// The list the positions are read into, kept while the partitions stay the same.
#[derive(Default)]
pub(crate) struct Positions {
    partitions: Vec<PartitionId>,
    list: TopicPartitionList,
}

impl Positions {
    /// The position of each of `partitions` that has one (`None`: librdkafka knows no
    /// position, e.g. before the first fetch of an assignment).
    pub fn read<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        partitions: Vec<PartitionId>,
    ) -> impl Iterator<Item = (PartitionId, i64)> + '_ {
        if partitions != self.partitions {
            let mut list = TopicPartitionList::with_capacity(partitions.len());
            for (topic, partition) in &partitions {
                list.add_partition(topic, *partition);
            }
            self.list = list;
            self.partitions = partitions;
        }
        // SAFETY: the handle lives as long as `consumer`, and the list is ours; librdkafka
        // sets each element's offset and error in place.
        let read = unsafe {
            rdkafka::bindings::rd_kafka_position(consumer.client().native_ptr(), self.list.ptr())
        };
        let elements = if read == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            self.list.elements()
        } else {
            Vec::new()
        };
        // Elements come in the order they were added.
        self.partitions
            .iter()
            .zip(elements)
            .filter_map(|(key, element)| match (element.error(), element.offset()) {
                (Ok(()), Offset::Offset(position)) => Some((key.clone(), position)),
                _ => None,
            })
    }
}
