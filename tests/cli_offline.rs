//! The offline subcommands (`inspect`, `dump`, `verify`) on good, damaged and foreign
//! directories: output, exit codes, and that they never modify what they read.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use catchup::store::{
    Buffer, BufferOptions, Fetched, Header, Lane, PartitionLayout, Record, Timestamp,
};
use support::cli::copy_with_cut_database;

fn catchup(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args(args)
        .output()
        .expect("run catchup")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Exit code `code`, and an error (if any) that is short and not a panic.
fn assert_exit(output: &Output, code: i32) {
    let err = stderr(output);
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout {} stderr {err}",
        stdout(output)
    );
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
    assert!(
        err.lines().filter(|l| !l.trim().is_empty()).count() <= 2,
        "long error: {err}"
    );
}

/// Appends as the fetcher would, continuing from wherever the lane stands.
fn append(buffer: &Buffer, lane: Lane, partition: i32, records: &[Record], next: i64) {
    let state = buffer
        .partition_state("orders", partition)
        .expect("state")
        .expect("laid out");
    let layout = buffer
        .layout_id("orders", partition)
        .expect("layout id")
        .expect("laid out");
    let fetched = Fetched {
        layout,
        continues_from: state.lane(lane).fetched_next,
        records,
        next,
    };
    buffer
        .append(lane, "orders", partition, fetched)
        .expect("append");
}

fn record(offset: i64, payload: &[u8]) -> Record {
    Record {
        offset,
        timestamp: Timestamp::CreateTime(1000 + offset),
        key: Some(format!("k{offset}").into_bytes().into()),
        payload: Some(payload.to_vec().into()),
        headers: vec![Header {
            key: "trace".into(),
            value: Some(b"abc".to_vec()),
        }],
    }
}

/// A buffer with a split partition (catch-up 70..120, live from 120) and a plain one.
fn sample_buffer(dir: &Path) {
    sample_buffer_up_to(dir, SAMPLE_STEPS);
}

/// How many writes [`sample_buffer`] makes.
const SAMPLE_STEPS: usize = 6;

/// [`sample_buffer`]'s first `steps` writes only: what the buffer held after each.
fn sample_buffer_up_to(dir: &Path, steps: usize) {
    let buffer = Buffer::open(dir, BufferOptions::default()).expect("open");
    let writes: [&dyn Fn(&Buffer); SAMPLE_STEPS] = [
        &|buffer| {
            buffer
                .reset_partition("orders", 0, PartitionLayout::split(3, 70, 120))
                .expect("layout");
        },
        &|buffer| {
            let catchup: Vec<Record> = (70..100)
                .map(|o| record(o, format!("c{o}").as_bytes()))
                .collect();
            append(buffer, Lane::Catchup, 0, &catchup, 100);
        },
        &|buffer| {
            let live: Vec<Record> = (120..125)
                .map(|o| record(o, format!("l{o}").as_bytes()))
                .collect();
            append(buffer, Lane::Live, 0, &live, 125);
        },
        &|buffer| {
            buffer
                .record_committed(Lane::Catchup, "orders", 0, 80)
                .expect("commit");
        },
        &|buffer| {
            buffer
                .reset_partition("orders", 1, PartitionLayout::plain(5))
                .expect("layout");
        },
        &|buffer| append(buffer, Lane::Live, 1, &[record(5, &[0xff, 0xfe, 0x00])], 6),
    ];
    for write in &writes[..steps] {
        write(&buffer);
    }
    buffer.sync().expect("sync");
    // Released for the tools at once, not when sled's flusher next wakes up.
    buffer.close().expect("close");
}

fn file_digests(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            for (name, bytes) in file_digests(&path) {
                files.insert(
                    format!("{}/{name}", entry.file_name().to_string_lossy()),
                    bytes,
                );
            }
        } else {
            files.insert(
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read(&path).expect("read"),
            );
        }
    }
    files
}

#[test]
fn inspect_shows_lanes_and_cursors_without_touching_the_directory() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buf");
    sample_buffer(&dir);
    let before = file_digests(&dir);
    let dir_arg = dir.to_str().expect("utf-8 path");

    let output = catchup(&["inspect", dir_arg]);
    assert_exit(&output, 0);
    let text = stdout(&output);
    assert!(
        text.contains("orders/0") && text.contains("70..120") && text.contains("catchup"),
        "{text}"
    );

    let output = catchup(&["inspect", dir_arg, "--json"]);
    assert_exit(&output, 0);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(json["totals"]["partitions"], 2);
    assert_eq!(json["totals"]["records"], 36);
    let p0 = &json["partitions"][0];
    assert_eq!(
        (p0["epoch"].as_u64(), p0["boundary"].as_i64()),
        (Some(3), Some(120))
    );
    assert_eq!(p0["lanes"][0]["committed_next"], 80);
    assert_eq!(p0["lanes"][0]["fetched_next"], 100);
    assert_eq!(p0["lanes"][1]["last_offset"], 124);

    assert_exit(&catchup(&["verify", dir_arg]), 0);
    assert_eq!(
        file_digests(&dir),
        before,
        "an offline command modified the buffer"
    );
}

