//! Records of a live lane and appends of them as a fetcher makes them, for the tests that
//! read a buffer while other threads write it (`tail_reads`, `tier_reads`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use catchup::store::{AppendOutcome, Buffer, Fetched, Lane, Record, Timestamp};

/// Raises its flag when dropped: a writer thread holds one, so that its reader sees it end
/// whether it returns or panics (a reader waiting for appends that never come would hang).
pub struct RaisedWhenDropped(pub Arc<AtomicBool>);

impl Drop for RaisedWhenDropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The record at `offset`: its value is the offset's bytes, `copies` times over, so that a
/// read can tell it from any other.
pub fn record(offset: i64, copies: usize) -> Record {
    Record {
        offset,
        timestamp: Timestamp::CreateTime(offset),
        key: None,
        payload: Some(offset.to_be_bytes().repeat(copies).into()),
        headers: Vec::new(),
    }
}

/// Appends the records of `offsets` to the live lane of `topic`/`partition` as a fetcher
/// would: continuing from where the lane stands, under its current layout.
pub fn append(
    buffer: &Buffer,
    topic: &str,
    partition: i32,
    offsets: std::ops::Range<i64>,
    copies: usize,
) -> AppendOutcome {
    let layout = buffer
        .layout_id(topic, partition)
        .expect("layout id")
        .expect("laid out");
    let records: Vec<Record> = offsets
        .clone()
        .map(|offset| record(offset, copies))
        .collect();
    buffer
        .append(
            Lane::Live,
            topic,
            partition,
            Fetched {
                layout,
                continues_from: offsets.start,
                records: &records,
                next: offsets.end,
            },
        )
        .expect("append")
}
