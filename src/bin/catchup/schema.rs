//! The one JSON schema of a record, shared by `dump` and the `run` sink: `topic`,
//! `partition`, `lane`, `offset`, `timestamp` (ms or null) and `timestamp_type`, `key` and
//! `value` (text, or `key_b64`/`value_b64` when not UTF-8, null for none), and `headers`
//! (`[{"key": …, "value": …}]`, values encoded the same way).

use base64::Engine;
use catchup::Timestamp;
use serde_json::{Map, Value, json};

/// A JSON field for `bytes`: `name` with the text when it is UTF-8, else `name_b64` with
/// base64; `null` for no bytes.
pub fn bytes_field(name: &str, bytes: Option<&[u8]>) -> (String, Value) {
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

/// What a record is made of, wherever it comes from (the buffer or a delivery).
pub struct RecordView<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub lane: &'a str,
    pub offset: i64,
    pub timestamp: Timestamp,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// `(name, value)` in the producer's order.
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

/// A timestamp of the buffer, as the public type.
pub fn stored_timestamp(stored: catchup::store::Timestamp) -> Timestamp {
    match stored {
        catchup::store::Timestamp::NotAvailable => Timestamp::NotAvailable,
        catchup::store::Timestamp::CreateTime(ms) => Timestamp::CreateTime(ms),
        catchup::store::Timestamp::LogAppendTime(ms) => Timestamp::LogAppendTime(ms),
    }
}

/// The record as a JSON object.
pub fn record_json(record: RecordView<'_>) -> Map<String, Value> {
    let (timestamp, timestamp_type) = match record.timestamp {
        Timestamp::NotAvailable => (None, "none"),
        Timestamp::CreateTime(ms) => (Some(ms), "create_time"),
        Timestamp::LogAppendTime(ms) => (Some(ms), "log_append_time"),
    };
    let mut object = Map::new();
    object.insert("topic".into(), json!(record.topic));
    object.insert("partition".into(), json!(record.partition));
    object.insert("lane".into(), json!(record.lane));
    object.insert("offset".into(), json!(record.offset));
    object.insert("timestamp".into(), json!(timestamp));
    object.insert("timestamp_type".into(), json!(timestamp_type));
    let (key_name, key) = bytes_field("key", record.key);
    object.insert(key_name, key);
    let (value_name, value) = bytes_field("value", record.value);
    object.insert(value_name, value);
    let headers: Vec<Value> = record
        .headers
        .iter()
        .map(|(key, value)| {
            let (name, value) = bytes_field("value", *value);
            json!({ "key": key, name: value })
        })
        .collect();
    object.insert("headers".into(), Value::Array(headers));
    object
}
