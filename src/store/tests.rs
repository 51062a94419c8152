//! Behaviour of the buffer through its public operations, on a real sled database.

use super::*;
use open::largest_chunk_without_blobs;
use std::collections::BTreeSet;

fn record(offset: i64) -> Record {
    Record {
        offset,
        timestamp: Timestamp::CreateTime(1_700_000_000_000 + offset),
        key: Some(format!("k{offset}").into_bytes().into()),
        payload: Some(vec![offset as u8; 100].into()),
        headers: vec![Header {
            key: "h".into(),
            value: None,
        }],
    }
}

fn records(offsets: std::ops::Range<i64>) -> Vec<Record> {
    offsets.map(record).collect()
}

fn offsets(batch: &ReadBatch) -> Vec<i64> {
    batch.records.iter().map(|r| r.offset).collect()
}

/// Appends as a fetcher that continued from wherever the lane stands.
/// The offsets of partition `t/0`'s catch-up lane read from `range.start`, read after read
/// until a read ends at or past `range.end`.
fn catchup_offsets(buffer: &Buffer, range: std::ops::Range<i64>) -> Vec<i64> {
    let mut read = Vec::new();
    let mut from = range.start;
    while from < range.end {
        let batch = buffer
            .read(Lane::Catchup, "t", 0, from, 1_000)
            .expect("read");
        read.extend(offsets(&batch));
        from = batch.next;
    }
    read
}

fn append(
    buffer: &Buffer,
    lane: Lane,
    topic: &str,
    partition: i32,
    records: &[Record],
    next: i64,
) -> Result<AppendOutcome, StoreError> {
    let state = buffer.partition_state(topic, partition)?;
    let layout = buffer.layout_id(topic, partition)?.unwrap_or(LayoutId(0));
    buffer.append(
        lane,
        topic,
        partition,
        Fetched {
            layout,
            continues_from: state.map_or(0, |s| s.lane(lane).fetched_next),
            records,
            next,
        },
    )
}

fn open(dir: &tempfile::TempDir) -> Buffer {
    Buffer::open(dir.path().join("buf"), BufferOptions::default()).expect("open buffer")
}

/// A buffer with `t`/0 laid out plain from offset 0.
fn open_plain(dir: &tempfile::TempDir) -> Buffer {
    let buffer = open(dir);
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    buffer
}

#[test]
fn append_read_commit_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    buffer
        .reset_partition("t", 0, PartitionLayout::split(1, 70, 120))
        .expect("layout");
    assert_eq!(
        append(&buffer, Lane::Catchup, "t", 0, &records(70..100), 100)
            .expect("append")
            .stored,
        30
    );
    assert_eq!(
        append(&buffer, Lane::Live, "t", 0, &records(120..125), 125)
            .expect("append")
            .stored,
        5
    );

    // Ordered: catch-up first; the live lane waits until the catch-up ranges are read through.
    let batch = buffer.read_ordered("t", 0, 70, 1000).expect("read");
    assert_eq!(
        (batch.lane, offsets(&batch), batch.next),
        (Lane::Catchup, (70..100).collect(), 100)
    );
    assert!(
        buffer
            .read_ordered("t", 0, 100, 1000)
            .expect("read")
            .records
            .is_empty()
    );
    append(&buffer, Lane::Catchup, "t", 0, &records(100..121), 121).expect("append");
    let batch = buffer.read_ordered("t", 0, 100, 1000).expect("read");
    assert_eq!((offsets(&batch), batch.next), ((100..120).collect(), 120));
    let batch = buffer.read_ordered("t", 0, 120, 1000).expect("read");
    assert_eq!(
        (batch.lane, offsets(&batch)),
        (Lane::Live, (120..125).collect())
    );

    // A commit inside a chunk keeps it; a commit past it deletes it.
    assert_eq!(
        buffer
            .record_committed(Lane::Catchup, "t", 0, 90)
            .expect("commit"),
        0
    );
    assert_eq!(
        offsets(&buffer.read(Lane::Catchup, "t", 0, 0, 1000).expect("read")),
        (90..120).collect::<Vec<_>>()
    );
    assert_eq!(
        buffer
            .record_committed(Lane::Catchup, "t", 0, 100)
            .expect("commit"),
        1
    );
    let state = buffer
        .partition_state("t", 0)
        .expect("state")
        .expect("laid out");
    assert_eq!(state.catchup.retained_from, 100);
    assert!(state.catchup_fetched() && !state.catchup_committed());
    assert_eq!(
        buffer
            .record_committed(Lane::Catchup, "t", 0, 120)
            .expect("commit"),
        1
    );
    let state = buffer
        .partition_state("t", 0)
        .expect("state")
        .expect("laid out");
    assert!(state.catchup_committed());
    assert!(
        buffer
            .read(Lane::Catchup, "t", 0, 0, 1000)
            .expect("read")
            .records
            .is_empty()
    );
    assert_eq!(buffer.verify().expect("verify"), vec![]);
}

#[test]
fn appends_must_continue_from_fetched_next_under_the_current_layout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    buffer
        .reset_partition("t", 3, PartitionLayout::plain(0))
        .expect("layout");
    let layout = buffer.layout_id("t", 3).expect("id").expect("laid out");
    fn fetched(layout: LayoutId, continues_from: i64, batch: &[Record], next: i64) -> Fetched<'_> {
        Fetched {
            layout,
            continues_from,
            records: batch,
            next,
        }
    }
    let first = records(0..50);
    buffer
        .append(Lane::Live, "t", 3, fetched(layout, 0, &first, 50))
        .expect("append");
    // Partitions only: sled's background flush may change the bytes on disk meanwhile.
    let before = buffer.stats().expect("stats").partitions;
    // A batch that starts past fetched_next: the offsets in between were never proven empty.
    let ahead = records(60..70);
    assert!(matches!(
        buffer.append(Lane::Live, "t", 3, fetched(layout, 60, &ahead, 70)),
        Err(StoreError::Discontinuous {
            continues_from: 60,
            fetched_next: 50,
            ..
        })
    ));
    // A batch that claims to continue from an older position (a refetch the fetcher did not
    // reposition for) is refused too, and so is a gap claimed from a stale position.
    let again = records(40..60);
    assert!(matches!(
        buffer.append(Lane::Live, "t", 3, fetched(layout, 40, &again, 60)),
        Err(StoreError::Discontinuous { .. })
    ));
    assert!(matches!(
        buffer.append(Lane::Live, "t", 3, fetched(layout, 45, &[], 90)),
        Err(StoreError::Discontinuous { .. })
    ));
    // Records below the offset the batch continues from do not belong to it.
    assert!(matches!(
        buffer.append(Lane::Live, "t", 3, fetched(layout, 50, &again, 60)),
        Err(StoreError::Rejected { .. })
    ));
    assert_eq!(buffer.stats().expect("stats").partitions, before);
    // A compaction gap the fetcher proved (50..55 absent) is stored as covered.
    let after_gap = records(55..60);
    assert_eq!(
        buffer
            .append(Lane::Live, "t", 3, fetched(layout, 50, &after_gap, 60))
            .expect("append")
            .fetched_next,
        60
    );

    // Re-laid out (or discarded): a writer still positioned under the old layout is stale.
    buffer
        .reset_partition("t", 3, PartitionLayout::plain(60))
        .expect("layout");
    let stale = records(60..61);
    let err = buffer
        .append(Lane::Live, "t", 3, fetched(layout, 60, &stale, 61))
        .expect_err("stale layout");
    assert!(matches!(err, StoreError::StaleLayout { .. }), "{err}");
    assert!(err.to_string().contains("refused"), "{err}");
    let current = buffer.layout_id("t", 3).expect("id").expect("laid out");
    assert_ne!(current, layout);
    buffer.discard_partition("t", 3).expect("discard");
    assert_eq!(buffer.layout_id("t", 3).expect("id"), None);
    // Discarded and not laid out again yet (its reconciliation waits): a writer of the
    // discarded layout is told it is stale, so that it leaves, not that the partition is
    // missing (an error it would retry).
    let err = buffer
        .append(Lane::Live, "t", 3, fetched(current, 60, &stale, 61))
        .expect_err("stale layout");
    assert!(matches!(err, StoreError::StaleLayout { .. }), "{err}");
    assert_eq!(buffer.verify().expect("verify"), vec![]);
}

