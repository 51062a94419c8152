//! Compaction: disk comes back, nothing stored is lost, writers racing it included.

use super::*;

fn record(offset: i64, size: usize) -> Record {
    Record {
        offset,
        timestamp: Timestamp::CreateTime(1_700_000_000_000 + offset),
        key: Some(format!("k{offset}").into_bytes().into()),
        // Varied bytes: a compressible payload would flatter nothing here, but stay honest.
        payload: Some(
            (0..size)
                .map(|i| (offset as usize * 31 + i) as u8)
                .collect(),
        ),
        headers: Vec::new(),
    }
}

fn options() -> BufferOptions {
    BufferOptions {
        disk_allowance_bytes: 4 << 20,
        ..BufferOptions::default()
    }
}

/// Appends `[from, to)` to the live lane of `topic`/0 in fetches of 1,000 records of
/// 1 KB.
fn fill(buffer: &Buffer, topic: &str, from: i64, to: i64) {
    fill_sized(buffer, topic, from, to, 1000);
}

fn fill_sized(buffer: &Buffer, topic: &str, from: i64, to: i64, size: usize) {
    let mut next = from;
    while next < to {
        let end = (next + 1000).min(to);
        let records: Vec<Record> = (next..end).map(|o| record(o, size)).collect();
        let layout = buffer
            .layout_id(topic, 0)
            .expect("layout id")
            .expect("laid out");
        buffer
            .append(
                Lane::Live,
                topic,
                0,
                Fetched {
                    layout,
                    continues_from: next,
                    records: &records,
                    next: end,
                },
            )
            .expect("append");
        next = end;
    }
}

/// Reads the live lane of `topic`/0 from `from` to its end, checking every record.
fn read_all(buffer: &Buffer, topic: &str, from: i64) -> i64 {
    read_all_sized(buffer, topic, from, 1000)
}

fn read_all_sized(buffer: &Buffer, topic: &str, from: i64, size: usize) -> i64 {
    let mut next = from;
    loop {
        let batch = buffer.read(Lane::Live, topic, 0, next, 1000).expect("read");
        if batch.records.is_empty() {
            return next;
        }
        for record in &batch.records {
            assert_eq!(record, &self::record(record.offset, size));
            assert_eq!(record.offset, next, "a hole in what was read");
            next = record.offset + 1;
        }
    }
}

/// Creates a buffer in `dir` holding offsets 0..2000 of `t`/0 (compacted once if
/// `compact`), and closes it.
fn buffer_of_2000(dir: &Path, compact: bool) {
    let buffer = Buffer::open(dir, options()).expect("open");
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    fill(&buffer, "t", 0, 2000);
    if compact {
        buffer.compact().expect("compact");
    }
    buffer.close().expect("close");
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_drained_buffer_gives_its_disk_back_and_keeps_what_is_left() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("buf");
    let buffer = Buffer::open(&dir, options()).expect("open");
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    fill(&buffer, "t", 0, 40_000); // 40 MB of payload
    buffer.sync().expect("sync");
    let full = buffer.disk_bytes().expect("disk");
    assert!(full > 40_000_000, "the filled buffer takes {full} bytes");
    // Nothing to gain yet: everything on disk is still stored.
    assert_eq!(buffer.compact_if_bloated().expect("check"), None);

    buffer
        .record_committed(Lane::Live, "t", 0, 39_000)
        .expect("commit");
    buffer.sync().expect("sync");
    let stored = buffer.stored_bytes().expect("stored");
    assert!(
        stored < 1_200_000,
        "1,000 records left, {stored} bytes counted"
    );
    let drained = buffer.disk_bytes().expect("disk");
    assert!(
        drained > 2 * stored + options().disk_allowance_bytes,
        "sled gave the disk back on its own ({drained} bytes): the test proves nothing"
    );

    let compaction = buffer
        .compact_if_bloated()
        .expect("compact")
        .expect("a drained buffer is compacted");
    assert!(
        compaction.copied_bytes >= stored - 100_000,
        "{compaction:?}"
    );
    let after = buffer.disk_bytes().expect("disk");
    assert!(
        after as f64 <= COPY_RATIO * stored as f64 + COPY_OVERHEAD as f64,
        "{after} bytes on disk for {stored} stored"
    );
    assert!(after * 5 < drained, "{after} bytes left of {drained}");
    assert_eq!(entries(&dir), ["CATCHUP_BUFFER", "CURRENT", "gen-1"]);

    // What was left is all there, and writing goes on in the new generation.
    assert_eq!(read_all(&buffer, "t", 39_000), 40_000);
    fill(&buffer, "t", 40_000, 41_000);
    assert_eq!(read_all(&buffer, "t", 39_000), 41_000);
    buffer.close().expect("close");

    // A restart opens the new generation.
    let buffer = Buffer::open(&dir, options()).expect("reopen");
    let state = buffer
        .partition_state("t", 0)
        .expect("state")
        .expect("laid out");
    assert_eq!(
        (state.live.committed_next, state.live.fetched_next),
        (39_000, 41_000)
    );
    assert_eq!(read_all(&buffer, "t", 39_000), 41_000);

    // And the next compaction moves on and removes this one.
    buffer.compact().expect("compact again");
    assert_eq!(entries(&dir), ["CATCHUP_BUFFER", "CURRENT", "gen-2"]);
    assert_eq!(read_all(&buffer, "t", 39_000), 41_000);
}

