//! The buffer's byte budget, applied by each fetcher to its own consumer.

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use crate::consumer::Event;
use crate::consumer::runtime::Shared;

/// Pauses a fetcher while the bytes it buffered and nobody acknowledged exceed the budget,
/// and resumes it below half: the buffer stays bounded whatever the backlog.
pub(crate) struct Budget {
    fetcher: &'static str,
    limit: u64,
    paused: bool,
}

impl Budget {
    pub fn new(fetcher: &'static str, limit: u64) -> Self {
        Self {
            fetcher,
            limit,
            paused: false,
        }
    }

    /// Pauses or resumes `partitions` of `consumer` for `buffered` bytes, and tells
    /// `shared` when that changes.
    pub fn apply<C: ConsumerContext>(
        &mut self,
        shared: &Shared,
        consumer: &BaseConsumer<C>,
        buffered: u64,
        partitions: impl FnOnce() -> Option<TopicPartitionList>,
    ) {
        let pause = buffered > self.limit;
        let resume = self.paused && buffered <= self.limit / 2;
        if !(pause || resume) {
            return;
        }
        let Some(partitions) = partitions() else {
            return;
        };
        if pause {
            // Every round while over budget: partitions assigned meanwhile get paused too.
            let _ = consumer.pause(&partitions);
            if !self.paused {
                shared.emit(Event::Backpressure {
                    fetcher: self.fetcher.into(),
                    paused: true,
                    buffered_bytes: buffered,
                });
            }
            self.paused = true;
        } else {
            let _ = consumer.resume(&partitions);
            shared.emit(Event::Backpressure {
                fetcher: self.fetcher.into(),
                paused: false,
                buffered_bytes: buffered,
            });
            self.paused = false;
        }
    }
}