#[test]
fn large_batches_are_cut_into_bounded_chunks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = BufferOptions {
        chunk_target_bytes: 4096,
        ..BufferOptions::default()
    };
    let buffer = Buffer::open(dir.path(), options).expect("open");
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    append(&buffer, Lane::Live, "t", 0, &records(0..1000), 1000).expect("append");
    let stats = buffer.stats().expect("stats");
    let live = &stats.partitions[0].lanes[1];
    assert!(live.chunks > 20, "{} chunks", live.chunks);
    assert!(
        live.bytes / live.chunks <= 4096 + 256,
        "{} bytes per chunk",
        live.bytes / live.chunks
    );
    assert_eq!(
        (live.records, live.first_offset, live.last_offset),
        (1000, Some(0), Some(999))
    );
    // A commit in the middle deletes exactly the chunks below it.
    buffer
        .record_committed(Lane::Live, "t", 0, 500)
        .expect("commit");
    let batch = buffer
        .read(Lane::Live, "t", 0, 500, usize::MAX)
        .expect("read");
    assert_eq!(offsets(&batch), (500..1000).collect::<Vec<_>>());
    assert!(buffer.stats().expect("stats").partitions[0].lanes[1].records < 1000);
    assert_eq!(buffer.verify().expect("verify"), vec![]);
}

#[test]
fn catchup_lane_keeps_only_its_ranges_and_gaps_are_covered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    let layout = PartitionLayout {
        epoch: 4,
        catchup_ranges: vec![OffsetRange::new(10, 20), OffsetRange::new(30, 40)],
        live_from: 40,
    };
    buffer.reset_partition("t", 0, layout).expect("layout");
    // A compacted log: only even offsets exist; the fetch overshoots the first range.
    let evens: Vec<Record> = (10..24).step_by(2).map(record).collect();
    let outcome = append(&buffer, Lane::Catchup, "t", 0, &evens, 23).expect("append");
    assert_eq!(
        (outcome.stored, outcome.stored_bytes, outcome.fetched_next),
        (
            5,
            evens.iter().map(|r| r.payload_bytes() as u64).take(5).sum(),
            30
        )
    );
    assert!(outcome.relief_failed.is_none());
    // Transaction markers only at the end of the second range.
    append(&buffer, Lane::Catchup, "t", 0, &records(30..35), 35).expect("append");
    append(&buffer, Lane::Catchup, "t", 0, &[], 40).expect("append");
    assert!(
        buffer
            .partition_state("t", 0)
            .expect("state")
            .expect("laid out")
            .catchup_fetched()
    );
    let mut from = 0;
    let mut seen = Vec::new();
    loop {
        let batch = buffer.read_ordered("t", 0, from, 3).expect("read");
        if batch.records.is_empty() && batch.lane == Lane::Live {
            break;
        }
        seen.extend(offsets(&batch));
        from = batch.next;
    }
    assert_eq!(seen, vec![10, 12, 14, 16, 18, 30, 31, 32, 33, 34]);
    assert_eq!(buffer.verify().expect("verify"), vec![]);
}

#[test]
fn rejects_calls_that_do_not_fit_the_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    let err = append(&buffer, Lane::Live, "t", 0, &records(0..1), 1).expect_err("no layout");
    assert!(err.to_string().contains("reset_partition"), "{err}");
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    append(&buffer, Lane::Live, "t", 0, &records(0..10), 10).expect("append");
    assert!(matches!(
        buffer.record_committed(Lane::Live, "t", 0, 11),
        Err(StoreError::Rejected { .. })
    ));
    assert!(matches!(
        append(&buffer, Lane::Live, "t", -1, &[], 1),
        Err(StoreError::Rejected { .. })
    ));
    let unordered = vec![record(12), record(11)];
    assert!(matches!(
        append(&buffer, Lane::Live, "t", 0, &unordered, 13),
        Err(StoreError::Rejected { .. })
    ));
    assert_eq!(buffer.verify().expect("verify"), vec![]);
}

#[test]
fn survives_reopen_and_discard() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let buffer = open(&dir);
        for partition in 0..3 {
            buffer
                .reset_partition("orders", partition, PartitionLayout::split(1, 0, 10))
                .expect("layout");
            append(
                &buffer,
                Lane::Catchup,
                "orders",
                partition,
                &records(0..10),
                10,
            )
            .expect("append");
        }
        buffer
            .reset_partition("payments", 0, PartitionLayout::plain(5))
            .expect("layout");
        buffer.sync().expect("sync");
    }
    let buffer = open(&dir);
    let partitions: Vec<(String, i32)> = buffer
        .partitions()
        .expect("partitions")
        .into_iter()
        .map(|(t, p, _)| (t, p))
        .collect();
    assert_eq!(
        partitions,
        vec![
            ("orders".into(), 0),
            ("orders".into(), 1),
            ("orders".into(), 2),
            ("payments".into(), 0)
        ]
    );
    assert!(buffer.discard_partition("orders", 1).expect("discard"));
    assert!(
        !buffer
            .discard_partition("orders", 1)
            .expect("discard again")
    );
    assert!(
        !buffer
            .discard_partition("unknown", 0)
            .expect("discard unknown")
    );
    assert!(
        buffer
            .read(Lane::Catchup, "orders", 1, 0, 100)
            .expect("read")
            .records
            .is_empty()
    );
    assert_eq!(
        buffer
            .read(Lane::Catchup, "orders", 2, 0, 100)
            .expect("read")
            .records
            .len(),
        10
    );
    assert_eq!(buffer.verify().expect("verify"), vec![]);
}

