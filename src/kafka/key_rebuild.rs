//! `Mode::Latest`: the records of a split partition that the application may have seen
//! before this assignment (`[end of the first catch-up range, horizon)`, see
//! [`KeyIndex`](crate::plan::KeyIndex)) read again from Kafka for their keys, so that the
//! catch-up lane never hands out a value older than one already seen. One consumer outside
//! the group (manual assignment, the catch-up consumer's group id, never commits), alive
//! only while some partition waits.
//!
//! What is left to read comes from the partitions' indexes each round, so a revoke or a new
//! assignment changes the work by itself. Positions are trusted only on a consumer that
//! assigned the partition once: a new assignment, or a poll error, starts a new consumer
//! from what the indexes hold (librdkafka can report a position of an earlier assignment
//! right after a reassign).

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::{KafkaError, RoleContext, create_consumer, for_other_consumers, for_role};
use crate::engine::{KeyNotes, PartitionId, RebuildWanted, Shared};
use crate::fetch::Hold;

/// Messages taken per round, between two looks at what is wanted.
const POLL_BATCH: usize = 5000;
/// How long an idle thread waits before looking again for partitions to rebuild.
const IDLE: Duration = Duration::from_millis(200);
/// What the rebuild's consumer may prefetch (it reads keys; values are dropped at once).
const QUEUE_KIB: &str = "16384";

/// The key-rebuild thread of a consumer in `Mode::Latest`.
pub(crate) struct KeyRebuild;

impl KeyRebuild {
    /// Starts the thread; it stops when the returned sender sends or is dropped.
    pub fn spawn(
        client: &ClientConfig,
        shared: Arc<Shared>,
    ) -> Result<(Sender<()>, JoinHandle<()>), KafkaError> {
        let mut config = for_role(&for_other_consumers(client), "rebuild");
        config
            .set("group.id", format!("{}.catchup", shared.group))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // Records retention deleted are gone for everyone: none of them is delivered
            // again, nor any older one of its key.
            .set("auto.offset.reset", "earliest")
            .set("queued.max.messages.kbytes", QUEUE_KIB);
        let (stop, stopped) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("catchup-rebuild".into())
            .spawn(move || {
                Rebuilder {
                    config,
                    shared,
                    consumer: None,
                    assigned: HashMap::new(),
                    create_hold: Hold::default(),
                }
                .run(stopped)
            })
            .map_err(|error| KafkaError::Spawn {
                thread: "key rebuild",
                error,
            })?;
        Ok((stop, thread))
    }
}

struct Rebuilder {
    config: ClientConfig,
    shared: Arc<Shared>,
    consumer: Option<BaseConsumer<RoleContext>>,
    /// What the consumer was assigned: per partition, its assignment generation.
    assigned: HashMap<PartitionId, u64>,
    /// After a failed creation of the consumer: no attempt before it ends.
    create_hold: Hold,
}

impl Rebuilder {
    fn run(mut self, stop: Receiver<()>) {
        let shared = self.shared.clone();
        let _stop_on_panic = shared.stop_on_panic("key rebuild");
        loop {
            let wanted = self.shared.rebuilds_wanted();
            let wait = if wanted.is_empty() {
                self.consumer = None; // nothing waits: leave the brokers alone
                self.assigned.clear();
                Some(IDLE)
            } else if !self.ready_for(&wanted) {
                Some(self.create_hold.remaining(Instant::now()).max(IDLE))
            } else {
                None
            };
            match wait {
                Some(wait) => match stop.recv_timeout(wait) {
                    Err(RecvTimeoutError::Timeout) => continue,
                    _ => return,
                },
                None => {
                    if !matches!(stop.try_recv(), Err(crossbeam_channel::TryRecvError::Empty)) {
                        return;
                    }
                }
            }
            self.read();
        }
    }

