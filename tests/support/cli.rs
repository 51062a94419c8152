//! Helpers for tests that run the `catchup` binary: its JSON-lines sink and its exit.

use std::path::Path;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// The complete lines of a `catchup run --sink` file, parsed (a line being written, or torn by
/// a SIGKILL, was never acknowledged and is left out).
pub fn sink_lines(sink: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(sink).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// The JSON lines `catchup run --sink -` wrote to its standard output, parsed.
pub fn stdout_lines(output: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Waits for `child` to exit, killing it and failing the test after `limit`.
pub fn wait_with_deadline(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("catchup run did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// Copies the buffer directory `from` to `to` with its database file cut to `keep` bytes: a
/// torn or partly written database.
pub fn copy_with_cut_database(from: &Path, to: &Path, keep: u64) {
    std::fs::create_dir(to).expect("mkdir");
    for file in ["conf", "db"] {
        std::fs::copy(from.join(file), to.join(file)).expect("copy");
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(to.join("db"))
        .and_then(|f| f.set_len(keep))
        .expect("truncate");
}