#[test]
fn directory_is_private_and_locked() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested").join("buf");
    let buffer = Buffer::open(&path, BufferOptions::default()).expect("open");
    let mode = std::fs::metadata(&path)
        .expect("metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let short_wait = BufferOptions {
        lock_wait: std::time::Duration::from_millis(50),
        ..BufferOptions::default()
    };
    let second = Buffer::open(&path, short_wait);
    assert!(
        matches!(second, Err(StoreError::Locked { .. })),
        "{second:?}"
    );
    drop(buffer);
    Buffer::open(&path, BufferOptions::default()).expect("reopen after drop");
}

#[test]
fn open_existing_rejects_what_is_not_a_buffer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = Buffer::open_existing(dir.path().join("nope"), BufferOptions::default());
    assert!(
        matches!(missing, Err(StoreError::Missing { .. })),
        "{missing:?}"
    );
    let empty = Buffer::open_existing(dir.path(), BufferOptions::default());
    assert!(
        matches!(empty, Err(StoreError::NotABuffer { .. })),
        "{empty:?}"
    );
    std::fs::write(dir.path().join("conf"), b"garbage").expect("write");
    std::fs::write(dir.path().join("db"), vec![0xAB; 4096]).expect("write");
    let garbage = Buffer::open_existing(dir.path(), BufferOptions::default());
    assert!(garbage.is_err(), "garbage opened");
    let foreign = tempfile::tempdir().expect("tempdir");
    sled::open(foreign.path())
        .and_then(|db| db.insert(b"x", b"y").map(|_| ()))
        .expect("plain sled db");
    let foreign = Buffer::open_existing(foreign.path(), BufferOptions::default());
    assert!(
        matches!(foreign, Err(StoreError::NotABuffer { .. })),
        "{foreign:?}"
    );
}

#[test]
fn newer_format_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let buffer = open(&dir);
        let mut meta = codec::encode(&BufferMeta { next_topic_id: 0 });
        meta[0] = FORMAT_VERSION + 1;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&meta[..1]), &meta[5..]);
        meta[1..5].copy_from_slice(&crc.to_le_bytes());
        buffer
            .db()
            .expect("open")
            .insert(keys::META, meta)
            .expect("insert");
        buffer.sync().expect("sync");
    }
    let err =
        Buffer::open(dir.path().join("buf"), BufferOptions::default()).expect_err("newer format");
    assert!(
        matches!(err, StoreError::NewerFormat { found, .. } if found == FORMAT_VERSION + 1),
        "{err}"
    );
    assert!(err.to_string().contains("buf"), "{err}");
}

#[test]
fn verify_reports_damage_holes_and_orphans() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    for first in [0, 10, 20, 30] {
        append(
            &buffer,
            Lane::Live,
            "t",
            0,
            &records(first..first + 10),
            first + 10,
        )
        .expect("append");
    }
    let part = PartitionKey {
        topic_id: 0,
        partition: 0,
    };
    // A flipped byte in the last chunk, a missing chunk before an intact one, a chunk of
    // nobody. The damaged chunk is left out of the chain, so only the removal makes the hole.
    let last = keys::chunk(Lane::Live, part, 30);
    let mut value = buffer
        .db()
        .expect("open")
        .get(last)
        .expect("get")
        .expect("chunk")
        .to_vec();
    value[20] ^= 0x40;
    buffer
        .db()
        .expect("open")
        .insert(last, value)
        .expect("insert");
    buffer
        .db()
        .expect("open")
        .remove(keys::chunk(Lane::Live, part, 10))
        .expect("remove");
    let orphan = keys::chunk(
        Lane::Catchup,
        PartitionKey {
            topic_id: 0,
            partition: 9,
        },
        0,
    );
    craft_chunk(&buffer, orphan, 1, vec![record(0)]);
    let findings = buffer.verify().expect("verify");
    let text: Vec<String> = findings.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|f| f.contains("t/0 live chunk @30") && f.contains("checksum")),
        "{text:?}"
    );
    assert!(
        text.contains(&"t/0 live lane: hole: a chunk starts at 20, expected 10".to_owned()),
        "{text:?}"
    );
    assert!(
        text.iter().any(|f| f.contains("no laid-out partition")),
        "{text:?}"
    );
}

/// Stores a chunk under `key` as written, valid checksum included, whatever it holds (a
/// crafted or miswritten chunk).
fn craft_chunk(buffer: &Buffer, key: [u8; 17], next: u64, records: Vec<Record>) {
    buffer
        .db()
        .expect("open")
        .insert(key, codec::encode(&record::Chunk { next, records }))
        .expect("insert");
}

/// Overwrites the stored state of `t`/0 with `change` applied (a damaged or crafted state).
fn craft_state(buffer: &Buffer, change: impl FnOnce(&mut PartitionState)) {
    let mut state = buffer
        .partition_state("t", 0)
        .expect("state")
        .expect("laid out");
    change(&mut state);
    let part = buffer.partition_key("t", 0).expect("key").expect("known");
    buffer
        .db()
        .expect("open")
        .insert(keys::state(part), codec::encode(&state))
        .expect("insert");
}

fn verify_text(buffer: &Buffer) -> Vec<String> {
    let findings = buffer.verify().expect("verify");
    findings.iter().map(ToString::to_string).collect()
}

#[test]
fn verify_reports_unprocessed_records_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    append(&buffer, Lane::Live, "t", 0, &records(0..10), 10).expect("append");
    append(&buffer, Lane::Live, "t", 0, &records(10..20), 20).expect("append");
    assert_eq!(verify_text(&buffer), Vec::<String>::new());
    // Records 0..10 gone while only 0..5 were committed: the chain alone cannot tell, since
    // it starts at retained_from.
    buffer
        .db()
        .expect("open")
        .remove(keys::chunk(
            Lane::Live,
            buffer.partition_key("t", 0).expect("key").expect("known"),
            0,
        ))
        .expect("remove");
    craft_state(&buffer, |state| {
        state.live.committed_next = 5;
        state.live.retained_from = 10;
    });
    let text = verify_text(&buffer);
    assert!(
        text.iter().any(
            |f| f.contains("t/0 live lane") && f.contains("deleted before they were processed")
        ),
        "{text:?}"
    );
}

