//! Reads racing the memory tier's spills and the commits that drop what it holds: a writer
//! appends to three partitions with room in memory for a few appends only, so nearly every
//! append spills the largest lane's oldest appends to sled while a reader reads the same lanes
//! — from sled, then on from memory, the spill free to move records between the two — and a
//! third thread commits what the reader has read. Every batch the reader takes must hold
//! exactly the offsets of its range: none skipped, none twice. Then the memory is dropped as a
//! crash drops it, and the buffer opened again must hold a gapless run of each lane from its
//! commit to the end its state records.
//!
//! `CATCHUP_TIER_ROUNDS=N` sets the number of rounds (8 by default).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::thread;

use catchup::store::{Buffer, BufferOptions, Fetched, Lane, PartitionLayout, Record, Timestamp};

const TOPIC: &str = "tier";
const PARTITIONS: i32 = 3;
/// Records per append, and appends per partition in a round.
const BATCH: i64 = 40;
const APPENDS: i64 = 150;
/// How many appends the writer stays ahead of the reader, per partition: more than memory
/// holds, so that what the reader takes next is often spilled.
const AHEAD: i64 = 6;
/// Records a read asks for: not a multiple of an append, so reads stop inside them.
const READ: usize = 29;

fn record(offset: i64) -> Record {
    Record {
        offset,
        timestamp: Timestamp::CreateTime(offset),
        key: None,
        payload: Some(offset.to_be_bytes().repeat(4).into()),
        headers: Vec::new(),
    }
}

/// Appends `offsets` to `partition` as a fetcher would: continuing from where the lane
/// stands, under its current layout.
fn append(buffer: &Buffer, partition: i32, offsets: std::ops::Range<i64>) {
    let layout = buffer
        .layout_id(TOPIC, partition)
        .expect("layout id")
        .expect("laid out");
    let records: Vec<Record> = offsets.clone().map(record).collect();
    let outcome = buffer
        .append(
            Lane::Live,
            TOPIC,
            partition,
            Fetched {
                layout,
                continues_from: offsets.start,
                records: &records,
                next: offsets.end,
            },
        )
        .expect("append");
    assert!(outcome.relief_failed.is_none(), "a spill failed");
}