    /// Makes the consumer's assignment `wanted`, on a new consumer if anything but a
    /// finished partition changed. Whether there is a consumer to poll.
    fn ready_for(&mut self, wanted: &[RebuildWanted]) -> bool {
        let same = wanted
            .iter()
            .all(|want| self.assigned.get(&want.partition) == Some(&want.generation));
        if same && self.consumer.is_some() {
            return true;
        }
        self.consumer = None;
        self.assigned.clear();
        if self.create_hold.holds(Instant::now()) {
            return false;
        }
        let context = RoleContext::new(self.shared.health.clone(), "rebuild");
        let consumer = match create_consumer(&self.config, context) {
            Ok(consumer) => consumer,
            Err(err) => {
                let wait = self.create_hold.hold(Instant::now());
                self.error(format!(
                    "creating the key-rebuild consumer: {err}; the backlog of its partitions waits, retrying in {} s",
                    wait.as_secs()
                ));
                return false;
            }
        };
        self.create_hold.release();
        let mut tpl = TopicPartitionList::new();
        for want in wanted {
            let (topic, partition) = &want.partition;
            if let Err(err) =
                tpl.add_partition_offset(topic, *partition, Offset::Offset(want.left.start))
            {
                self.error(format!("key rebuild of {topic}/{partition}: {err}"));
                return false;
            }
        }
        if let Err(err) = consumer.assign(&tpl) {
            self.error(format!("key-rebuild assign: {err}"));
            return false;
        }
        for want in wanted {
            tracing::info!(
                topic = want.partition.0,
                partition = want.partition.1,
                from = want.left.start,
                to = want.left.end,
                "reading the keys the application may have seen again before the backlog goes on"
            );
            self.assigned
                .insert(want.partition.clone(), want.generation);
        }
        self.consumer = Some(consumer);
        true
    }

    /// One round: up to `POLL_BATCH` messages noted, then every partition's position.
    fn read(&mut self) {
        let Some(consumer) = &self.consumer else {
            return;
        };
        let mut read: HashMap<PartitionId, (KeyNotes, i64)> = HashMap::new();
        let mut timeout = Duration::from_millis(100);
        let mut failed = None;
        for _ in 0..POLL_BATCH {
            match consumer.poll(timeout) {
                None => break,
                Some(Ok(message)) => {
                    let key = (message.topic().to_owned(), message.partition());
                    let (notes, next) = read.entry(key).or_insert((Vec::new(), 0));
                    if let Some(noted) = message.key() {
                        notes.push((noted.into(), message.offset()));
                    }
                    *next = (*next).max(message.offset() + 1);
                }
                Some(Err(err)) => {
                    failed = Some(err.to_string());
                    break;
                }
            }
            timeout = Duration::ZERO;
        }
        // Everything before a partition's position was handed out above (or was a marker or
        // a compacted offset): its position is how far the rebuild has read.
        if failed.is_none() {
            if let Ok(positions) = consumer.position() {
                for element in positions.elements() {
                    if let Offset::Offset(position) = element.offset() {
                        let key = (element.topic().to_owned(), element.partition());
                        let (_, next) = read.entry(key).or_insert((Vec::new(), 0));
                        *next = (*next).max(position);
                    }
                }
            }
        }
        for (key, (notes, next)) in read {
            let Some(&generation) = self.assigned.get(&key) else {
                continue;
            };
            if self.shared.rebuild_noted(&key, generation, notes, next) {
                // Done: this consumer never assigns it again, so a stale position is moot.
                self.assigned.remove(&key);
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&key.0, key.1);
                if let Err(err) = consumer.incremental_unassign(&tpl) {
                    tracing::debug!("key-rebuild unassign of {}/{}: {err}", key.0, key.1);
                }
            }
        }
        if let Some(reason) = failed {
            // What was read before the error counts; the rest is read by a new consumer.
            self.error(format!(
                "key rebuild: {reason}; reading again from where it got"
            ));
            self.consumer = None;
            self.assigned.clear();
        }
    }

    fn error(&self, message: String) {
        tracing::warn!("{message}");
        self.shared
            .emit(crate::engine::types::Event::Error { message });
    }
}