#[test]
fn verify_checks_lanes_against_the_layout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    let layout = PartitionLayout {
        epoch: 1,
        catchup_ranges: vec![OffsetRange::new(0, 10), OffsetRange::new(20, 30)],
        live_from: 40,
    };
    buffer.reset_partition("t", 0, layout).expect("layout");
    append(&buffer, Lane::Catchup, "t", 0, &records(0..10), 10).expect("append");
    append(&buffer, Lane::Live, "t", 0, &records(40..50), 50).expect("append");
    assert_eq!(verify_text(&buffer), Vec::<String>::new());
    let part = buffer.partition_key("t", 0).expect("key").expect("known");
    // A live chunk below live_from, a catch-up chunk across the gap between the ranges.
    craft_chunk(
        &buffer,
        keys::chunk(Lane::Live, part, 35),
        40,
        records(35..40),
    );
    craft_chunk(
        &buffer,
        keys::chunk(Lane::Catchup, part, 5),
        25,
        vec![record(5), record(24)],
    );
    let text = verify_text(&buffer);
    for expected in [
        "t/0 live chunk @35: starts below the live lane's first offset 40",
        "t/0 catchup chunk @5: reaches 25, past the end of its catch-up range",
    ] {
        assert!(
            text.iter().any(|f| f.starts_with(expected)),
            "{expected}: {text:?}"
        );
    }

    // Cursors: negative, inside the gap between the ranges, below the live lane.
    craft_state(&buffer, |state| {
        state.catchup.fetched_next = 15;
        state.live.retained_from = -1;
    });
    let text = verify_text(&buffer);
    for expected in [
        "t/0 catchup lane: a cursor between the catch-up ranges",
        "t/0 live lane: negative cursor",
        "t/0 live lane: cursors below the live lane's first offset 40",
    ] {
        assert!(
            text.iter().any(|f| f.starts_with(expected)),
            "{expected}: {text:?}"
        );
    }
}

#[test]
fn a_chunk_that_does_not_advance_is_damaged_not_an_endless_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    append(&buffer, Lane::Live, "t", 0, &records(0..10), 10).expect("append");
    append(&buffer, Lane::Live, "t", 0, &records(10..20), 20).expect("append");
    let part = buffer.partition_key("t", 0).expect("key").expect("known");
    // A valid checksum over a chunk whose `next` is not past its records: a reader resuming
    // at `next` would read the same records again, forever.
    craft_chunk(
        &buffer,
        keys::chunk(Lane::Live, part, 10),
        5,
        records(10..20),
    );
    let read = buffer.read(Lane::Live, "t", 0, 0, 100);
    assert!(
        matches!(&read, Err(StoreError::Damaged { reason, .. }) if reason.contains("in order inside")),
        "{read:?}"
    );
    let text = verify_text(&buffer);
    assert!(
        text.iter()
            .any(|f| f.starts_with("t/0 live chunk @10: covers no offsets")),
        "{text:?}"
    );
}

#[test]
fn a_topic_id_the_metadata_would_hand_out_again_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    // The metadata rolled back: the next id to allocate is the one `t` holds.
    buffer
        .db()
        .expect("open")
        .insert(keys::META, codec::encode(&BufferMeta { next_topic_id: 0 }))
        .expect("insert");
    let text = verify_text(&buffer);
    assert!(
        text.iter()
            .any(|f| f.starts_with("topic t: id 0 is not below the next id to allocate (0)")),
        "{text:?}"
    );
    let err = buffer
        .reset_partition("u", 0, PartitionLayout::plain(0))
        .expect_err("a second topic under id 0");
    assert!(
        matches!(&err, StoreError::Damaged { reason, .. } if reason.contains("already used by topic t")),
        "{err}"
    );
}

#[test]
fn verify_lists_a_bounded_number_of_findings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    let orphans = MAX_FINDINGS as u64 + 500;
    for first in 0..orphans {
        let key = keys::chunk(
            Lane::Live,
            PartitionKey {
                topic_id: 7,
                partition: 0,
            },
            first,
        );
        craft_chunk(&buffer, key, first + 1, vec![record(first as i64)]);
    }
    let findings = buffer.verify().expect("verify");
    assert_eq!(findings.len(), MAX_FINDINGS + 1);
    assert_eq!(
        findings.last().map(|f| f.problem.clone()),
        Some("500 more finding(s) not listed".to_owned())
    );
}

fn incarnation(buffer: &Buffer, topic: &str, id: &str) -> Option<String> {
    buffer
        .record_incarnation(topic, id, |_| false)
        .expect("record")
}

#[test]
fn a_new_incarnation_of_a_topic_discards_its_partitions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    for (topic, partition) in [("orders", 0), ("orders", 1), ("payments", 0)] {
        buffer
            .reset_partition(topic, partition, PartitionLayout::plain(0))
            .expect("layout");
        append(&buffer, Lane::Live, topic, partition, &records(0..10), 10).expect("append");
    }
    // First sight: recorded, nothing discarded (a buffer from before ids were recorded).
    assert_eq!(incarnation(&buffer, "orders", "id-A"), None);
    assert_eq!(incarnation(&buffer, "orders", "id-A"), None);
    assert_eq!(buffer.partitions().expect("partitions").len(), 3);
    let stale_writer = buffer
        .layout_id("orders", 1)
        .expect("id")
        .expect("laid out");
    // Recreated: both partitions of orders go, payments stays, and so does the new id.
    assert_eq!(
        incarnation(&buffer, "orders", "id-B"),
        Some("id-A".to_owned())
    );
    let left: Vec<(String, i32)> = buffer
        .partitions()
        .expect("partitions")
        .into_iter()
        .map(|(topic, partition, _)| (topic, partition))
        .collect();
    assert_eq!(left, vec![("payments".to_owned(), 0)]);
    assert_eq!(incarnation(&buffer, "orders", "id-B"), None);
    // A writer of the old incarnation is refused.
    buffer
        .reset_partition("orders", 1, PartitionLayout::plain(0))
        .expect("layout");
    let refused = buffer.append(
        Lane::Live,
        "orders",
        1,
        Fetched {
            layout: stale_writer,
            continues_from: 0,
            records: &records(0..5),
            next: 5,
        },
    );
    assert!(
        matches!(refused, Err(StoreError::StaleLayout { .. })),
        "{refused:?}"
    );
    assert!(buffer.verify().expect("verify").is_empty());
    // Partitions the caller keeps (assigned and running) stay.
    append(&buffer, Lane::Live, "orders", 1, &records(0..5), 5).expect("append");
    let kept = buffer.record_incarnation("orders", "id-C", |partition| partition == 1);
    assert_eq!(kept.expect("record"), Some("id-B".to_owned()));
    assert!(
        buffer
            .partition_state("orders", 1)
            .expect("state")
            .is_some()
    );
    assert_eq!(
        incarnation(&buffer, "orders", "id-B"),
        Some("id-C".to_owned())
    );
    // The id survives a reopen.
    drop(buffer);
    let buffer = Buffer::open(dir.path(), BufferOptions::default()).expect("reopen");
    assert_eq!(incarnation(&buffer, "orders", "id-B"), None);
}

#[test]
fn an_untrusted_buffer_starts_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    buffer
        .reset_partition("orders", 0, PartitionLayout::plain(0))
        .expect("layout");
    append(&buffer, Lane::Live, "orders", 0, &records(0..10), 10).expect("append");
    std::fs::write(dir.path().join("buf").join("notes.txt"), b"not ours").expect("write");
    assert!(
        !Buffer::empty_if_untrusted(&dir.path().join("buf")).expect("check"),
        "not marked"
    );
    buffer.mark_untrusted().expect("mark");
    buffer.close().expect("close");
    assert!(Buffer::empty_if_untrusted(&dir.path().join("buf")).expect("empty"));
    let buffer = open(&dir);
    assert!(buffer.partitions().expect("partitions").is_empty());
    assert!(
        dir.path().join("buf").join("notes.txt").exists(),
        "only sled's files go"
    );
    assert!(
        !Buffer::empty_if_untrusted(&dir.path().join("buf")).expect("check"),
        "marker gone"
    );
}

