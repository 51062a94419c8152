//! The catch-up fetcher: one consumer outside the group (manual assignment, its own group id,
//! never commits) for every partition under catch-up. A partition leaves it when its position
//! reaches the end of its last range — position, not "saw offset B-1", because compaction and
//! transaction markers leave gaps. With nothing left, the consumer is closed.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer, DefaultConsumerContext};
use rdkafka::error::KafkaError as RdError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::side_log::connection_only;
use super::{Budget, to_record};
use crate::consumer::runtime::{PartitionId, Shared};
use crate::consumer::{Event, Mode};
use crate::store::{Lane, OffsetRange, Record};

const POLL_BATCH: usize = 2000;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests to the catch-up thread.
pub(crate) enum CatchupCommand {
    /// Fetch the `ranges` of a partition, resuming at `position`.
    Add {
        topic: String,
        partition: i32,
        position: i64,
        ranges: Vec<OffsetRange>,
    },
    /// Stop fetching these partitions; `done` is signalled once nothing more is appended.
    Remove {
        partitions: Vec<PartitionId>,
        done: Sender<()>,
    },
    /// Stop the thread.
    Shutdown,
}

struct Tracked {
    position: i64,
    ranges: Vec<OffsetRange>,
    /// The partition's own queue; it holds the consumer, so it goes with the partition.
    queue: Option<Queue>,
}

/// A tracked partition's own queue: its end-of-partition event names it unambiguously
/// (rdkafka's `PartitionEOF` carries only the partition number).
type Queue = PartitionQueue<DefaultConsumerContext>;

impl Tracked {
    /// The end of the range `position` is in; `None` when every range is fetched.
    fn range_end(&self) -> Option<i64> {
        self.ranges
            .iter()
            .find(|r| r.start <= self.position && self.position < r.end)
            .map(|r| r.end)
    }
}

/// The catch-up fetcher thread.
pub(crate) struct CatchupFetcher;

impl CatchupFetcher {
    /// Starts the thread; partitions arrive through the returned sender.
    pub fn spawn(
        client: &ClientConfig,
        shared: Arc<Shared>,
    ) -> Result<(Sender<CatchupCommand>, JoinHandle<()>), crate::Error> {
        let mut config = connection_only(client);
        if let Some(isolation) = client.get("isolation.level") {
            config.set("isolation.level", isolation);
        }
        config
            .set("group.id", format!("{}.catchup", shared.group))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "true");
        let budget = shared.config.buffer_budget_bytes;
        let (commands, receiver) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("catchup-fetcher".into())
            .spawn(move || {
                Fetcher {
                    config,
                    shared,
                    consumer: None,
                    tracked: HashMap::new(),
                    budget: Budget::new("catch-up", budget),
                }
                .run(receiver)
            })
            .map_err(|e| crate::Error::Config(format!("cannot start the catch-up thread: {e}")))?;
        Ok((commands, thread))
    }
}

struct Fetcher {
    config: ClientConfig,
    shared: Arc<Shared>,
    consumer: Option<Arc<BaseConsumer>>,
    tracked: HashMap<PartitionId, Tracked>,
    budget: Budget,
}

