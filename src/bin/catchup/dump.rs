//! `catchup dump`: buffered records as JSON lines, in delivery order.

use std::io::Write;
use std::path::PathBuf;

use base64::Engine;
use catchup::store::{Buffer, Lane, PartitionState, Record, StoreError, Timestamp};
use serde_json::{Value, json};

/// Arguments of `catchup dump`.
#[derive(clap::Args)]
pub struct DumpArgs {
    /// The buffer directory.
    pub dir: PathBuf,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this partition.
    #[arg(long)]
    pub partition: Option<i32>,
    /// Only this lane (default: both, catch-up first — the `Ordered` delivery order).
    #[arg(long, value_parser = parse_lane)]
    pub lane: Option<Lane>,
    /// Start at this offset (default: each lane's first unprocessed offset).
    #[arg(long)]
    pub from: Option<i64>,
    /// Print at most this many records.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Where the private copy of the buffer goes (default: the system's temporary
    /// directory); it needs the buffer's size free.
    #[arg(long)]
    pub tmp_dir: Option<PathBuf>,
}

fn parse_lane(text: &str) -> Result<Lane, String> {
    match text {
        "catchup" => Ok(Lane::Catchup),
        "live" => Ok(Lane::Live),
        other => Err(format!("unknown lane '{other}': use 'catchup' or 'live'")),
    }
}

pub fn print(args: &DumpArgs, buffer: &Buffer) -> Result<(), StoreError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut left = args.limit.unwrap_or(usize::MAX);
    for (topic, partition, state) in buffer.partitions()? {
        if args.topic.as_ref().is_some_and(|t| *t != topic)
            || args.partition.is_some_and(|p| p != partition)
        {
            continue;
        }
        let lanes: &[Lane] = match args.lane {
            Some(Lane::Catchup) => &[Lane::Catchup],
            Some(Lane::Live) => &[Lane::Live],
            None => &Lane::ALL,
        };
        for &lane in lanes {
            left = dump_lane(
                buffer,
                &mut out,
                (&topic, partition, &state),
                lane,
                args.from,
                left,
            )?;
            if left == 0 {
                return flush(out);
            }
        }
    }
    flush(out)
}

fn flush(mut out: impl Write) -> Result<(), StoreError> {
    // A closed pipe (`catchup dump | head`) is not an error worth reporting.
    let _ = out.flush();
    Ok(())
}

fn dump_lane(
    buffer: &Buffer,
    out: &mut impl Write,
    (topic, partition, state): (&str, i32, &PartitionState),
    lane: Lane,
    from: Option<i64>,
    mut left: usize,
) -> Result<usize, StoreError> {
    let mut next = from.unwrap_or(state.lane(lane).committed_next);
    while left > 0 {
        let batch = buffer.read(lane, topic, partition, next, left.min(10_000))?;
        if batch.records.is_empty() {
            break;
        }
        for record in batch.records.iter().take(left) {
            if writeln!(out, "{}", record_json(topic, partition, lane, record)).is_err() {
                return Ok(0); // stdout closed: stop quietly
            }
            left -= 1;
        }
        next = batch.next;
    }
    Ok(left)
}

/// A JSON field for `bytes`: `name` with the text when it is UTF-8, else `name_b64` with
/// base64; `null` for no bytes. Shared by `dump` and the `run` sink.
pub fn bytes_field(name: &str, bytes: &Option<Vec<u8>>) -> (String, Value) {
    match bytes {
        None => (name.to_owned(), Value::Null),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => (name.to_owned(), Value::String(text.to_owned())),
            Err(_) => (
                format!("{name}_b64"),
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            ),
        },
    }
}

fn record_json(topic: &str, partition: i32, lane: Lane, record: &Record) -> Value {
    let (timestamp, timestamp_type) = match record.timestamp {
        Timestamp::NotAvailable => (None, "none"),
        Timestamp::CreateTime(ms) => (Some(ms), "create_time"),
        Timestamp::LogAppendTime(ms) => (Some(ms), "log_append_time"),
    };
    let mut object = serde_json::Map::new();
    object.insert("topic".into(), json!(topic));
    object.insert("partition".into(), json!(partition));
    object.insert("lane".into(), json!(lane.as_str()));
    object.insert("offset".into(), json!(record.offset));
    object.insert("timestamp".into(), json!(timestamp));
    object.insert("timestamp_type".into(), json!(timestamp_type));
    let (key_name, key) = bytes_field("key", &record.key);
    object.insert(key_name, key);
    let (value_name, value) = bytes_field("value", &record.payload);
    object.insert(value_name, value);
    let headers: Vec<Value> = record
        .headers
        .iter()
        .map(|h| {
            let (name, value) = bytes_field("value", &h.value);
            json!({ "key": h.key, name: value })
        })
        .collect();
    object.insert("headers".into(), Value::Array(headers));
    Value::Object(object)
}