/// A buffer with `t`/0 laid out plain and offsets 0..30 of its live lane appended as three
/// chunks, at 0, 10 and 20; and the partition's key.
fn three_live_chunks(dir: &tempfile::TempDir) -> (Buffer, PartitionKey) {
    let buffer = open_plain(dir);
    for first in [0, 10, 20] {
        append(
            &buffer,
            Lane::Live,
            "t",
            0,
            &records(first..first + 10),
            first + 10,
        )
        .expect("append");
    }
    let part = buffer.partition_key("t", 0).expect("key").expect("known");
    (buffer, part)
}

/// Asserts that `read`, from `from`, found chunks missing: damage, never a gap.
fn assert_chunks_missing(read: &Result<ReadBatch, StoreError>, from: i64) {
    assert!(
        matches!(read, Err(StoreError::Damaged { reason, .. }) if reason.contains("missing")),
        "from {from}: {read:?}"
    );
}

/// Removes the chunk at `first` of `t`/0's live lane.
fn lose_live_chunk(buffer: &Buffer, first: u64) {
    buffer.lose_chunk(Lane::Live, "t", 0, first);
}

#[test]
fn a_lost_chunk_is_damage_never_a_gap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (buffer, _) = three_live_chunks(&dir);
    assert_eq!(
        offsets(&buffer.read(Lane::Live, "t", 0, 0, 100).expect("read")),
        (0..30).collect::<Vec<_>>()
    );
    // The middle chunk vanishes while the state still counts it (a torn sled state).
    lose_live_chunk(&buffer, 10);
    for from in [0, 5, 10, 15] {
        assert_chunks_missing(&buffer.read(Lane::Live, "t", 0, from, 100), from);
    }
    // Past the hole the chain holds again.
    assert_eq!(
        offsets(&buffer.read(Lane::Live, "t", 0, 20, 100).expect("read")),
        (20..30).collect::<Vec<_>>()
    );
}

#[test]
fn a_lost_last_chunk_is_damage_never_the_lane_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (buffer, _) = three_live_chunks(&dir);
    // The lane's last chunk vanishes while the state still counts it: the chain ends at 20,
    // short of the fetched end, 30. A read that took the chain's end for the lane's waited
    // there for ever (found by the simulation, seed 0x2267 of its damaged disks: an
    // `Ordered` reader stalled before the last chunk of a backlog).
    lose_live_chunk(&buffer, 20);
    for from in [15, 20, 25] {
        assert_chunks_missing(&buffer.read(Lane::Live, "t", 0, from, 100), from);
    }
    // A read that stops before the hole is whole.
    assert_eq!(
        offsets(&buffer.read(Lane::Live, "t", 0, 0, 5).expect("read")),
        (0..10).collect::<Vec<_>>()
    );
}

#[test]
fn a_read_racing_a_commit_past_unread_chunks_is_no_damage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (buffer, part) = three_live_chunks(&dir);
    // A read loads the lane's state, then a commit passes chunks the reader has not read
    // before the read gets to sled (the live thread does it past chunks that hold no record,
    // in `skip_trailing_gap`; here they hold records, which the buffer cannot tell apart):
    // the chunks the loaded state counts are gone, and that is no damage.
    for (from, committed, after) in [(10, 20, 20..30), (20, 30, 30..30)] {
        let (loaded, sled_end) = buffer.read_state(part).expect("state").expect("laid out");
        buffer
            .record_committed(Lane::Live, "t", 0, committed)
            .expect("commit");
        let batch = buffer
            .read_lane(Lane::Live, part, &loaded, sled_end, from, 100)
            .expect("read again under the commit");
        assert_eq!(offsets(&batch), after.clone().collect::<Vec<_>>());
        assert_eq!(batch.next, 30);
    }
}

#[test]
fn a_commit_racing_a_read_hides_no_lost_chunk_above_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (buffer, part) = three_live_chunks(&dir);
    lose_live_chunk(&buffer, 20);
    let (loaded, sled_end) = buffer.read_state(part).expect("state").expect("laid out");
    buffer
        .record_committed(Lane::Live, "t", 0, 10)
        .expect("commit");
    // Read again under the commit, the read still finds the chunk lost above it.
    assert_chunks_missing(
        &buffer.read_lane(Lane::Live, part, &loaded, sled_end, 0, 100),
        0,
    );
}

#[test]
fn a_commit_up_to_a_lost_chunk_keeps_the_hole_for_the_next_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (buffer, _) = three_live_chunks(&dir);
    // The chunk a commit ends at vanishes (the disk lost it while no process ran): no chunk
    // at or below the commit reaches past it, and the commit must not take that for the
    // end of what the lane holds (found by the simulation, seed 0x176 of its damaged disks:
    // the lane's retained offsets moved to its fetched end, and 200 offsets were skipped
    // without a read ever finding the hole).
    lose_live_chunk(&buffer, 10);
    buffer
        .record_committed(Lane::Live, "t", 0, 10)
        .expect("commit");
    let state = buffer
        .partition_state("t", 0)
        .expect("state")
        .expect("laid out");
    assert_eq!(state.live.retained_from, 10, "{state:?}");
    assert_chunks_missing(&buffer.read(Lane::Live, "t", 0, 10, 100), 10);
}

#[test]
fn reads_refuse_a_chunk_that_overlaps_the_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    for first in [0, 10, 20] {
        append(
            &buffer,
            Lane::Live,
            "t",
            0,
            &records(first..first + 10),
            first + 10,
        )
        .expect("append");
    }
    // A chunk at 15 (damage, or a crafted one) inside the chain that reached 20 at it.
    let part = buffer.partition_key("t", 0).expect("key").expect("known");
    craft_chunk(
        &buffer,
        keys::chunk(Lane::Live, part, 15),
        25,
        records(15..25),
    );
    for from in [0, 5, 15] {
        let read = buffer.read(Lane::Live, "t", 0, from, 100);
        assert!(
            matches!(&read, Err(StoreError::Damaged { reason, .. }) if reason.contains("inside the chain")),
            "from {from}: {read:?}"
        );
    }
}