#[test]
fn reads_racing_spills_and_commits_hold_exactly_the_offsets_appended() {
    let rounds: u32 = std::env::var("CATCHUP_TIER_ROUNDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(8);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("buf");
    // Small chunks, so that an append is several and a read can end between them; memory for
    // about three appends (a record of this size counts about 160 bytes). With room for less
    // than one, every append spilled itself before a reader could see it in memory, and a
    // read of memory that skipped what a spill moved to sled meanwhile went unnoticed.
    let options = BufferOptions {
        chunk_target_bytes: 256,
        memory_bytes: 3 * BATCH as u64 * 160,
        ..BufferOptions::default()
    };
    let end = BATCH * APPENDS;
    let (mut reads, mut reads_with_records, mut memory_seen, mut spilled) = (0u64, 0, 0, 0);
    for round in 0..rounds {
        let buffer = Arc::new(Buffer::open(&path, options.clone()).expect("open"));
        let spilled_before = buffer.spilled_bytes();
        // Each round lays the lanes out afresh above the last round's, over what it left.
        let base = i64::from(round) * end;
        for partition in 0..PARTITIONS {
            buffer
                .reset_partition(TOPIC, partition, PartitionLayout::plain(base))
                .expect("lay out");
        }
        let done = Arc::new(AtomicBool::new(false));
        let read_next: Arc<Vec<AtomicI64>> =
            Arc::new((0..PARTITIONS).map(|_| AtomicI64::new(base)).collect());
        let writer = {
            let (buffer, read_next) = (Arc::clone(&buffer), Arc::clone(&read_next));
            thread::spawn(move || {
                for start in (base..base + end).step_by(BATCH as usize) {
                    // Unequal lanes: partition p gets its append only every p + 1 turns
                    // ahead of the others' reads, so the largest lane changes.
                    for partition in 0..PARTITIONS {
                        let index = partition as usize;
                        while read_next[index].load(Ordering::Acquire)
                            < start - AHEAD * BATCH * i64::from(partition + 1)
                        {
                            thread::yield_now();
                        }
                        append(&buffer, partition, start..start + BATCH);
                    }
                }
            })
        };
        let committer = {
            let (buffer, done, read_next) = (
                Arc::clone(&buffer),
                Arc::clone(&done),
                Arc::clone(&read_next),
            );
            thread::spawn(move || {
                let mut committed = vec![base; PARTITIONS as usize];
                while !done.load(Ordering::Acquire) {
                    for partition in 0..PARTITIONS {
                        let index = partition as usize;
                        let read = read_next[index].load(Ordering::Acquire);
                        // Half of what was read, so that the reader works past the commit.
                        let to = committed[index] + (read - committed[index]) / 2;
                        if to > committed[index] {
                            buffer
                                .record_committed(Lane::Live, TOPIC, partition, to)
                                .expect("commit");
                            committed[index] = to;
                        }
                    }
                    thread::yield_now();
                }
            })
        };
        let mut next = vec![base; PARTITIONS as usize];
        while next.iter().any(|&at| at < base + end) {
            for partition in 0..PARTITIONS {
                let index = partition as usize;
                let from = next[index];
                let batch = buffer
                    .read(Lane::Live, TOPIC, partition, from, READ)
                    .expect("read");
                reads += 1;
                memory_seen += u64::from(buffer.memory_held() > 0);
                let read: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
                let expected: Vec<i64> = (from..batch.next).collect();
                assert_eq!(
                    read, expected,
                    "round {round}, partition {partition}: a read from {from} must hold \
                     exactly the offsets up to {}",
                    batch.next
                );
                assert!(batch.next >= from, "a read went back");
                for record in &batch.records {
                    assert_eq!(
                        record.payload.as_deref(),
                        record_payload(record.offset).as_deref(),
                        "offset {} holds another record's value",
                        record.offset
                    );
                }
                reads_with_records += u64::from(!read.is_empty());
                next[index] = batch.next;
                read_next[index].store(batch.next, Ordering::Release);
            }
        }
        writer.join().expect("writer");
        done.store(true, Ordering::Release);
        committer.join().expect("committer");
        assert_eq!(next, vec![base + end; PARTITIONS as usize]);
        spilled += buffer.spilled_bytes() - spilled_before;
        assert!(
            buffer.spilled_bytes() > spilled_before,
            "round {round}: nothing was spilled"
        );

        // A crash: what memory holds is gone, sled keeps what was spilled.
        buffer.forget_memory();
        drop(buffer);
        let reopened = Buffer::open(&path, options.clone()).expect("open again");
        for partition in 0..PARTITIONS {
            let state = reopened
                .partition_state(TOPIC, partition)
                .expect("state")
                .expect("laid out");
            let (committed, fetched) = (state.live.committed_next, state.live.fetched_next);
            assert!(
                base <= committed && committed <= fetched && fetched <= base + end,
                "round {round}, partition {partition}: committed {committed}, fetched {fetched}"
            );
            let batch = reopened
                .read(Lane::Live, TOPIC, partition, committed, usize::MAX)
                .expect("read what sled kept");
            let read: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
            assert_eq!(
                read,
                (committed..fetched).collect::<Vec<_>>(),
                "round {round}, partition {partition}: sled holds its lane from the commit \
                 to the end its state records, gapless"
            );
        }
        drop(reopened);
    }
    assert!(memory_seen > 0, "the memory tier held nothing at any read");
    eprintln!(
        "{rounds} rounds: {reads} reads racing spills and commits ({reads_with_records} with \
         records, {memory_seen} while memory held appends; {spilled} bytes spilled), no offset \
         skipped or repeated"
    );
}

fn record_payload(offset: i64) -> Option<Vec<u8>> {
    record(offset).payload.map(|payload| payload.to_vec())
}
