//! Reads at the tail of a lane while another thread appends to it, on a lane laid out again
//! below thousands of chunks it once held (sled keeps separators of the deleted keys in its
//! tree, which is what lets an iterator that started before an append see the append's later
//! chunk and miss its earlier one). Every batch the reader takes must hold exactly the offsets
//! appended in its range: none skipped, none twice, nothing past what was appended.
//!
//! `CATCHUP_TAIL_ROUNDS=N` sets the number of rounds (8 by default).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::thread;

use catchup::store::{Buffer, BufferOptions, Lane, PartitionLayout};

#[path = "live_appends.rs"]
mod live_appends;

/// The value of a record is its offset's 8 bytes.
const COPIES: usize = 1;

const TOPIC: &str = "tail";
/// Chunks the lane held before it was laid out again.
const OLD_CHUNKS: i64 = 20_000;
/// Chunks per append, as a catch-up round of 2,000 messages makes of 32 KiB chunks.
const BATCH_CHUNKS: i64 = 60;

#[test]
fn tail_reads_hold_exactly_the_offsets_appended() {
    let rounds: u32 = std::env::var("CATCHUP_TAIL_ROUNDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(8);
    let dir = tempfile::tempdir().expect("tempdir");
    // One record per chunk: every append writes BATCH_CHUNKS keys.
    let options = BufferOptions {
        chunk_target_bytes: 1,
        ..BufferOptions::default()
    };
    let buffer = Arc::new(Buffer::open(dir.path().join("buf"), options).expect("open"));
    let (mut tail_reads, mut reads_with_records) = (0u64, 0u64);
    for round in 0..rounds {
        // The lane once held chunks far above where it is laid out again; each round lays
        // it out a little higher, so new appends cross separators of every earlier round.
        let base = i64::from(round) * 1_000;
        buffer
            .reset_partition(TOPIC, 0, PartitionLayout::plain(base))
            .expect("lay out");
        let old_end = base + OLD_CHUNKS;
        for start in (base..old_end).step_by(1_000) {
            live_appends::append(
                &buffer,
                TOPIC,
                0,
                start..(start + 1_000).min(old_end),
                COPIES,
            );
        }
        buffer
            .reset_partition(TOPIC, 0, PartitionLayout::plain(base))
            .expect("lay out again");

        // The writer stays at most one batch ahead of the reader, so that the reader's reads
        // keep running into the batch being appended.
        let done = Arc::new(AtomicBool::new(false));
        let read_next = Arc::new(AtomicI64::new(base));
        let writer = {
            let (buffer, done, read_next) = (
                Arc::clone(&buffer),
                Arc::clone(&done),
                Arc::clone(&read_next),
            );
            thread::spawn(move || {
                let _ended = live_appends::RaisedWhenDropped(done);
                for start in (base..old_end).step_by(BATCH_CHUNKS as usize) {
                    while read_next.load(Ordering::Acquire) < start - BATCH_CHUNKS {
                        thread::yield_now();
                    }
                    live_appends::append(
                        &buffer,
                        TOPIC,
                        0,
                        start..(start + BATCH_CHUNKS).min(old_end),
                        COPIES,
                    );
                }
            })
        };
        let mut next = base;
        while next < old_end {
            let finished = done.load(Ordering::Acquire);
            let batch = buffer
                .read(Lane::Live, TOPIC, 0, next, usize::MAX)
                .expect("read");
            tail_reads += 1;
            let read: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
            let expected: Vec<i64> = (next..batch.next).collect();
            assert_eq!(
                read, expected,
                "round {round}: a read from {next} must hold exactly the offsets up to {}",
                batch.next
            );
            if !read.is_empty() {
                reads_with_records += 1;
            }
            assert!(
                batch.next > next || !finished,
                "round {round}: the writer ended (or failed) and the read from {next} stayed there"
            );
            next = batch.next;
            read_next.store(next, Ordering::Release);
        }
        writer.join().expect("writer");
        assert_eq!(next, old_end);
    }
    eprintln!(
        "{rounds} rounds of {OLD_CHUNKS} chunks laid out again: {tail_reads} tail reads, \
         {reads_with_records} with records, no offset skipped"
    );
}