#[test]
fn a_commit_keeps_a_chunk_whose_next_is_past_the_largest_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    append(&buffer, Lane::Live, "t", 0, &records(0..10), 10).expect("append");
    append(&buffer, Lane::Live, "t", 0, &records(10..20), 20).expect("append");
    // Its `next` as a u64 past i64::MAX: read as a signed offset, it would lie below the
    // commit and the chunk, records 15..20 unprocessed, would be deleted.
    let part = buffer.partition_key("t", 0).expect("key").expect("known");
    let key = keys::chunk(Lane::Live, part, 10);
    craft_chunk(&buffer, key, u64::MAX, records(10..20));
    buffer
        .record_committed(Lane::Live, "t", 0, 15)
        .expect("commit");
    assert!(
        buffer.db().expect("open").contains_key(key).expect("look"),
        "the chunk holding the unprocessed records 15..20 is kept"
    );
    let state = buffer
        .partition_state("t", 0)
        .expect("state")
        .expect("laid out");
    assert_eq!(state.live.retained_from, 10);
}

/// Appends `batches` batches of 1,000 records of `size` bytes, reading and committing behind
/// like a consumer, and returns every blob file name seen in the directory meanwhile.
fn blobs_seen(
    buffer: &Buffer,
    dir: &Path,
    batches: i64,
    size: usize,
) -> BTreeSet<std::ffi::OsString> {
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    let mut seen = BTreeSet::new();
    let mut next = 0;
    for batch in 0..batches {
        let records: Vec<Record> = (batch * 1000..(batch + 1) * 1000)
            .map(|offset| Record {
                payload: Some(vec![(offset % 251) as u8; size].into()),
                ..record(offset)
            })
            .collect();
        append(buffer, Lane::Live, "t", 0, &records, (batch + 1) * 1000).expect("append");
        if batch % 2 == 1 {
            let read = buffer.read(Lane::Live, "t", 0, next, 1000).expect("read");
            next = read.next;
            buffer
                .record_committed(Lane::Live, "t", 0, next)
                .expect("commit");
        }
        if let Ok(entries) = std::fs::read_dir(dir.join("blobs")) {
            seen.extend(entries.flatten().map(|entry| entry.file_name()));
        }
    }
    seen
}

/// No leaf of chunks becomes a sled blob file under the benchmarks' workloads (100-byte and
/// 1 KiB records in batches of 1,000): blobs are what a power loss can tear out of order.
/// With the former 64 KiB chunks in 512 KiB segments this saw hundreds.
#[test]
fn the_default_sizes_write_no_blob_files() {
    for (size, batches) in [(100, 100), (1024, 25)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let buffer = open(&dir);
        let seen = blobs_seen(&buffer, &dir.path().join("buf"), batches, size);
        assert!(seen.is_empty(), "{size}-byte records: blob files {seen:?}");
    }
}

#[test]
fn options_that_would_write_blobs_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for options in [
        BufferOptions {
            chunk_target_bytes: 64 << 10,
            ..BufferOptions::default()
        },
        BufferOptions {
            segment_bytes: 3 << 20,
            ..BufferOptions::default()
        },
    ] {
        let err = Buffer::open(dir.path().join("buf"), options).expect_err("refused");
        assert!(matches!(err, StoreError::Options { .. }), "{err}");
    }
}

/// sled refuses to change a database's segment size; a buffer created with another one (an
/// earlier version used sled's default, 512 KiB) opens with the size it has, and chunks
/// sized for it.
#[test]
fn a_buffer_keeps_the_segment_size_it_was_created_with() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("buf");
    drop(
        sled::Config::new()
            .path(&path)
            .open()
            .expect("sled with its defaults"),
    );
    let buffer = Buffer::open(&path, BufferOptions::default()).expect("open");
    assert_eq!(buffer.options.segment_bytes, 512 << 10);
    assert!(buffer.options.chunk_target_bytes <= largest_chunk_without_blobs(512 << 10));
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    append(&buffer, Lane::Live, "t", 0, &records(0..10), 10).expect("append");
    buffer.close().expect("close");
    let buffer = Buffer::open(&path, BufferOptions::default()).expect("reopen");
    assert_eq!(
        offsets(&buffer.read(Lane::Live, "t", 0, 0, 100).expect("read")),
        (0..10).collect::<Vec<_>>()
    );
}

/// A consumer starting while an offline tool copies its buffer (the tool holds a shared lock
/// for as long as the copy takes) waits for the copy instead of failing after `lock_wait`.
#[test]
fn open_waits_for_an_offline_tool_copying_the_buffer() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("buf");
    Buffer::open(&path, BufferOptions::default())
        .expect("create")
        .close()
        .expect("close");
    let db = std::fs::File::open(path.join("db")).expect("db");
    // SAFETY: flock on a valid, owned file descriptor.
    assert_eq!(
        unsafe { libc::flock(db.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) },
        0,
        "the tool's shared lock"
    );
    let options = BufferOptions {
        lock_wait: std::time::Duration::from_millis(100),
        ..BufferOptions::default()
    };
    let opening = std::thread::spawn(move || Buffer::open(&path, options).map(drop));
    std::thread::sleep(std::time::Duration::from_millis(600)); // the copy, in progress
    assert!(
        !opening.is_finished(),
        "open gave up while the tool held the lock"
    );
    drop(db); // the copy is done
    opening
        .join()
        .expect("no panic")
        .expect("open once the tool is done");
}

/// The offline tools never follow a symlink out of a buffer directory (or block on a FIFO).
#[test]
fn a_snapshot_refuses_a_symlink_in_the_buffer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("buf");
    Buffer::open(&path, BufferOptions::default())
        .expect("create")
        .close()
        .expect("close");
    std::os::unix::fs::symlink("/etc/hostname", path.join("extra")).expect("symlink");
    let err = Buffer::open_snapshot(&path, &mut |_, _| {}).expect_err("refused");
    assert!(
        matches!(&err, StoreError::NotABuffer { reason, .. } if reason.contains("symlink")),
        "{err}"
    );
}

/// Only a directory catchup marked as its buffer is ever emptied, and never while another
/// process holds its database.
#[test]
fn empty_touches_only_a_marked_buffer_nobody_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("buf");
    let buffer = Buffer::open(&path, BufferOptions::default()).expect("create");
    assert!(Buffer::is_marked(&path), "a new buffer is marked");
    let err = Buffer::empty(&path).expect_err("held by the open buffer");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(path.join("db").exists(), "nothing deleted while held");
    buffer.close().expect("close");
    std::fs::write(path.join("notes.txt"), b"mine").expect("a file of the user's");
    Buffer::empty(&path).expect("empty");
    assert!(!path.join("db").exists() && !path.join("conf").exists());
    assert!(path.join("notes.txt").exists(), "other files stay");

    // Another application's sled database: never emptied.
    let foreign = dir.path().join("foreign");
    drop(sled::open(&foreign).expect("sled"));
    let err = Buffer::empty(&foreign).expect_err("not marked");
    assert!(matches!(err, StoreError::NotABuffer { .. }), "{err}");
    assert!(foreign.join("db").exists() && foreign.join("conf").exists());
}

