//! `catchup inspect`: per topic/partition and lane, what a buffer holds.

use std::fmt::Write;
use std::path::Path;

use catchup::store::{Buffer, BufferStats, LaneStats, PartitionStats, StoreError};
use serde_json::{Value, json};

pub fn print(dir: &Path, buffer: &Buffer, as_json: bool) -> Result<(), StoreError> {
    let stats = buffer.stats()?;
    let text = if as_json {
        to_json(dir, &stats).to_string()
    } else {
        let mut table = String::new();
        // Writing into a `String` cannot fail.
        let _ = write_table(&mut table, dir, &stats);
        table.trim_end().to_owned()
    };
    crate::print_quietly(&text);
    Ok(())
}

fn ranges(partition: &PartitionStats) -> String {
    let ranges = &partition.state.layout.catchup_ranges;
    if ranges.is_empty() {
        return "-".into();
    }
    ranges
        .iter()
        .map(|r| format!("{}..{}", r.start, r.end))
        .collect::<Vec<_>>()
        .join(",")
}

fn opt(value: Option<i64>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

fn write_table(out: &mut String, dir: &Path, stats: &BufferStats) -> std::fmt::Result {
    writeln!(
        out,
        "buffer {} — {} partition(s), {} on disk",
        dir.display(),
        stats.partitions.len(),
        human_bytes(stats.disk_bytes)
    )?;
    if stats.partitions.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:>5} {:<16} {:>10}  {:<7} {:>10} {:>12} {:>14} {:>9} {:>10} {:>10} {:>10}",
        "topic/partition",
        "epoch",
        "catch-up ranges",
        "boundary",
        "lane",
        "retained",
        "fetched_next",
        "committed_next",
        "records",
        "first",
        "last",
        "bytes"
    )?;
    let (mut records, mut bytes) = (0, 0);
    for partition in &stats.partitions {
        let state = &partition.state;
        for (index, lane) in partition.lanes.iter().enumerate() {
            let cursors = state.lane(lane.lane);
            let (name, epoch, ranges, boundary) = if index == 0 {
                (
                    format!("{}/{}", partition.topic, partition.partition),
                    state.layout.epoch.to_string(),
                    ranges(partition),
                    opt(state.layout.boundary()),
                )
            } else {
                Default::default()
            };
            writeln!(
                out,
                "{name:<24} {epoch:>5} {ranges:<16} {boundary:>10}  {:<7} {:>10} {:>12} {:>14} {:>9} {:>10} {:>10} {:>10}",
                lane.lane.as_str(),
                cursors.retained_from,
                cursors.fetched_next,
                cursors.committed_next,
                lane.records,
                opt(lane.first_offset),
                opt(lane.last_offset),
                human_bytes(lane.bytes),
            )?;
            records += lane.records;
            bytes += lane.bytes;
        }
    }
    writeln!(
        out,
        "totals: {records} record(s), {} in chunks",
        human_bytes(bytes)
    )
}

fn lane_json(lane: &LaneStats, partition: &PartitionStats) -> Value {
    let cursors = partition.state.lane(lane.lane);
    json!({
        "lane": lane.lane.as_str(),
        "retained_from": cursors.retained_from,
        "fetched_next": cursors.fetched_next,
        "committed_next": cursors.committed_next,
        "chunks": lane.chunks,
        "records": lane.records,
        "bytes": lane.bytes,
        "first_offset": lane.first_offset,
        "last_offset": lane.last_offset,
    })
}

fn to_json(dir: &Path, stats: &BufferStats) -> Value {
    let partitions: Vec<Value> = stats
        .partitions
        .iter()
        .map(|p| {
            json!({
                "topic": p.topic,
                "partition": p.partition,
                "epoch": p.state.layout.epoch,
                "catchup_ranges": p.state.layout.catchup_ranges.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
                "boundary": p.state.layout.boundary(),
                "live_from": p.state.layout.live_from,
                "lanes": p.lanes.iter().map(|lane| lane_json(lane, p)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let records: u64 = stats
        .partitions
        .iter()
        .flat_map(|p| &p.lanes)
        .map(|l| l.records)
        .sum();
    let bytes: u64 = stats
        .partitions
        .iter()
        .flat_map(|p| &p.lanes)
        .map(|l| l.bytes)
        .sum();
    json!({
        // A path that is not UTF-8 has no JSON string: shown as `display` shows it.
        "dir": dir.display().to_string(),
        "disk_bytes": stats.disk_bytes,
        "partitions": partitions,
        "totals": { "partitions": stats.partitions.len(), "records": records, "bytes": bytes },
    })
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