#[test]
fn writes_racing_a_compaction_all_land_in_the_new_generation() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("buf");
    let buffer = std::sync::Arc::new(Buffer::open(&dir, options()).expect("open"));
    for topic in ["a", "b"] {
        buffer
            .reset_partition(topic, 0, PartitionLayout::plain(0))
            .expect("layout");
    }
    let writers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|topic| {
            let buffer = buffer.clone();
            std::thread::spawn(move || {
                for step in 0..20 {
                    fill_sized(&buffer, topic, step * 1000, (step + 1) * 1000, 50);
                    if step % 3 == 2 {
                        buffer
                            .record_committed(Lane::Live, topic, 0, step * 1000)
                            .expect("commit");
                    }
                }
            })
        })
        .collect();
    let mut compactions = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        buffer.compact().expect("compact");
        compactions += 1;
    }
    for writer in writers {
        writer.join().expect("writer");
    }
    assert!(
        compactions >= 2,
        "only {compactions} compaction(s) raced the writers"
    );
    for topic in ["a", "b"] {
        let state = buffer
            .partition_state(topic, 0)
            .expect("state")
            .expect("laid out");
        assert_eq!(state.live.fetched_next, 20_000, "{topic}");
        let read = read_all_sized(&buffer, topic, state.live.committed_next, 50);
        assert_eq!(read, 20_000, "{topic}");
    }
    // The counted bytes follow the writes: a fresh count agrees with the running one.
    let running = buffer.stored_bytes().expect("stored");
    let compaction = buffer.compact().expect("compact");
    assert_eq!(running, compaction.copied_bytes);
}

#[test]
fn leftovers_of_an_interrupted_compaction_are_removed_at_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("buf");
    buffer_of_2000(&dir, false);
    // Killed while copying: a partial next generation, never switched to.
    std::fs::create_dir(dir.join("gen-1")).expect("mkdir");
    std::fs::write(dir.join("gen-1").join("db"), b"partial").expect("write");
    std::fs::write(dir.join("CURRENT.new"), b"gen-1\n").expect("write");
    let buffer = Buffer::open(&dir, options()).expect("reopen");
    assert!(!dir.join("gen-1").exists() && !dir.join("CURRENT.new").exists());
    assert_eq!(read_all(&buffer, "t", 0), 2000);

    // Killed after the switch, before the old generation went.
    buffer.compact().expect("compact");
    buffer.close().expect("close");
    std::fs::write(dir.join("db"), b"old generation").expect("write");
    std::fs::write(dir.join("conf"), b"old generation").expect("write");
    let buffer = Buffer::open(&dir, options()).expect("reopen");
    assert_eq!(entries(&dir), ["CATCHUP_BUFFER", "CURRENT", "gen-1"]);
    assert_eq!(read_all(&buffer, "t", 0), 2000);
    buffer.close().expect("close");

    // Offline tools and emptying follow the generation.
    let snapshot = Buffer::open_snapshot(&dir, &mut |_, _| {}).expect("snapshot");
    assert_eq!(read_all(snapshot.buffer(), "t", 0), 2000);
    drop(snapshot);
    Buffer::empty(&dir).expect("empty");
    assert_eq!(entries(&dir), ["CATCHUP_BUFFER"]);
    let buffer = Buffer::open(&dir, options()).expect("reopen empty");
    assert_eq!(buffer.partition_state("t", 0).expect("state"), None);
}

#[test]
fn a_current_naming_no_generation_is_damage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("buf");
    Buffer::open(&dir, options())
        .expect("open")
        .close()
        .expect("close");
    std::fs::write(dir.join("CURRENT"), b"../../elsewhere\n").expect("write");
    let err = Buffer::open(&dir, options()).expect_err("a forged CURRENT");
    assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
    // Emptied like any damaged buffer, CURRENT included; the parent is never touched.
    Buffer::empty(&dir).expect("empty");
    assert_eq!(entries(&dir), ["CATCHUP_BUFFER"]);
    assert!(tmp.path().join("buf").exists());
}

#[test]
fn a_failed_compaction_leaves_the_buffer_as_it_was() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("buf");
    buffer_of_2000(&dir, true);
    // The last generation number: there is no next one to copy into.
    let last = format!("gen-{}", u64::MAX);
    std::fs::rename(dir.join("gen-1"), dir.join(&last)).expect("rename");
    std::fs::write(dir.join("CURRENT"), format!("{last}\n")).expect("write");
    let buffer = Buffer::open(&dir, options()).expect("reopen");
    let err = buffer.compact().expect_err("no next generation");
    assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
    // Writers no longer note their keys, and the buffer goes on as it was.
    assert!(!buffer.compaction.is_noting());
    fill(&buffer, "t", 2000, 3000);
    assert_eq!(read_all(&buffer, "t", 0), 3000);
    assert_eq!(entries(&dir), ["CATCHUP_BUFFER", "CURRENT", last.as_str()]);
}