#[test]
fn topics_nothing_is_buffered_for_are_forgotten_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let buffer = open(&dir);
        for topic in ["gone", "kept"] {
            buffer
                .reset_partition(topic, 0, PartitionLayout::plain(0))
                .expect("layout");
            append(&buffer, Lane::Live, topic, 0, &records(0..10), 10).expect("append");
            buffer
                .record_incarnation(topic, "id", |_| true)
                .expect("incarnation");
        }
        assert!(buffer.discard_partition("gone", 0).expect("discard"));
        buffer.close().expect("close");
    }
    let buffer = open(&dir);
    assert_eq!(buffer.topic_id("gone"), None);
    assert!(buffer.topic_id("kept").is_some());
    let db = buffer.db().expect("open");
    assert_eq!(db.get(keys::topic("gone")).expect("get"), None);
    assert_eq!(db.get(keys::incarnation("gone")).expect("get"), None);
    assert!(db.get(keys::incarnation("kept")).expect("get").is_some());
    // The topic comes back as any new one, and what was kept is intact.
    buffer
        .reset_partition("gone", 0, PartitionLayout::plain(5))
        .expect("layout again");
    assert_eq!(
        offsets(&buffer.read(Lane::Live, "kept", 0, 0, 100).expect("read")),
        (0..10).collect::<Vec<_>>()
    );
}

/// A read stops at the proven end of the state it loaded (the lane's `fetched_next`), however
/// the chunks past it look: sled's iterator can show the later chunk of a batch appended during
/// a read and hide the earlier one, and a read that went on would step over the hidden offsets.
/// Recreated here as the reader would meet it: the state says 10, chunk [10, 20) is not seen,
/// chunk [20, 30) is.
#[test]
fn reads_stop_at_the_proven_end_of_the_state_they_loaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = BufferOptions {
        chunk_target_bytes: 1,
        ..BufferOptions::default()
    };
    let buffer = Buffer::open(dir.path().join("buf"), options).expect("open buffer");
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    append(&buffer, Lane::Live, "t", 0, &records(0..10), 10).expect("append 0..10");
    let proven = buffer
        .partition_state("t", 0)
        .expect("state")
        .expect("laid out");
    append(&buffer, Lane::Live, "t", 0, &records(10..30), 30).expect("append 10..30");

    let part = buffer.partition_key("t", 0).expect("key").expect("known");
    let db = buffer.db().expect("db");
    db.insert(keys::state(part), codec::encode(&proven))
        .expect("the state the reader loaded");
    for hidden in 10..20u64 {
        db.remove(keys::chunk(Lane::Live, part, hidden))
            .expect("the chunks the iterator hid");
    }
    // The buffer keeps each partition's state in memory: it loads it again from sled.
    buffer.forget_memory();

    let batch = buffer.read(Lane::Live, "t", 0, 0, 1 << 20).expect("read");
    assert_eq!(offsets(&batch), (0..10).collect::<Vec<_>>());
    assert_eq!(batch.next, 10, "nothing past the proven end is read over");
    let tail = buffer.read(Lane::Live, "t", 0, 10, 1 << 20).expect("read");
    assert!(tail.records.is_empty(), "{:?}", offsets(&tail));
    assert_eq!(tail.next, 10);
}

#[test]
fn records_a_reader_took_wait_for_their_commit_in_memory_and_what_waits_is_spilled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let each = super::tail::append_cost(&records(0..1)) - super::tail::append_cost(&[]);
    let allowed = 100 * each;
    let buffer = Buffer::open(
        dir.path().join("buf"),
        BufferOptions {
            memory_bytes: allowed,
            ..BufferOptions::default()
        },
    )
    .expect("open buffer");
    buffer
        .reset_partition("t", 0, PartitionLayout::split(1, 0, 1_000))
        .expect("layout");
    let append_in_tens = |offsets: std::ops::Range<i64>| {
        for start in offsets.step_by(10) {
            append(
                &buffer,
                Lane::Catchup,
                "t",
                0,
                &records(start..start + 10),
                start + 10,
            )
            .expect("append");
        }
    };
    // 90 records in memory, all read: they wait for their commit only.
    append_in_tens(0..90);
    let batch = buffer.read(Lane::Catchup, "t", 0, 0, 1_000).expect("read");
    assert_eq!(offsets(&batch), (0..90).collect::<Vec<_>>());
    // 90 more nobody read: the tier holds 180 records' worth, over its allowance, and
    // writes nothing — what waits is under it.
    append_in_tens(90..180);
    assert!(buffer.memory_held() > allowed);
    assert_eq!(
        buffer.spilled_bytes(),
        0,
        "records a reader took were spilled"
    );
    // The commit drops what was read; what waits beyond the allowance is spilled.
    buffer
        .record_committed(Lane::Catchup, "t", 0, 90)
        .expect("commit");
    append_in_tens(180..300);
    assert!(buffer.spilled_bytes() > 0, "what waits was not spilled");
    assert!(buffer.memory_held() <= allowed);
    // Nothing lost on the way: sled's prefix and memory read on from the commit.
    assert_eq!(
        catchup_offsets(&buffer, 90..300),
        (90..300).collect::<Vec<_>>()
    );
}

#[test]
fn an_append_whose_spill_fails_is_answered_as_made() {
    let dir = tempfile::tempdir().expect("tempdir");
    let each = super::tail::append_cost(&records(0..1)) - super::tail::append_cost(&[]);
    let buffer = Buffer::open(
        dir.path().join("buf"),
        BufferOptions {
            memory_bytes: 20 * each,
            ..BufferOptions::default()
        },
    )
    .expect("open buffer");
    buffer
        .reset_partition("t", 0, PartitionLayout::split(1, 0, 1_000))
        .expect("layout");
    append(&buffer, Lane::Catchup, "t", 0, &records(0..10), 10).expect("append");
    // The next append takes the tier over its allowance; its spill fails.
    super::write::FAIL_SPILLS.with(|fail| fail.set(true));
    let outcome = append(&buffer, Lane::Catchup, "t", 0, &records(10..40), 40);
    super::write::FAIL_SPILLS.with(|fail| fail.set(false));
    let outcome = outcome.expect("the append itself is made");
    assert_eq!((outcome.stored, outcome.fetched_next), (30, 40));
    assert!(
        outcome
            .relief_failed
            .as_ref()
            .is_some_and(StoreError::is_io_failure),
        "{:?}",
        outcome.relief_failed
    );
    assert_eq!(buffer.spilled_bytes(), 0);
    // Its records are read, and the lane goes on from where it stands.
    let batch = buffer.read(Lane::Catchup, "t", 0, 0, 1_000).expect("read");
    assert_eq!(offsets(&batch), (0..40).collect::<Vec<_>>());
    let next = append(&buffer, Lane::Catchup, "t", 0, &records(40..50), 50).expect("append");
    assert!(next.relief_failed.is_none());
    assert!(buffer.spilled_bytes() > 0, "spilled once spills work again");
    assert_eq!(catchup_offsets(&buffer, 0..50), (0..50).collect::<Vec<_>>());
}

