//! Every error built from a dependency's error reads as a sentence for a person: it names the
//! buffer directory (or what was being done), and carries no debug rendering such as `Some(..)`,
//! `Inline(..)` or `backtrace ()`. Each case provokes the error for real.

mod support;

use std::path::Path;

use catchup::store::{
    Buffer, BufferOptions, Fetched, Lane, LayoutId, PartitionLayout, Record, StoreError, Timestamp,
};
use catchup::{CatchupConfig, CatchupConsumer};
use rdkafka::ClientConfig;
use support::cli::copy_with_cut_database;

const DEBUG_RENDERINGS: [&str; 6] = ["Some(", "None", "Inline(", "Blob(", "backtrace", "{ "];

fn assert_plain(error: &dyn std::fmt::Display, names: &str) {
    let message = error.to_string();
    assert!(message.contains(names), "'{message}' does not name {names}");
    for debug in DEBUG_RENDERINGS {
        assert!(!message.contains(debug), "'{message}' contains {debug}");
    }
}

fn record(offset: i64) -> Record {
    Record {
        offset,
        timestamp: Timestamp::CreateTime(1),
        key: None,
        payload: Some(vec![7; 300].into()),
        headers: Vec::new(),
    }
}

fn buffer_with_records(dir: &Path) {
    let buffer = Buffer::open(dir, BufferOptions::default()).expect("open");
    buffer
        .reset_partition("t", 0, PartitionLayout::plain(0))
        .expect("layout");
    let layout = buffer.layout_id("t", 0).expect("id").expect("laid out");
    let mut next = 0;
    for _ in 0..50 {
        let batch: Vec<Record> = (next..next + 100).map(record).collect();
        let fetched = Fetched {
            layout,
            continues_from: next,
            records: &batch,
            next: next + 100,
        };
        buffer.append(Lane::Live, "t", 0, fetched).expect("append");
        next += 100;
    }
    buffer.sync().expect("sync");
    buffer.close().expect("close");
}

#[test]
fn store_errors_are_sentences_naming_the_buffer() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buffer");
    let name = dir.to_str().expect("utf-8");
    buffer_with_records(&dir);

    // Locked: a second handle while the first is open.
    let open = Buffer::open(&dir, BufferOptions::default()).expect("open");
    let locked = Buffer::open(
        &dir,
        BufferOptions {
            lock_wait: std::time::Duration::from_millis(50),
            ..BufferOptions::default()
        },
    )
    .expect_err("locked");
    assert!(matches!(locked, StoreError::Locked { .. }), "{locked}");
    assert_plain(&locked, name);

    // Rejected, Discontinuous and StaleLayout: appends that do not fit.
    let layout = open.layout_id("t", 0).expect("id").expect("laid out");
    let gap = [record(6000)];
    let ahead = Fetched {
        layout,
        continues_from: 6000,
        records: &gap,
        next: 6001,
    };
    let discontinuous = open.append(Lane::Live, "t", 0, ahead).expect_err("gap");
    assert!(matches!(discontinuous, StoreError::Discontinuous { .. }));
    assert_plain(&discontinuous, name);
    let stale = Fetched {
        layout: LayoutId(layout.0 + 1000),
        continues_from: 5000,
        records: &[],
        next: 5001,
    };
    let stale = open.append(Lane::Live, "t", 0, stale).expect_err("stale");
    assert!(matches!(stale, StoreError::StaleLayout { .. }));
    assert_plain(&stale, name);
    let rejected = open
        .record_committed(Lane::Live, "t", 0, 9_999)
        .expect_err("ahead of fetched");
    assert_plain(&rejected, name);
    drop(open);

    // Missing and NotABuffer.
    let missing = temp.path().join("nowhere");
    let err = Buffer::open_existing(&missing, BufferOptions::default()).expect_err("missing");
    assert_plain(&err, missing.to_str().expect("utf-8"));
    let empty = temp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    std::fs::write(empty.join("notes.txt"), "hello").expect("write");
    let err = Buffer::open_existing(&empty, BufferOptions::default()).expect_err("not a buffer");
    assert_plain(&err, empty.to_str().expect("utf-8"));

    // Damaged: the database file cut short at several points; sled either recovers a
    // prefix (then opening works) or reports corruption, which must read as a sentence.
    let db_file = dir.join("db");
    let length = std::fs::metadata(&db_file).expect("metadata").len();
    let mut damaged = 0;
    for keep in [100, length / 4, length / 2, length - 7] {
        let copy = temp.path().join(format!("cut-{keep}"));
        copy_with_cut_database(&dir, &copy, keep);
        let result = Buffer::open_existing(&copy, BufferOptions::default())
            .and_then(|buffer| buffer.verify().map(|_| ()));
        if let Err(err) = result {
            damaged += 1;
            assert_plain(&err, copy.to_str().expect("utf-8"));
        }
    }
    eprintln!("{damaged} of 4 cut databases were refused, with plain messages");

    // Io: a buffer directory that cannot be created.
    let file = temp.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let below_a_file = file.join("buffer");
    let err = Buffer::open(&below_a_file, BufferOptions::default()).expect_err("not creatable");
    assert_plain(&err, below_a_file.to_str().expect("utf-8"));
}

#[test]
fn kafka_errors_say_what_was_being_done() {
    let temp = tempfile::tempdir().expect("tempdir");
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("group.id", "error-messages")
        .set("no.such.property", "1");
    let err = CatchupConsumer::new(&client, CatchupConfig::new(temp.path().join("b")))
        .err()
        .expect("a bad property is refused");
    assert_plain(&err, "no.such.property");
}