#[test]
fn dump_prints_json_lines_in_delivery_order() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buf");
    sample_buffer(&dir);
    let dir_arg = dir.to_str().expect("utf-8 path");

    let output = catchup(&["dump", dir_arg, "--partition", "0"]);
    assert_exit(&output, 0);
    let lines: Vec<serde_json::Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let order: Vec<(String, i64)> = lines
        .iter()
        .map(|l| {
            (
                l["lane"].as_str().unwrap_or("").to_owned(),
                l["offset"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let expected: Vec<(String, i64)> = (80..100)
        .map(|o| ("catchup".into(), o))
        .chain((120..125).map(|o| ("live".into(), o)))
        .collect();
    assert_eq!(
        order, expected,
        "unprocessed catch-up records first, then live"
    );
    assert_eq!(lines[0]["value"], "c80");
    assert_eq!(lines[0]["key"], "k80");
    assert_eq!(lines[0]["timestamp"], 1080);
    assert_eq!(lines[0]["headers"][0]["value"], "abc");

    let output = catchup(&[
        "dump", dir_arg, "--lane", "live", "--from", "122", "--limit", "2",
    ]);
    let offsets: Vec<String> = stdout(&output).lines().map(str::to_owned).collect();
    assert_eq!(offsets.len(), 2);
    assert!(
        offsets[0].contains("\"offset\":122") && offsets[1].contains("\"offset\":123"),
        "{offsets:?}"
    );

    let output = catchup(&["dump", dir_arg, "--topic", "orders", "--partition", "1"]);
    let line: serde_json::Value = serde_json::from_str(stdout(&output).trim()).expect("json");
    assert_eq!(line["value_b64"], "//4A", "non-UTF-8 values are base64");

    assert_exit(&catchup(&["dump", dir_arg, "--lane", "sideways"]), 2);
}

#[test]
fn verify_reports_a_hole_and_exits_1() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buf");
    sample_buffer(&dir);
    {
        // Remove the live chunk of orders/0 (topic id 0, partition 0, first offset 120).
        let db = support::raw_sled(&dir).expect("raw sled");
        let mut key = vec![b'L'];
        key.extend_from_slice(&0u32.to_be_bytes());
        key.extend_from_slice(&0u32.to_be_bytes());
        key.extend_from_slice(&120u64.to_be_bytes());
        assert!(
            db.remove(key).expect("remove").is_some(),
            "key layout changed?"
        );
        db.flush().expect("flush");
    }
    support::wait_sled_released(&dir);
    let output = catchup(&["verify", dir.to_str().expect("utf-8")]);
    assert_exit(&output, 1);
    assert!(
        stdout(&output).contains("orders/0 live lane"),
        "{}",
        stdout(&output)
    );
    let output = catchup(&["verify", dir.to_str().expect("utf-8"), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(json["ok"], false);
}

#[test]
fn unopenable_directories_exit_2_with_the_path_named() {
    let temp = tempfile::tempdir().expect("tempdir");
    let missing = temp.path().join("missing");
    let empty = temp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let garbage = temp.path().join("garbage");
    std::fs::create_dir(&garbage).expect("mkdir");
    std::fs::write(garbage.join("conf"), b"segment_size: lots\n").expect("write");
    std::fs::write(garbage.join("db"), vec![0x5a; 100_000]).expect("write");
    let foreign = temp.path().join("foreign");
    sled::open(&foreign)
        .and_then(|db| db.insert("k", "v").map(|_| ()))
        .expect("plain sled db");

    for (dir, words) in [
        (&missing, "does not exist"),
        (&empty, "not a catchup buffer"),
        (&garbage, ""),
        (&foreign, "not a catchup buffer"),
    ] {
        for command in ["inspect", "dump", "verify"] {
            let output = catchup(&[command, dir.to_str().expect("utf-8")]);
            assert_exit(&output, 2);
            let err = stderr(&output);
            assert!(
                err.contains(&*dir.to_string_lossy()) && err.contains(words),
                "{command} {dir:?}: {err}"
            );
        }
    }
}

#[test]
fn truncated_database_file_is_an_error_or_a_consistent_prefix() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buf");
    sample_buffer(&dir);
    // What `dump` shows of the buffer after each of its writes: a prefix sled recovers must
    // show one of these, never a mix or a record that was not written.
    let after_each_write: Vec<String> = (0..=SAMPLE_STEPS)
        .map(|steps| {
            let partial = temp.path().join(format!("after-{steps}"));
            sample_buffer_up_to(&partial, steps);
            let output = catchup(&["dump", partial.to_str().expect("utf-8")]);
            assert_exit(&output, 0);
            stdout(&output)
        })
        .collect();
    let db_file = dir.join("db");
    let length = std::fs::metadata(&db_file).expect("metadata").len();
    let mut recovered = Vec::new();
    for keep in [0, 100, length / 3, length / 2, length - 1] {
        let copy = temp.path().join(format!("truncated-{keep}"));
        copy_with_cut_database(&dir, &copy, keep);
        let output = catchup(&["verify", copy.to_str().expect("utf-8")]);
        // Either sled recovers a prefix that verifies clean, or the buffer is refused.
        match output.status.code() {
            Some(0) => {
                assert!(stdout(&output).contains("sound"));
                let dumped = catchup(&["dump", copy.to_str().expect("utf-8")]);
                assert_exit(&dumped, 0);
                let step = after_each_write
                    .iter()
                    .position(|expected| *expected == stdout(&dumped))
                    .unwrap_or_else(|| {
                        panic!(
                            "cut at {keep} of {length} bytes: the dump is the buffer after none of its writes:\n{}",
                            stdout(&dumped)
                        )
                    });
                recovered.push((keep, step));
            }
            _ => {
                assert_exit(&output, 2);
                // A sentence naming the buffer, not a debug dump of sled's error.
                let message = stderr(&output);
                assert!(message.contains(copy.to_str().expect("utf-8")), "{message}");
                for debug in ["Some(", "Inline(", "Blob(", "backtrace"] {
                    assert!(!message.contains(debug), "{message}");
                }
            }
        }
    }
    // Losing the last byte loses at most the last write; refusing every cut is not recovery.
    // (Writes that add no record dump alike: the first equal dump stands for them all.)
    let all_but_the_last = |step: usize| {
        after_each_write[step] == after_each_write[SAMPLE_STEPS - 1]
            || after_each_write[step] == after_each_write[SAMPLE_STEPS]
    };
    assert!(
        recovered
            .iter()
            .any(|&(keep, step)| keep == length - 1 && all_but_the_last(step)),
        "a database one byte short recovers all but its last write at most: {recovered:?}"
    );
}

#[test]
fn future_format_version_exits_2() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buf");
    sample_buffer(&dir);
    {
        // Rewrite the metadata value as format version 2 with a valid checksum.
        let db = support::raw_sled(&dir).expect("raw sled");
        let mut meta = db.get(b"M").expect("get").expect("metadata").to_vec();
        meta[0] = 2;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&meta[..1]), &meta[5..]);
        meta[1..5].copy_from_slice(&crc.to_le_bytes());
        db.insert(b"M", meta).expect("insert");
        db.flush().expect("flush");
    }
    support::wait_sled_released(&dir);
    let output = catchup(&["inspect", dir.to_str().expect("utf-8")]);
    assert_exit(&output, 2);
    assert!(
        stderr(&output).contains("format version 2"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_directory_in_use_is_refused() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buf");
    sample_buffer(&dir);
    let _held = Buffer::open(&dir, BufferOptions::default()).expect("open");
    for command in ["inspect", "dump", "verify"] {
        let output = catchup(&[command, dir.to_str().expect("utf-8")]);
        assert_exit(&output, 2);
        assert!(stderr(&output).contains("in use"), "{}", stderr(&output));
    }
}

/// The offline tools copy the buffer where `--tmp-dir` says (a multi-GB buffer need not fit
/// in the system's temporary directory), and say so when that place cannot take it.
#[test]
fn tools_copy_into_the_tmp_dir_given() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("buf");
    sample_buffer(&dir);
    let dir_arg = dir.to_str().expect("utf-8");
    let scratch = temp.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch");
    let scratch_arg = scratch.to_str().expect("utf-8");
    for command in ["inspect", "verify"] {
        assert_exit(&catchup(&[command, dir_arg, "--tmp-dir", scratch_arg]), 0);
    }
    assert_exit(&catchup(&["dump", dir_arg, "--tmp-dir", scratch_arg]), 0);
    assert_eq!(
        std::fs::read_dir(&scratch).expect("scratch").count(),
        0,
        "the private copies are removed"
    );
    let missing = temp.path().join("no-such-dir");
    let output = catchup(&[
        "verify",
        dir_arg,
        "--tmp-dir",
        missing.to_str().expect("utf-8"),
    ]);
    assert_exit(&output, 2);
    assert!(
        stderr(&output).contains("no-such-dir"),
        "{}",
        stderr(&output)
    );
}

/// A buffer directory whose name is not UTF-8 still gets its JSON report (the name as
/// `display` shows it), and a reader that closes the pipe early (`| head -1`) is no error.
#[test]
fn json_reports_and_closed_pipes_are_no_panic() {
    use std::os::unix::ffi::OsStrExt;
    use std::process::Stdio;
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join(std::ffi::OsStr::from_bytes(b"buf-\xff"));
    sample_buffer(&dir);
    for command in ["inspect", "verify"] {
        let output = Command::new(env!("CARGO_BIN_EXE_catchup"))
            .args([command.as_ref(), "--json".as_ref(), dir.as_os_str()])
            .output()
            .expect("run catchup");
        assert_exit(&output, 0);
        let report: serde_json::Value =
            serde_json::from_str(stdout(&output).trim()).expect("one JSON document");
        assert_eq!(report["dir"], dir.display().to_string(), "{command}");
    }
    for args in [&["inspect"][..], &["inspect", "--json"], &["verify"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_catchup"))
            .args(args)
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run catchup");
        // Closed before catchup writes (it opens the buffer first).
        drop(child.stdout.take());
        let output = child.wait_with_output().expect("output");
        assert_exit(&output, 0);
    }
}