impl Fetcher {
    fn run(mut self, commands: Receiver<CatchupCommand>) {
        loop {
            let command = if self.tracked.is_empty() {
                self.consumer = None; // none left: leave the brokers alone
                match commands.recv_timeout(Duration::from_secs(1)) {
                    Ok(command) => Some(command),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                commands.try_recv().ok()
            };
            if let Some(command) = command {
                match command {
                    CatchupCommand::Add {
                        topic,
                        partition,
                        position,
                        ranges,
                    } => self.add(
                        (topic, partition),
                        Tracked {
                            position,
                            ranges,
                            queue: None,
                        },
                    ),
                    CatchupCommand::Remove { partitions, done } => {
                        for key in &partitions {
                            if self.tracked.remove(key).is_some() {
                                self.unassign(key);
                            }
                        }
                        let _ = done.send(());
                    }
                    CatchupCommand::Shutdown => return,
                }
                continue; // drain all commands before fetching
            }
            if !self.tracked.is_empty() {
                if let Err(message) = self.fetch() {
                    self.shared.emit(Event::Error { message });
                }
            }
        }
    }

    fn error(&self, message: String) {
        self.shared.emit(Event::Error { message });
    }

    fn add(&mut self, key: PartitionId, mut tracked: Tracked) {
        if tracked.range_end().is_none() {
            return;
        }
        if self.consumer.is_none() {
            match self.config.create::<BaseConsumer>() {
                Ok(consumer) => self.consumer = Some(Arc::new(consumer)),
                Err(err) => return self.error(format!("creating the catch-up consumer: {err}")),
            }
        }
        tracked.queue = self
            .consumer
            .as_ref()
            .and_then(|c| c.split_partition_queue(&key.0, key.1));
        self.assign_at(&key, tracked.position);
        self.tracked.insert(key, tracked);
    }

    fn assign_at(&self, (topic, partition): &PartitionId, position: i64) {
        let Some(consumer) = &self.consumer else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        let result = tpl
            .add_partition_offset(topic, *partition, Offset::Offset(position))
            .and_then(|_| consumer.incremental_assign(&tpl));
        if let Err(err) = result {
            self.error(format!(
                "catch-up assign of {topic}/{partition} at {position}: {err}"
            ));
        }
    }

    fn unassign(&self, (topic, partition): &PartitionId) {
        let Some(consumer) = &self.consumer else {
            return;
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, *partition);
        if let Err(err) = consumer.incremental_unassign(&tpl) {
            self.error(format!("catch-up unassign of {topic}/{partition}: {err}"));
        }
    }

    /// One poll round, then the positions and end-of-partition checks.
    fn fetch(&mut self) -> Result<(), String> {
        let Some(consumer) = self.consumer.clone() else {
            return Ok(());
        };
        let mut round = Round::default();
        // The main queue serves callbacks and any message fetched before its queue split.
        round.take(consumer.poll(Duration::ZERO), None)?;
        for (key, queue) in self
            .tracked
            .iter()
            .filter_map(|(k, t)| Some((k, t.queue.as_ref()?)))
        {
            for _ in 0..POLL_BATCH {
                if !round.take(queue.poll(Duration::ZERO), Some(key))? {
                    break;
                }
            }
        }
        if round.is_empty() {
            round.take(consumer.poll(Duration::from_millis(20)), None)?;
        }
        let mut failed = Vec::new();
        for (key, records) in std::mem::take(&mut round.batches) {
            let Some(tracked) = self.tracked.get(&key) else {
                continue;
            };
            let next = records.last().map_or(tracked.position, |r| r.offset + 1);
            if let Err(message) = self.append(&key, &records, next) {
                self.error(message);
                failed.push(key);
            }
        }
        // Positions move past gaps that no record shows (compaction).
        let positions = consumer
            .position()
            .map_err(|e| format!("catch-up position: {e}"))?;
        let mut gaps = Vec::new();
        for element in positions.elements() {
            let key = (element.topic().to_owned(), element.partition());
            if failed.contains(&key) {
                continue; // being refetched: its position says nothing about what is stored
            }
            if let (Offset::Offset(position), Some(tracked)) =
                (element.offset(), self.tracked.get(&key))
            {
                if position > tracked.position {
                    gaps.push((key, position));
                }
            }
        }
        for (key, position) in gaps {
            self.append(&key, &[], position)?;
        }
        // At the end of a partition every offset below the high watermark (the last stable
        // offset under read_committed) has been seen: what is left of the range is markers
        // and aborted records.
        for key in round.at_end.into_iter().filter(|key| !failed.contains(key)) {
            let Some(range_end) = self.tracked.get(&key).and_then(Tracked::range_end) else {
                continue;
            };
            let (_, high) = consumer
                .fetch_watermarks(&key.0, key.1, REQUEST_TIMEOUT)
                .map_err(|e| format!("catch-up watermarks of {}/{}: {e}", key.0, key.1))?;
            if high >= range_end {
                self.append(&key, &[], range_end)?;
            }
        }
        if round.out_of_range {
            self.skip_truncated()?;
        }
        // In Ordered mode only catch-up bytes count: live records cannot be delivered before
        // the backlog, so pausing catch-up for them would stall the reader for good.
        let lane = match self.shared.config.mode {
            Mode::Concurrent => None,
            Mode::Ordered | Mode::Off => Some(Lane::Catchup),
        };
        let buffered = self.shared.buffered_bytes(lane);
        let tracked: Vec<PartitionId> = self.tracked.keys().cloned().collect();
        self.budget.apply(&self.shared, &consumer, buffered, || {
            let mut list = TopicPartitionList::new();
            tracked.iter().for_each(|(topic, partition)| {
                list.add_partition(topic, *partition);
            });
            Some(list)
        });
        Ok(())
    }

    /// Appends to the catch-up lane and follows the lane's position: to the next range, or
    /// out of the fetcher once every range is fetched.
    fn append(&mut self, key: &PartitionId, records: &[Record], next: i64) -> Result<(), String> {
        let Some(tracked) = self.tracked.get_mut(key) else {
            return Ok(());
        };
        let Some(range_end) = tracked.range_end() else {
            return Ok(());
        };
        let outcome = self
            .shared
            .buffer
            .append(Lane::Catchup, &key.0, key.1, records, next);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => {
                // librdkafka's position is past these records now; were it left there, the
                // next append would cover them as a gap. Fetch them again instead.
                let position = tracked.position;
                self.unassign(key);
                self.assign_at(key, position);
                return Err(format!(
                    "catch-up append of {}/{} (refetching from {position}): {err}",
                    key.0, key.1
                ));
            }
        };
        if outcome.stored > 0 {
            metrics::counter!("catchup_records_fetched_total", "lane" => "catchup")
                .increment(outcome.stored as u64);
            self.shared
                .add_buffered(key, Lane::Catchup, outcome.stored_bytes);
            self.shared.notify.notify_waiters();
        }
        let previous_end = range_end;
        tracked.position = outcome.fetched_next;
        match tracked.range_end() {
            None => {
                tracing::info!(
                    topic = key.0,
                    partition = key.1,
                    "catch-up lane fetched; partition leaves the catch-up consumer"
                );
                self.tracked.remove(key);
                self.unassign(key);
                self.shared.emit(Event::CatchupFetched {
                    topic: key.0.clone(),
                    partition: key.1,
                });
                self.shared.notify.notify_waiters();
            }
            Some(end) if end != previous_end => {
                // The next range starts elsewhere: move the fetch position there.
                let position = tracked.position;
                self.unassign(key);
                self.assign_at(key, position);
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Retention removed offsets we still needed: report it and continue at the low mark.
    fn skip_truncated(&mut self) -> Result<(), String> {
        let Some(consumer) = &self.consumer else {
            return Ok(());
        };
        let mut skips = Vec::new();
        for (key, tracked) in &self.tracked {
            let (low, _) = consumer
                .fetch_watermarks(&key.0, key.1, REQUEST_TIMEOUT)
                .map_err(|e| format!("catch-up watermarks of {}/{}: {e}", key.0, key.1))?;
            if tracked.position < low {
                skips.push((key.clone(), tracked.position, low));
            }
        }
        for (key, from, low) in skips {
            self.shared.emit(Event::Truncated {
                topic: key.0.clone(),
                partition: key.1,
                from,
                to: low,
            });
            self.append(&key, &[], low)?;
            if let Some(tracked) = self.tracked.get(&key) {
                let position = tracked.position;
                self.unassign(&key);
                self.assign_at(&key, position);
            }
        }
        Ok(())
    }
}

/// What one poll round brought.
#[derive(Default)]
struct Round {
    batches: HashMap<PartitionId, Vec<Record>>,
    at_end: Vec<PartitionId>,
    out_of_range: bool,
}

impl Round {
    fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.at_end.is_empty() && !self.out_of_range
    }

    /// Takes one poll result (of the queue of `queue_key`, or of the main queue); returns
    /// whether there was anything.
    fn take(
        &mut self,
        polled: Option<rdkafka::error::KafkaResult<rdkafka::message::BorrowedMessage<'_>>>,
        queue_key: Option<&PartitionId>,
    ) -> Result<bool, String> {
        match polled {
            None => return Ok(false),
            Some(Ok(message)) => {
                let key = (message.topic().to_owned(), message.partition());
                self.batches
                    .entry(key)
                    .or_default()
                    .push(to_record(&message));
            }
            Some(Err(RdError::PartitionEOF(_))) => {
                if let Some(key) = queue_key {
                    self.at_end.push(key.clone());
                }
                return Ok(false);
            }
            Some(Err(RdError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)))
            | Some(Err(RdError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                self.out_of_range = true
            }
            Some(Err(err)) => return Err(format!("catch-up fetch: {err}")),
        }
        Ok(true)
    }
}
