//! The one JSON schema of a record, shared by `dump` and the `run` sink: `topic`,
//! `partition`, `lane`, `offset`, `timestamp` (ms or null) and `timestamp_type`, `key` and
//! `value` (text, or `key_b64`/`value_b64` when not UTF-8, null for none), and `headers`
//! (`[{"key": …, "value": …}]`, values encoded the same way). A processed record adds
//! `assignment` and `processed_at_ms`. Fields are written in name order.
//!
//! A line is serialized straight into its writer: `catchup run` writes one per record, and
//! building a JSON tree first (a map, a string per field) cost more than the write. The sink
//! writes it by hand ([`RecordLine::write_to`]): serde_json looks up every byte of a string in
//! its escape table, a tenth of the machine at 1 KiB values, where most values need no escape
//! at all and a check that runs in wide words tells so. The `Serialize` impl is the schema's
//! reference; the hand-written line is tested byte for byte against it.

use base64::Engine;
use catchup::Timestamp;
use serde::ser::{Serialize, SerializeMap, Serializer};

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

/// A record as one JSON object: the view, and for a processed record the assignment it was
/// delivered under and when it was processed (milliseconds since the epoch).
pub struct RecordLine<'a> {
    pub record: RecordView<'a>,
    pub processed: Option<Processed>,
}

/// The fields `catchup run` adds to a record it processed.
#[derive(Clone, Copy)]
pub struct Processed {
    pub assignment: u64,
    pub processed_at_ms: u64,
}

impl<'a> RecordLine<'a> {
    /// A record `catchup run` processed at `processed_at_ms`.
    pub fn processed(delivery: &'a catchup::Delivery, processed_at_ms: u128) -> Self {
        Self {
            record: RecordView {
                topic: &delivery.topic,
                partition: delivery.partition,
                lane: delivery.lane.as_str(),
                offset: delivery.offset,
                timestamp: delivery.timestamp,
                key: delivery.key.as_deref(),
                value: delivery.payload.as_deref(),
                headers: delivery
                    .headers
                    .iter()
                    .map(|h| (h.key.as_str(), h.value.as_deref()))
                    .collect(),
            },
            processed: Some(Processed {
                assignment: delivery.assignment(),
                processed_at_ms: processed_at_ms as u64,
            }),
        }
    }

    /// A record of the buffer, in `topic`'s `partition`, `lane` (as `dump` prints it).
    pub fn stored(
        topic: &'a str,
        partition: i32,
        lane: catchup::store::Lane,
        record: &'a catchup::store::Record,
    ) -> Self {
        Self {
            record: RecordView {
                topic,
                partition,
                lane: lane.as_str(),
                offset: record.offset,
                timestamp: stored_timestamp(record.timestamp),
                key: record.key.as_deref(),
                value: record.payload.as_deref(),
                headers: record
                    .headers
                    .iter()
                    .map(|h| (h.key.as_str(), h.value.as_deref()))
                    .collect(),
            },
            processed: None,
        }
    }

