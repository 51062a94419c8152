//! Records waiting in the buffer (live lanes behind their backlog in `Ordered`), then
//! processed: sled keeps its files at their peak size, so the
//! consumer compacts the buffer into a fresh generation on its own, gives the disk back, and
//! goes on buffering and delivering — across a restart too — with nothing lost (store audit
//! D1; issue "disk comes back").

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use catchup::{CatchupConsumer, Event, Mode};
use support::{Kafka, test_config, unique};

const WAIT: Duration = Duration::from_secs(60);
const PARTITIONS: i32 = 2;
/// Records of each partition before the consumer joins: the split's backlog.
const BACKLOG: i64 = 1_000;
/// Records of each partition produced once it is split: its live lane waits behind the
/// backlog (`Ordered`), so they wait in the buffer.
const PER_PARTITION: i64 = 14_000;
/// The log end once both are produced.
const END: i64 = BACKLOG + PER_PARTITION;
const VALUE_BYTES: usize = 1024;

fn value(partition: i32, offset: i64) -> String {
    let head = format!("{partition}:{offset}:");
    // Varied bytes, so that nothing on the way compresses the backlog away.
    let tail: String = (0..VALUE_BYTES - head.len())
        .map(|i| char::from(b'a' + ((offset as usize * 7 + i) % 26) as u8))
        .collect();
    format!("{head}{tail}")
}

fn disk_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.blocks() * 512;
    }
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| disk_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// Receives and acks until `expected` (partition, offset) pairs were seen, each with its
/// produced value.
async fn receive(consumer: &CatchupConsumer, expected: &BTreeSet<(i32, i64)>) {
    let mut seen = BTreeSet::new();
    while &seen != expected {
        let delivery = support::next_delivery_or(consumer, WAIT, || {
            format!(
                "only {} of {} delivered within {WAIT:?}",
                seen.len(),
                expected.len()
            )
        })
        .await;
        assert_eq!(
            delivery.payload.as_deref(),
            Some(value(delivery.partition, delivery.offset).as_bytes()),
            "{}/{} carries the produced value",
            delivery.partition,
            delivery.offset
        );
        assert!(
            expected.contains(&(delivery.partition, delivery.offset)),
            "{}/{} was not expected",
            delivery.partition,
            delivery.offset
        );
        consumer.ack(&delivery);
        seen.insert((delivery.partition, delivery.offset));
    }
    consumer.commit().await.expect("commit");
}

/// Produces offsets `[from, to)` of every partition (the log ends at `from`), each with
/// its value.
async fn produce(kafka: &Kafka, topic: &str, from: i64, to: i64) {
    for partition in 0..PARTITIONS {
        let records: Vec<(String, String)> = (from..to)
            .map(|offset| (format!("key-{offset}"), value(partition, offset)))
            .collect();
        kafka.produce_keyed(topic, partition, &records).await;
    }
}

fn offsets(from: i64, to: i64) -> BTreeSet<(i32, i64)> {
    (0..PARTITIONS)
        .flat_map(|p| (from..to).map(move |o| (p, o)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_buffer_gives_its_disk_back() {
    let kafka = Kafka::connect();
    let topic = unique("disk-back");
    let group = unique("disk-back-group");
    kafka.create_topic(&topic, PARTITIONS).await;
    produce(&kafka, &topic, 0, BACKLOG).await;
    kafka.commit_as_operator(&group, &topic, &[0; PARTITIONS as usize]);
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer_dir = dir.path().join("buffer");
    // A budget of 64 MiB: four lanes of 16 MiB each (the 14.5 MB a live lane waits with
    // fit), the memory tier holds up to 16 MiB of the 29 MB, the rest waits on disk. (Lanes
    // the reader could take now would be held to their read-ahead instead, and wait in
    // Kafka.)
    let config = test_config(&buffer_dir, Mode::Ordered, 100)
        .disk_allowance_bytes(1 << 20)
        .buffer_budget_bytes(64 << 20);

    let consumer =
        CatchupConsumer::new(&kafka.consumer_config(&group), config.clone()).expect("consumer");
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");
    wait_until_split(&consumer).await;
    produce(&kafka, &topic, BACKLOG, END).await;
    support::wait_until_buffered(&consumer, PARTITIONS as usize, END).await;
    let peak = disk_bytes(&buffer_dir);
    let payload = PARTITIONS as u64 * PER_PARTITION as u64 * VALUE_BYTES as u64;
    assert!(
        peak > payload / 3,
        "{peak} bytes on disk for {payload} of payload waiting, of which memory holds at most 16 MiB"
    );

    receive(&consumer, &offsets(0, END)).await;
    let compacted = tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(Event::BufferCompacted {
                    disk_before,
                    disk_after,
                    ..
                }) => return (disk_before, disk_after),
                Ok(_) => {}
                Err(err) => panic!("events: {err}"),
            }
        }
    })
    .await
    .expect("the drained buffer is compacted within a minute");
    let (disk_before, disk_after) = compacted;
    let now = disk_bytes(&buffer_dir);
    eprintln!(
        "disk: payload {payload}, peak {peak}, compacted {disk_before} -> {disk_after}, now {now}"
    );
    assert!(
        disk_after * 2 < disk_before && now * 2 < peak,
        "disk: peak {peak}, compacted {disk_before} -> {disk_after}, now {now}"
    );
    assert!(
        buffer_dir.join("CURRENT").is_file(),
        "the buffer moved to a new generation"
    );

    // Buffering and delivery go on in the new generation...
    produce(&kafka, &topic, END, END + 200).await;
    receive(&consumer, &offsets(END, END + 200)).await;
    consumer.close().await.expect("close");

    // ...and after a restart, which opens it.
    let consumer = CatchupConsumer::new(&kafka.consumer_config(&group), config).expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    produce(&kafka, &topic, END + 200, END + 400).await;
    receive(&consumer, &offsets(END + 200, END + 400)).await;
    consumer.close().await.expect("close");
}

/// Waits until every partition is split at the backlog's end.
async fn wait_until_split(consumer: &CatchupConsumer) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let buffers = consumer.buffers().expect("buffers");
        if buffers.len() == PARTITIONS as usize
            && buffers.iter().all(|b| b.boundary == Some(BACKLOG))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not split in time: {buffers:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
