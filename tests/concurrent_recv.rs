//! Several tasks share one consumer: three call `recv` and one `recv_many`, all at once, on
//! a runtime of two threads, over a split backlog in `Ordered`. Together they get every
//! record exactly once, with the payload produced there; each task gets its records of a
//! partition in increasing offsets (a subsequence of the one order the consumer hands out);
//! and the group ends committed at the log end. The reader is locked only while a record is
//! taken: a task that finds it taken yields rather than waits on a lock across an await.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use catchup::{CatchupConsumer, Delivery, Mode};
use support::{Kafka, catchup_consumer, unique};
use tokio::sync::watch;

const PARTITIONS: i32 = 2;
const PER_PARTITION: i64 = 3_000;
const RECV_TASKS: usize = 3;
const LIMIT: usize = 50;
const WAIT: Duration = Duration::from_secs(60);

/// What one task took: (partition, offset, key, payload) in the order it got them.
type Taken = Vec<(i32, i64, Vec<u8>, Vec<u8>)>;

fn keep(delivery: &Delivery) -> (i32, i64, Vec<u8>, Vec<u8>) {
    (
        delivery.partition,
        delivery.offset,
        delivery.key.as_deref().unwrap_or_default().to_vec(),
        delivery.payload.as_deref().unwrap_or_default().to_vec(),
    )
}

/// What the tasks share: the consumer, how many records they took together, and whether
/// that is all of them.
struct Sharing {
    consumer: Arc<CatchupConsumer>,
    taken: Arc<AtomicUsize>,
    done: watch::Sender<bool>,
    total: usize,
}

impl Sharing {
    fn counted(&self, records: usize) {
        if self.taken.fetch_add(records, Ordering::SeqCst) + records >= self.total {
            self.done.send_replace(true);
        }
    }
}

/// Takes records one at a time until every task together took them all.
async fn recv_until_done(sharing: Arc<Sharing>) -> Taken {
    let (consumer, mut done) = (&sharing.consumer, sharing.done.subscribe());
    let mut taken = Taken::new();
    while !*done.borrow_and_update() {
        tokio::select! {
            delivery = consumer.recv() => {
                let delivery = delivery.expect("recv");
                consumer.ack(&delivery);
                taken.push(keep(&delivery));
                sharing.counted(1);
                tokio::task::yield_now().await; // let the other tasks take their turn
            }
            _ = done.changed() => {}
        }
    }
    taken
}

/// Takes runs of up to `LIMIT` records until every task together took them all.
async fn recv_many_until_done(sharing: Arc<Sharing>) -> Taken {
    let (consumer, mut done) = (&sharing.consumer, sharing.done.subscribe());
    let mut taken = Taken::new();
    let mut run = Vec::with_capacity(LIMIT);
    while !*done.borrow_and_update() {
        tokio::select! {
            appended = consumer.recv_many(&mut run, LIMIT) => {
                let appended = appended.expect("recv_many");
                consumer.ack_many(&run);
                taken.extend(run.drain(..).map(|delivery| keep(&delivery)));
                sharing.counted(appended);
                tokio::task::yield_now().await;
            }
            _ = done.changed() => {}
        }
    }
    taken
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_sharing_a_consumer_get_every_record_once_each_in_order() {
    let kafka = Kafka::connect();
    let topic = unique("concurrent-recv");
    kafka.create_topic(&topic, PARTITIONS).await;
    let total = (PARTITIONS as i64 * PER_PARTITION) as usize;
    kafka.produce(&topic, PARTITIONS, total).await;
    let group = unique("concurrent-recv-group");
    kafka.commit_as_operator(&group, &topic, &[0; PARTITIONS as usize]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Ordered, 100);
    let consumer = Arc::new(catchup_consumer(&kafka, &group, config));
    consumer.subscribe(&[&topic]).expect("subscribe");

    let (done, _) = watch::channel(false);
    let sharing = Arc::new(Sharing {
        consumer: consumer.clone(),
        taken: Arc::new(AtomicUsize::new(0)),
        done,
        total,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..RECV_TASKS {
        tasks.spawn(recv_until_done(sharing.clone()));
    }
    tasks.spawn(recv_many_until_done(sharing.clone()));
    // The tasks end once they took as many records as were produced, together.
    let per_task: Vec<Taken> = tokio::time::timeout(WAIT, tasks.join_all())
        .await
        .unwrap_or_else(|_| {
            let taken = sharing.taken.load(Ordering::SeqCst);
            panic!("{taken} of {total} records taken within {WAIT:?}")
        });
    drop(sharing);

    let mut seen: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for (task, taken) in per_task.iter().enumerate() {
        let mut last: BTreeMap<i32, i64> = BTreeMap::new();
        for (partition, offset, key, payload) in taken {
            if let Some(previous) = last.insert(*partition, *offset) {
                assert!(
                    previous < *offset,
                    "task {task}, partition {partition}: offset {offset} after {previous}"
                );
            }
            let index = (*offset * PARTITIONS as i64 + *partition as i64) as usize;
            let expected = support::key_and_payload(&topic, index);
            assert_eq!(
                (key, payload),
                (&expected.0, &expected.1),
                "partition {partition} offset {offset}: the record produced there"
            );
            *seen.entry((*partition, *offset)).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, count)| **count > 1).collect();
    assert!(twice.is_empty(), "handed out more than once: {twice:?}");
    assert_eq!(seen.len(), total, "every record handed out");
    let shares: Vec<usize> = per_task.iter().map(Vec::len).collect();
    eprintln!("records per task (three recv, one recv_many): {shares:?}");

    consumer.commit().await.expect("commit");
    let committed = kafka.committed(&group, &topic, PARTITIONS);
    assert_eq!(committed, vec![Some(PER_PARTITION); PARTITIONS as usize]);
    Arc::into_inner(consumer)
        .expect("the tasks released the consumer")
        .close()
        .await
        .expect("close");
}