    /// Writes the line (no newline) to `out`: what the `Serialize` impl writes, byte for
    /// byte, with text that needs no escape copied as it is and numbers written by `itoa`
    /// (`write!` went through the formatting machinery piece by piece).
    pub fn write_to<W: std::io::Write>(&self, out: &mut W) -> std::io::Result<()> {
        let record = &self.record;
        let (timestamp, timestamp_type) = match record.timestamp {
            Timestamp::NotAvailable => (None, "none"),
            Timestamp::CreateTime(ms) => (Some(ms), "create_time"),
            Timestamp::LogAppendTime(ms) => (Some(ms), "log_append_time"),
        };
        let mut numbers = itoa::Buffer::new();
        out.write_all(b"{")?;
        if let Some(processed) = self.processed {
            out.write_all(b"\"assignment\":")?;
            out.write_all(numbers.format(processed.assignment).as_bytes())?;
            out.write_all(b",")?;
        }
        out.write_all(b"\"headers\":")?;
        if record.headers.is_empty() {
            out.write_all(b"[]")?;
        } else {
            serde_json::to_writer(&mut *out, &Headers(&record.headers))?;
        }
        out.write_all(b",")?;
        write_bytes_field(out, "key", record.key)?;
        out.write_all(b",\"lane\":")?;
        write_text(out, record.lane)?;
        out.write_all(b",\"offset\":")?;
        out.write_all(numbers.format(record.offset).as_bytes())?;
        out.write_all(b",\"partition\":")?;
        out.write_all(numbers.format(record.partition).as_bytes())?;
        out.write_all(b",")?;
        if let Some(processed) = self.processed {
            out.write_all(b"\"processed_at_ms\":")?;
            out.write_all(numbers.format(processed.processed_at_ms).as_bytes())?;
            out.write_all(b",")?;
        }
        out.write_all(b"\"timestamp\":")?;
        match timestamp {
            Some(ms) => out.write_all(numbers.format(ms).as_bytes())?,
            None => out.write_all(b"null")?,
        }
        out.write_all(b",\"timestamp_type\":\"")?;
        out.write_all(timestamp_type.as_bytes())?;
        out.write_all(b"\",\"topic\":")?;
        write_text(out, record.topic)?;
        out.write_all(b",")?;
        write_bytes_field(out, "value", record.value)?;
        out.write_all(b"}")
    }

    /// The line as text (no newline).
    pub fn to_text(&self) -> String {
        // Serializing borrowed bytes and numbers into a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A timestamp of the buffer, as the public type.
fn stored_timestamp(stored: catchup::store::Timestamp) -> Timestamp {
    match stored {
        catchup::store::Timestamp::NotAvailable => Timestamp::NotAvailable,
        catchup::store::Timestamp::CreateTime(ms) => Timestamp::CreateTime(ms),
        catchup::store::Timestamp::LogAppendTime(ms) => Timestamp::LogAppendTime(ms),
    }
}

impl Serialize for RecordLine<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let record = &self.record;
        let (timestamp, timestamp_type) = match record.timestamp {
            Timestamp::NotAvailable => (None, "none"),
            Timestamp::CreateTime(ms) => (Some(ms), "create_time"),
            Timestamp::LogAppendTime(ms) => (Some(ms), "log_append_time"),
        };
        let mut map = serializer.serialize_map(None)?;
        if let Some(processed) = self.processed {
            map.serialize_entry("assignment", &processed.assignment)?;
        }
        map.serialize_entry("headers", &Headers(&record.headers))?;
        bytes_entry(&mut map, "key", record.key)?;
        map.serialize_entry("lane", record.lane)?;
        map.serialize_entry("offset", &record.offset)?;
        map.serialize_entry("partition", &record.partition)?;
        if let Some(processed) = self.processed {
            map.serialize_entry("processed_at_ms", &processed.processed_at_ms)?;
        }
        map.serialize_entry("timestamp", &timestamp)?;
        map.serialize_entry("timestamp_type", timestamp_type)?;
        map.serialize_entry("topic", record.topic)?;
        bytes_entry(&mut map, "value", record.value)?;
        map.end()
    }
}

/// `name` with the text when `bytes` are UTF-8, else `name_b64` with base64; `null` for no
/// bytes.
fn bytes_entry<M: SerializeMap>(
    map: &mut M,
    name: &'static str,
    bytes: Option<&[u8]>,
) -> Result<(), M::Error> {
    let Some(bytes) = bytes else {
        return map.serialize_entry(name, &None::<&str>);
    };
    match std::str::from_utf8(bytes) {
        Ok(text) => map.serialize_entry(name, text),
        Err(_) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            map.serialize_entry(&format!("{name}_b64"), &encoded)
        }
    }
}