/// The regular files under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// What this thread fsynced while `run` ran, in order.
fn fsynced_by(run: impl FnOnce()) -> Vec<PathBuf> {
    fsync::SYNCED.with(|synced| synced.borrow_mut().clear());
    run();
    fsync::SYNCED.with(|synced| synced.take())
}

/// `sync` is the durability point a library user can ask for: every file of the database
/// (blobs before sled's log, which points to them), then the database's directory, then the
/// buffer's that names it (after a compaction the database is `gen-<n>/` inside it). A
/// SIGKILL test cannot see a missing fsync (the page cache survives a killed process).
#[test]
fn sync_fsyncs_every_file_the_log_last_then_the_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    append(&buffer, Lane::Live, "t", 0, &records(0..100), 100).expect("append");
    buffer.compact().expect("compact");
    append(&buffer, Lane::Live, "t", 0, &records(100..200), 200).expect("append");
    let buffer_dir = dir.path().join("buf");
    let sled_dir = buffer.sled_dir();
    assert_ne!(
        sled_dir, buffer_dir,
        "the database is a generation inside the buffer"
    );
    let synced = fsynced_by(|| buffer.sync().expect("sync"));
    let at = |path: &Path| synced.iter().position(|synced| synced == path);
    let log = at(&sled_dir.join("db")).expect("sled's log is fsynced");
    for file in files_under(&sled_dir) {
        let position = at(&file).unwrap_or_else(|| panic!("{file:?} is not fsynced"));
        assert!(position <= log, "{file:?} is fsynced after the log");
    }
    let sled_dir_at = at(&sled_dir).expect("the database's directory is fsynced");
    let buffer_dir_at = at(&buffer_dir).expect("the buffer's directory is fsynced");
    assert!(
        log < sled_dir_at && sled_dir_at < buffer_dir_at,
        "{synced:?}"
    );
}

/// A compaction switches to the new generation only once all of it is durable, the keys
/// written meanwhile (replayed) included: the last fsyncs before `CURRENT` is written are
/// every file of the new generation and then its directory; the buffer's directory follows
/// the rename.
#[test]
fn a_compaction_makes_the_new_generation_durable_before_it_switches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open_plain(&dir);
    append(&buffer, Lane::Live, "t", 0, &records(0..100), 100).expect("append");
    let buffer_dir = dir.path().join("buf");
    let synced = fsynced_by(|| {
        buffer.compact().expect("compact");
    });
    let new_generation = buffer.sled_dir();
    assert_ne!(new_generation, buffer_dir, "a new generation");
    let staged = synced
        .iter()
        .position(|synced| *synced == buffer_dir.join("CURRENT.new"))
        .expect("CURRENT is fsynced");
    // The copy and then the replay are each made durable; the replay's fsync of the whole
    // generation comes right before the switch.
    let passes = synced[..staged]
        .iter()
        .filter(|synced| **synced == new_generation)
        .count();
    assert!(
        passes >= 2,
        "the copy and the replay each fsynced: {synced:?}"
    );
    assert!(synced[staged - 1] == new_generation, "{synced:?}");
    let previous_pass = synced[..staged - 1]
        .iter()
        .rposition(|synced| *synced == new_generation)
        .map_or(0, |position| position + 1);
    let last_pass = &synced[previous_pass..staged - 1];
    for file in files_under(&new_generation) {
        assert!(
            last_pass.contains(&file),
            "{file:?} is not fsynced right before the switch: {synced:?}"
        );
    }
    assert!(
        synced[staged + 1..].contains(&buffer_dir),
        "the buffer's directory is fsynced after the rename: {synced:?}"
    );
}

/// The mark that makes the next open start empty is durable, its name included.
#[test]
fn the_untrusted_mark_is_fsynced_with_its_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buffer = open(&dir);
    let synced = fsynced_by(|| buffer.mark_untrusted().expect("mark"));
    let buffer_dir = dir.path().join("buf");
    let marker = synced
        .iter()
        .position(|synced| synced.starts_with(&buffer_dir) && *synced != buffer_dir)
        .expect("the mark is fsynced");
    assert!(
        synced[marker + 1..].contains(&buffer_dir),
        "its directory after it: {synced:?}"
    );
}

#[test]
fn a_read_says_whether_it_reached_the_proven_end() {
    // With the memory tier and without it (appends written through to sled).
    for memory in [0, 1 << 20] {
        let dir = tempfile::tempdir().expect("dir");
        let buffer = open_plain(&dir);
        buffer.set_memory_bytes(memory).expect("memory tier");
        append(&buffer, Lane::Live, "t", 0, &records(0..5), 5).expect("append");
        append(&buffer, Lane::Live, "t", 0, &records(5..10), 10).expect("append");
        // Sled hands out whole chunks (0..5), the memory tier what was asked for (0..3).
        let short = buffer.read(Lane::Live, "t", 0, 0, 3).expect("read");
        assert!(short.records.len() >= 3 && short.next < 10, "{short:?}");
        assert!(!short.exhausted, "stopped at max_records ({memory})");
        let rest = buffer
            .read(Lane::Live, "t", 0, short.next, 100)
            .expect("read");
        assert_eq!(offsets(&rest), (short.next..10).collect::<Vec<_>>());
        assert!(rest.exhausted, "read to the end ({memory})");
        let nothing = buffer
            .read(Lane::Live, "t", 0, rest.next, 100)
            .expect("read");
        assert!(nothing.records.is_empty() && nothing.exhausted);
        append(&buffer, Lane::Live, "t", 0, &records(10..12), 12).expect("append");
        let again = buffer
            .read(Lane::Live, "t", 0, rest.next, 100)
            .expect("read");
        assert_eq!(offsets(&again), vec![10, 11]);
        assert!(again.exhausted, "({memory})");
    }
}

#[test]
fn an_ordered_read_at_the_backlogs_end_is_not_exhausted() {
    let dir = tempfile::tempdir().expect("dir");
    let buffer = open(&dir);
    buffer
        .reset_partition("t", 0, PartitionLayout::split(1, 0, 10))
        .expect("lay out");
    append(&buffer, Lane::Catchup, "t", 0, &records(0..5), 5).expect("append");
    append(&buffer, Lane::Live, "t", 0, &records(10..12), 12).expect("append");
    let backlog = buffer.read_ordered("t", 0, 0, 100).expect("read");
    assert_eq!(offsets(&backlog), vec![0, 1, 2, 3, 4]);
    assert!(backlog.exhausted, "the backlog is fetched up to 5 only");
    append(&buffer, Lane::Catchup, "t", 0, &records(5..10), 10).expect("append");
    let rest = buffer
        .read_ordered("t", 0, backlog.next, 100)
        .expect("read");
    assert_eq!(offsets(&rest), vec![5, 6, 7, 8, 9]);
    assert!(!rest.exhausted, "the next read turns to the live lane");
    let live = buffer.read_ordered("t", 0, rest.next, 100).expect("read");
    assert_eq!(offsets(&live), vec![10, 11]);
    assert!(live.exhausted);
}
