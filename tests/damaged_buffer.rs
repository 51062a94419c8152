//! A buffer damaged on disk while the consumer was down: one partition holds a chunk whose
//! bytes no longer match their checksum, another misses a chunk in the middle of its chain (a
//! hole sled's recovery could leave), a third its last chunk (the chain ends short of what the
//! state counts as fetched: a reader took that for the lane's end and waited there for ever,
//! found by the simulation). The buffer is a cache of Kafka: each damaged partition is
//! discarded and refetched from the group's committed offset, with an event, while the intact
//! partition keeps being read from the buffer — nothing is lost and the reader never stops with
//! an error (store audit R1 and C3; DESIGN invariant 7).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use catchup::{CatchupConsumer, Event, Mode};
use support::{Kafka, test_config, unique};

const WAIT: Duration = Duration::from_secs(60);
const PARTITIONS: i32 = 4;
const PER_PARTITION: i64 = 600;
/// Values of 1 KiB: each partition's records span several chunks of the buffer.
const VALUE_BYTES: usize = 1024;
/// Partition whose chunk is corrupted, partition whose middle chunk is removed, the intact
/// one, and the partition whose last chunk is removed.
const CORRUPTED: i32 = 0;
const HOLED: i32 = 1;
const INTACT: i32 = 2;
const CUT: i32 = 3;

fn value(partition: i32, offset: i64) -> String {
    let head = format!("{partition}:{offset}:");
    format!("{head}{}", "x".repeat(VALUE_BYTES - head.len()))
}

/// The buffer's live chunk keys per partition (key layout: lane byte, topic id, partition,
/// first offset; one topic in this buffer).
fn live_chunks(db: &sled::Db) -> BTreeMap<i32, Vec<sled::IVec>> {
    let mut chunks: BTreeMap<i32, Vec<sled::IVec>> = BTreeMap::new();
    for entry in db.scan_prefix(b"L") {
        let (key, _) = entry.expect("scan");
        assert_eq!(key.len(), 17, "a live chunk key: {key:?}");
        let partition = i32::from_be_bytes(key[5..9].try_into().expect("4 bytes"));
        chunks.entry(partition).or_default().push(key);
    }
    chunks
}

/// Opens the directory with sled itself (the crashed consumer's threads may still be
/// releasing its lock) and damages three partitions.
fn damage(dir: &Path) {
    let deadline = Instant::now() + WAIT;
    let db = loop {
        match support::raw_sled(dir) {
            Ok(db) => break db,
            Err(err) => {
                assert!(Instant::now() < deadline, "opening the buffer: {err}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let chunks = live_chunks(&db);
    for partition in [CORRUPTED, HOLED, CUT] {
        assert!(
            chunks.get(&partition).is_some_and(|keys| keys.len() >= 3),
            "partition {partition} spans fewer than 3 chunks: {chunks:?}"
        );
    }
    // A byte in the middle of a middle chunk's value: its checksum no longer matches.
    let key = &chunks[&CORRUPTED][chunks[&CORRUPTED].len() / 2];
    let mut bytes = db.get(key).expect("get").expect("present").to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    db.insert(key, bytes).expect("insert");
    // A middle chunk gone while the partition's state still counts it.
    db.remove(&chunks[&HOLED][chunks[&HOLED].len() / 2])
        .expect("remove");
    // The last chunk gone: the chain ends before the state's fetched end.
    db.remove(chunks[&CUT].last().expect("chunks"))
        .expect("remove");
    db.flush().expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_partitions_are_refetched_and_the_rest_keeps_flowing() {
    let kafka = Kafka::connect();
    let topic = unique("damaged-buffer");
    let group = unique("damaged-buffer-group");
    kafka.create_topic(&topic, PARTITIONS).await;
    kafka
        .produce_values(&topic, PARTITIONS, PER_PARTITION, value)
        .await;
    kafka.commit_as_operator(&group, &topic, &[0; PARTITIONS as usize]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = test_config(dir.path(), Mode::Off, 100);

    // The first life buffers every record, processes none, and closes: its buffer writes
    // what it held in memory to disk (a crash would lose that, and leave nothing to damage).
    let first =
        CatchupConsumer::new(&kafka.consumer_config(&group), config.clone()).expect("consumer");
    first.subscribe(&[&topic]).expect("subscribe");
    support::wait_until_buffered(&first, PARTITIONS as usize, PER_PARTITION).await;
    first.close().await.expect("close");
    drop(first);
    damage(dir.path());

    // The second life: every offset of every partition, with the produced content.
    let second = CatchupConsumer::new(&kafka.consumer_config(&group), config).expect("consumer");
    let mut events = second.events();
    second.subscribe(&[&topic]).expect("subscribe");
    let mut seen: BTreeSet<(i32, i64)> = BTreeSet::new();
    let total = (PARTITIONS as i64 * PER_PARTITION) as usize;
    while seen.len() < total {
        let delivery = tokio::time::timeout(WAIT, second.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {total} offsets delivered in time", seen.len()))
            .expect("recv never fails on a damaged partition");
        assert_eq!(
            delivery.payload.as_deref(),
            Some(value(delivery.partition, delivery.offset).as_bytes()),
            "{}/{} carries the produced value",
            delivery.partition,
            delivery.offset
        );
        second.ack(&delivery);
        seen.insert((delivery.partition, delivery.offset));
    }
    second.commit().await.expect("commit");

    let mut discarded = BTreeMap::new();
    while let Ok(event) = events.try_recv() {
        if let Event::LocalDiscarded {
            partition, reason, ..
        } = event
        {
            discarded.insert(partition, reason);
        }
    }
    assert!(
        !discarded.contains_key(&INTACT),
        "the intact partition was read from the buffer, not discarded: {discarded:?}"
    );
    assert!(
        discarded.keys().copied().eq([CORRUPTED, HOLED, CUT]),
        "the damaged partitions were discarded: {discarded:?}"
    );
    assert!(
        discarded[&CORRUPTED].contains("damaged") && discarded[&CORRUPTED].contains("checksum"),
        "{discarded:?}"
    );
    for partition in [HOLED, CUT] {
        assert!(
            discarded[&partition].contains("damaged") && discarded[&partition].contains("missing"),
            "{discarded:?}"
        );
    }
    second.close().await.expect("close");
    assert_eq!(
        kafka.committed(&group, &topic, PARTITIONS),
        vec![Some(PER_PARTITION); PARTITIONS as usize],
        "everything processed is committed"
    );
}