/// `"name":` and the text when `bytes` are UTF-8, else `"name_b64":` and base64; `null` for
/// no bytes (as [`bytes_entry`]).
fn write_bytes_field<W: std::io::Write>(
    out: &mut W,
    name: &str,
    bytes: Option<&[u8]>,
) -> std::io::Result<()> {
    let field = |out: &mut W, suffix: &str| {
        out.write_all(b"\"")?;
        out.write_all(name.as_bytes())?;
        out.write_all(suffix.as_bytes())?;
        out.write_all(b"\":")
    };
    let Some(bytes) = bytes else {
        field(out, "")?;
        return out.write_all(b"null");
    };
    if plain_ascii(bytes) {
        field(out, "")?;
        out.write_all(b"\"")?;
        out.write_all(bytes)?;
        return out.write_all(b"\"");
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            field(out, "")?;
            write_text(out, text)
        }
        Err(_) => {
            field(out, "_b64")?;
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            out.write_all(b"\"")?;
            out.write_all(encoded.as_bytes())?;
            out.write_all(b"\"")
        }
    }
}

/// `text` as a JSON string: copied as it is when nothing in it needs an escape, else through
/// serde_json.
fn write_text<W: std::io::Write>(out: &mut W, text: &str) -> std::io::Result<()> {
    if needs_no_escape(text.as_bytes()) {
        out.write_all(b"\"")?;
        out.write_all(text.as_bytes())?;
        out.write_all(b"\"")
    } else {
        serde_json::to_writer(out, text).map_err(std::io::Error::from)
    }
}

/// Whether JSON takes `bytes` (UTF-8) as they are inside a string: no control character, no
/// quote, no backslash (what serde_json escapes).
fn needs_no_escape(bytes: &[u8]) -> bool {
    all_bytes(bytes, |byte| {
        (byte >= 0x20) & (byte != b'"') & (byte != b'\\')
    })
}

/// Whether `bytes` are ASCII that JSON takes as they are inside a string: valid UTF-8
/// without a second look (`from_utf8` cost a third as much as the escape check at 1 KiB).
fn plain_ascii(bytes: &[u8]) -> bool {
    all_bytes(bytes, |byte| {
        // 0x20..0x80 in one comparison.
        (byte.wrapping_sub(0x20) < 0x60) & (byte != b'"') & (byte != b'\\')
    })
}

/// Whether `plain` holds for every byte: 32 at a time with no branch inside, so that the
/// compiler can use wide registers.
fn all_bytes(bytes: &[u8], plain: impl Fn(u8) -> bool) -> bool {
    bytes
        .chunks(32)
        .all(|chunk| chunk.iter().fold(true, |all, &byte| all & plain(byte)))
}

/// The headers as `[{"key": …, "value": …}]`.
struct Headers<'a>(&'a [(&'a str, Option<&'a [u8]>)]);

impl Serialize for Headers<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|&(key, value)| Header { key, value }))
    }
}

struct Header<'a> {
    key: &'a str,
    value: Option<&'a [u8]>,
}

