//! Reads racing the memory tier's spills and the commits that drop what it holds: a writer
//! appends to three partitions with room in memory for a few appends only, so nearly every
//! append spills the largest lane's oldest appends to sled while a reader reads the same lanes
//! at unequal rates — from sled, then on from memory, the spill free to move records between
//! the two — and a third thread commits what the reader has read. Every batch the reader takes must hold
//! exactly the offsets of its range: none skipped, none twice. Then the memory is dropped as a
//! crash drops it, and the buffer opened again must hold a gapless run of each lane from its
//! commit to the end its state records.
//!
//! `CATCHUP_TIER_ROUNDS=N` sets the number of rounds (8 by default).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::thread;

use catchup::store::{Buffer, BufferOptions, Lane, PartitionLayout};

#[path = "live_appends.rs"]
mod live_appends;

const TOPIC: &str = "tier";
const PARTITIONS: i32 = 3;
/// Records per append, and appends per partition in a round.
const BATCH: i64 = 40;
const APPENDS: i64 = 150;
/// How many appends the writer may run ahead of the reader of partition 0 (of partition p,
/// p + 1 times as many): more than memory holds, so that what a reader takes next is often
/// spilled.
const AHEAD: i64 = 6;
/// Records a read asks for: not a multiple of an append, so reads stop inside them.
const READ: usize = 29;
/// A record's value is its offset's 8 bytes four times over.
const COPIES: usize = 4;

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
        let writer_ended = Arc::new(AtomicBool::new(false));
        let read_next: Arc<Vec<AtomicI64>> =
            Arc::new((0..PARTITIONS).map(|_| AtomicI64::new(base)).collect());
        let writer = {
            let (buffer, read_next, ended) = (
                Arc::clone(&buffer),
                Arc::clone(&read_next),
                Arc::clone(&writer_ended),
            );
            thread::spawn(move || {
                let _ended = live_appends::RaisedWhenDropped(ended);
                for start in (base..base + end).step_by(BATCH as usize) {
                    for partition in 0..PARTITIONS {
                        let index = partition as usize;
                        while read_next[index].load(Ordering::Acquire)
                            < start - AHEAD * BATCH * i64::from(partition + 1)
                        {
                            thread::yield_now();
                        }
                        let outcome = live_appends::append(
                            &buffer,
                            TOPIC,
                            partition,
                            start..start + BATCH,
                            COPIES,
                        );
                        assert!(outcome.relief_failed.is_none(), "a spill failed");
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
        // Partition p is read every p + 1 passes, so the lanes wait unequally and the one
        // the tier spills (the largest) changes.
        let (mut pass, mut idle_since_writer_ended) = (0u64, 0u32);
        while next.iter().any(|&at| at < base + end) {
            pass += 1;
            // Once the writer has ended (a failed append panics it), every pass reads what
            // it appended: a dozen passes finding nothing (each partition read four times)
            // end the loop, and the writer is joined below, so that the test fails instead
            // of waiting for appends that never come.
            if writer_ended.load(Ordering::Acquire) {
                idle_since_writer_ended += 1;
                if idle_since_writer_ended > 12 {
                    break;
                }
            }
            for partition in 0..PARTITIONS {
                if pass % (partition as u64 + 1) != 0 {
                    continue;
                }
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
                        live_appends::record(record.offset, COPIES)
                            .payload
                            .as_deref(),
                        "offset {} holds another record's value",
                        record.offset
                    );
                }
                if !read.is_empty() {
                    reads_with_records += 1;
                    idle_since_writer_ended = 0;
                }
                next[index] = batch.next;
                read_next[index].store(batch.next, Ordering::Release);
            }
        }
        done.store(true, Ordering::Release);
        writer.join().expect("writer");
        committer.join().expect("committer");
        assert_eq!(
            next,
            vec![base + end; PARTITIONS as usize],
            "round {round}: the reader stalled"
        );
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