impl Serialize for Header<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("key", self.key)?;
        bytes_entry(&mut map, "value", self.value)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn view<'a>(key: Option<&'a [u8]>, value: Option<&'a [u8]>) -> RecordView<'a> {
        RecordView {
            topic: "orders",
            partition: 3,
            lane: "live",
            offset: 42,
            timestamp: Timestamp::CreateTime(1_700_000_000_000),
            key,
            value,
            headers: vec![
                ("trace", Some(b"abc")),
                ("bin", Some(&[0xff, 0x00])),
                ("none", None),
            ],
        }
    }

    /// The schema's fields and their encodings, in name order (as the tree this replaced
    /// wrote them, so lines stay byte for byte what they were).
    #[test]
    fn a_line_has_every_field_in_name_order() {
        let line = RecordLine {
            record: view(Some(b"k1"), Some(&[0xff, 0xfe])),
            processed: Some(Processed {
                assignment: 7,
                processed_at_ms: 1_800_000_000_000,
            }),
        }
        .to_text();
        let expected = json!({
            "assignment": 7,
            "headers": [
                {"key": "trace", "value": "abc"},
                {"key": "bin", "value_b64": "/wA="},
                {"key": "none", "value": null},
            ],
            "key": "k1",
            "lane": "live",
            "offset": 42,
            "partition": 3,
            "processed_at_ms": 1_800_000_000_000u64,
            "timestamp": 1_700_000_000_000i64,
            "timestamp_type": "create_time",
            "topic": "orders",
            "value_b64": "//4=",
        });
        // serde_json's map sorts its keys: its text is the name order.
        assert_eq!(line, expected.to_string());
    }

    proptest! {
        /// The hand-written line is the `Serialize` impl's, byte for byte: text with and
        /// without escapes (quotes, backslashes, control characters, non-ASCII, plain ASCII), bytes that
        /// are not UTF-8, absent keys and values, headers, every timestamp type, both kinds
        /// of line.
        #[test]
        fn the_written_line_is_the_serialized_one(
            topic in "[a-z\"\\\\\u{0}-\u{1f}é]{0,12}",
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            value in proptest::option::of(prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                "[ -~\u{7f}-\u{3ff}]{0,300}".prop_map(String::into_bytes),
                "[ -~]{0,300}".prop_map(String::into_bytes),
            ]),
            headers in proptest::collection::vec(
                ("[a-z\"]{0,6}", proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8))),
                0..3,
            ),
            offset in any::<i64>(),
            partition in any::<i32>(),
            timestamp in prop_oneof![
                Just(Timestamp::NotAvailable),
                any::<i64>().prop_map(Timestamp::CreateTime),
                any::<i64>().prop_map(Timestamp::LogAppendTime),
            ],
            processed in proptest::option::of((any::<u64>(), any::<u64>())),
        ) {
            let line = RecordLine {
                record: RecordView {
                    topic: &topic,
                    partition,
                    lane: "catchup",
                    offset,
                    timestamp,
                    key: key.as_deref(),
                    value: value.as_deref(),
                    headers: headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect(),
                },
                processed: processed.map(|(assignment, processed_at_ms)| Processed {
                    assignment,
                    processed_at_ms,
                }),
            };
            let mut written = Vec::new();
            line.write_to(&mut written).unwrap();
            prop_assert_eq!(String::from_utf8(written).unwrap(), line.to_text());
        }
    }

    #[test]
    fn text_that_needs_an_escape_is_told_apart() {
        assert!(needs_no_escape(b""));
        assert!(needs_no_escape(
            "plain text, é and / stay as they are".as_bytes()
        ));
        assert!(plain_ascii(b"plain text / stays"));
        assert!(!plain_ascii("é".as_bytes()), "not ASCII");
        assert!(!plain_ascii(&[0x7f + 1]));
        for bad in [b'"', b'\\', b'\n', 0x00, 0x1f] {
            // At every position of a 70-byte text: in each 32-byte chunk and the short tail.
            for at in 0..70 {
                let mut text = vec![b'a'; 70];
                text[at] = bad;
                assert!(!needs_no_escape(&text), "{bad:#x} at {at}");
                assert!(!plain_ascii(&text), "{bad:#x} at {at}");
            }
        }
    }

    #[test]
    fn a_dumped_record_has_no_processing_fields_and_null_bytes_stay_null() {
        let mut record = view(None, None);
        record.timestamp = Timestamp::NotAvailable;
        record.headers.clear();
        let line = RecordLine {
            record,
            processed: None,
        }
        .to_text();
        let parsed: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            line,
            json!({
                "headers": [],
                "key": null,
                "lane": "live",
                "offset": 42,
                "partition": 3,
                "timestamp": null,
                "timestamp_type": "none",
                "topic": "orders",
                "value": null,
            })
            .to_string()
        );
        assert!(parsed.get("assignment").is_none());
    }
}
