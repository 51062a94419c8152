//! The metrics catchup reports through the `metrics` facade: every name, its type, unit and
//! labels in one place. Each carries the consumer's `group`, so that two consumers in one
//! process (two groups) never write the same series; lanes are `catchup` and `live`.
//!
//! | name | type | unit | labels |
//! |---|---|---|---|
//! | `catchup_records_fetched_total` | counter | records | group, lane |
//! | `catchup_records_delivered_total` | counter | records | group, lane |
//! | `catchup_records_superseded_total` | counter | records | group, lane |
//! | `catchup_lag_offsets` | gauge | offsets | group, lane |
//! | `catchup_buffered_bytes` | gauge | bytes | group, lane |
//! | `catchup_buffer_spilled_bytes_total` | counter | bytes | group |
//! | `catchup_time_to_first_fresh_seconds` | histogram | seconds | group |
//! | `catchup_merges_total` | counter | merges | group |
//! | `catchup_buffer_compactions_total` | counter | compactions | group |
//! | `catchup_broker_errors_total` | counter | errors | group |
//! | `catchup_truncated_offsets_total` | counter | offsets | group, topic |
//! | `catchup_stale_state_total` | counter | decisions | group, topic |
//! | `catchup_partitions_discarded_total` | counter | partitions | group, topic |
//! | `catchup_partition_backlog_offsets` | gauge | offsets | group, topic, partition |
//! | `catchup_partition_backlog_eta_seconds` | gauge | seconds | group, topic, partition |
//! | `catchup_partition_live_lag_offsets` | gauge | offsets | group, topic, partition |
//! | `catchup_partition_live_lag_seconds` | gauge | seconds | group, topic, partition |

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use super::types::Event;

/// Records fetched into the buffer (after the buffer proved them), per lane.
pub const RECORDS_FETCHED: &str = "catchup_records_fetched_total";
/// Records handed to the application, per lane it came through.
pub const RECORDS_DELIVERED: &str = "catchup_records_delivered_total";
/// `Mode::Latest`: records skipped because a newer record of their key was buffered or
/// delivered, per lane.
pub const RECORDS_SUPERSEDED: &str = "catchup_records_superseded_total";
/// Offsets fetched into the buffer and not processed yet, per lane.
pub const LAG_OFFSETS: &str = "catchup_lag_offsets";
/// Payload bytes buffered and not processed yet, per lane.
pub const BUFFERED_BYTES: &str = "catchup_buffered_bytes";
/// Bytes the memory tier wrote to disk because they waited (a live lane behind its backlog
/// in `Ordered`, a reader behind its fetcher, commits held up); 0 while every record is
/// processed and committed from memory.
pub const SPILLED_BYTES: &str = "catchup_buffer_spilled_bytes_total";
/// From an assignment to the first fresh (live-lane) record delivered.
pub const TIME_TO_FIRST_FRESH: &str = "catchup_time_to_first_fresh_seconds";
/// Splits merged back into the group's offsets.
pub const MERGES: &str = "catchup_merges_total";
/// Buffer compactions that gave disk back.
pub const COMPACTIONS: &str = "catchup_buffer_compactions_total";
/// Connection failures the clients reported (they retry by themselves).
pub const BROKER_ERRORS: &str = "catchup_broker_errors_total";
/// Offsets retention deleted before they were processed (`Event::Truncated`).
pub const TRUNCATED_OFFSETS: &str = "catchup_truncated_offsets_total";
/// Side entries or split tokens found stale and not trusted (`Event::StaleState`).
pub const STALE_STATE: &str = "catchup_stale_state_total";
/// Partitions whose buffered records were discarded and fetched again
/// (`Event::LocalDiscarded`).
pub const PARTITIONS_DISCARDED: &str = "catchup_partitions_discarded_total";

/// Offsets of the backlog not processed yet, per partition (0 when not split).
pub const PARTITION_BACKLOG: &str = "catchup_partition_backlog_offsets";
/// Seconds until the backlog is processed at the rate it is being processed, per partition
/// (not reported while nothing is processed).
pub const PARTITION_BACKLOG_ETA: &str = "catchup_partition_backlog_eta_seconds";
/// Offsets between what the live lane processed and the log end, per partition.
pub const PARTITION_LIVE_LAG: &str = "catchup_partition_live_lag_offsets";
/// Seconds since the newest record the live lane handed out was written, while it lags
/// (0 when caught up), per partition.
pub const PARTITION_LIVE_LAG_SECONDS: &str = "catchup_partition_live_lag_seconds";

/// Buckets (seconds) of the time-to-fresh histogram, for exporters that need them.
pub const TIME_TO_FIRST_FRESH_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Registers the description and unit of every metric with the installed recorder (once
/// per process is enough; again is harmless).
pub fn describe() {
    describe_counter!(
        RECORDS_FETCHED,
        Unit::Count,
        "Records fetched into the buffer, per lane"
    );
    describe_counter!(
        RECORDS_DELIVERED,
        Unit::Count,
        "Records handed to the application, per lane"
    );
    describe_counter!(
        RECORDS_SUPERSEDED,
        Unit::Count,
        "Records skipped in mode latest: a newer record of their key was buffered or delivered, per lane"
    );
    describe_gauge!(
        LAG_OFFSETS,
        Unit::Count,
        "Offsets buffered and not processed yet, per lane"
    );
    describe_gauge!(
        BUFFERED_BYTES,
        Unit::Bytes,
        "Payload bytes buffered and not processed yet, per lane"
    );
    describe_counter!(
        SPILLED_BYTES,
        Unit::Bytes,
        "Bytes the memory tier wrote to disk because they waited"
    );
    describe_histogram!(
        TIME_TO_FIRST_FRESH,
        Unit::Seconds,
        "From an assignment to the first fresh record delivered"
    );
    describe_counter!(
        MERGES,
        Unit::Count,
        "Splits merged back into the group's offsets"
    );
    describe_counter!(
        COMPACTIONS,
        Unit::Count,
        "Buffer compactions that gave disk back"
    );
    describe_counter!(
        BROKER_ERRORS,
        Unit::Count,
        "Broker connection failures the clients reported"
    );
    describe_counter!(
        TRUNCATED_OFFSETS,
        Unit::Count,
        "Offsets retention deleted before they were processed"
    );
    describe_counter!(
        STALE_STATE,
        Unit::Count,
        "Side entries or split tokens found stale and not trusted"
    );
    describe_counter!(
        PARTITIONS_DISCARDED,
        Unit::Count,
        "Partitions whose buffered records were discarded and fetched again"
    );
    describe_gauge!(
        PARTITION_BACKLOG,
        Unit::Count,
        "Offsets of the backlog not processed yet, per partition"
    );
    describe_gauge!(
        PARTITION_BACKLOG_ETA,
        Unit::Seconds,
        "Seconds until the backlog is processed at the current rate, per partition"
    );
    describe_gauge!(
        PARTITION_LIVE_LAG,
        Unit::Count,
        "Offsets between what the live lane processed and the log end, per partition"
    );
    describe_gauge!(
        PARTITION_LIVE_LAG_SECONDS,
        Unit::Seconds,
        "Seconds since the newest record the live lane handed out was written, per partition"
    );
}

/// Counts what an event tells that operators alert on: offsets lost to retention, stale
/// state, discarded partitions.
pub fn event(group: &str, event: &Event) {
    match event {
        Event::Truncated {
            topic, from, to, ..
        } => counter!(TRUNCATED_OFFSETS, "group" => group.to_owned(), "topic" => topic.clone())
            .increment(u64::try_from(to - from).unwrap_or(0)),
        Event::StaleState { topic, .. } => {
            counter!(STALE_STATE, "group" => group.to_owned(), "topic" => topic.clone())
                .increment(1)
        }
        Event::LocalDiscarded { topic, .. } => {
            counter!(PARTITIONS_DISCARDED, "group" => group.to_owned(), "topic" => topic.clone())
                .increment(1)
        }
        _ => {}
    }
}

pub fn records_fetched(group: &str, lane: &'static str, records: u64) {
    counter!(RECORDS_FETCHED, "group" => group.to_owned(), "lane" => lane).increment(records);
}

pub fn records_delivered(group: &str, lane: &'static str, records: u64) {
    counter!(RECORDS_DELIVERED, "group" => group.to_owned(), "lane" => lane).increment(records);
}

pub fn records_superseded(group: &str, lane: &'static str, records: u64) {
    counter!(RECORDS_SUPERSEDED, "group" => group.to_owned(), "lane" => lane).increment(records);
}

pub fn lag(group: &str, lane: &'static str, offsets: i64, bytes: u64) {
    gauge!(LAG_OFFSETS, "group" => group.to_owned(), "lane" => lane).set(offsets as f64);
    gauge!(BUFFERED_BYTES, "group" => group.to_owned(), "lane" => lane).set(bytes as f64);
}

/// Bytes the buffer spilled since the last report.
pub fn spilled(group: &str, bytes: u64) {
    counter!(SPILLED_BYTES, "group" => group.to_owned()).increment(bytes);
}

/// One partition's progress (see `plan::progress`); `None`: not known this time.
pub struct Progress {
    pub backlog: i64,
    pub backlog_eta_seconds: Option<f64>,
    pub live_lag: Option<i64>,
    pub live_lag_seconds: Option<f64>,
}

pub fn partition_progress(group: &str, (topic, partition): &(String, i32), progress: Progress) {
    let labels = [
        ("group", group.to_owned()),
        ("topic", topic.clone()),
        ("partition", partition.to_string()),
    ];
    gauge!(PARTITION_BACKLOG, &labels).set(progress.backlog as f64);
    // Unknown reads NaN, never an old estimate.
    gauge!(PARTITION_BACKLOG_ETA, &labels).set(progress.backlog_eta_seconds.unwrap_or(f64::NAN));
    if let Some(lag) = progress.live_lag {
        gauge!(PARTITION_LIVE_LAG, &labels).set(lag as f64);
    }
    if let Some(seconds) = progress.live_lag_seconds {
        gauge!(PARTITION_LIVE_LAG_SECONDS, &labels).set(seconds);
    }
}

/// A partition left this consumer: its gauges read 0 here, its ETA NaN (the member that has
/// it now reports it).
pub fn partition_gone(group: &str, (topic, partition): &(String, i32)) {
    let labels = [
        ("group", group.to_owned()),
        ("topic", topic.clone()),
        ("partition", partition.to_string()),
    ];
    for name in [
        PARTITION_BACKLOG,
        PARTITION_LIVE_LAG,
        PARTITION_LIVE_LAG_SECONDS,
    ] {
        gauge!(name, &labels).set(0.0);
    }
    gauge!(PARTITION_BACKLOG_ETA, &labels).set(f64::NAN);
}

pub fn time_to_first_fresh(group: &str, seconds: f64) {
    histogram!(TIME_TO_FIRST_FRESH, "group" => group.to_owned()).record(seconds);
}

pub fn merged(group: &str) {
    counter!(MERGES, "group" => group.to_owned()).increment(1);
}

pub fn compacted(group: &str) {
    counter!(COMPACTIONS, "group" => group.to_owned()).increment(1);
}

pub fn broker_error(group: &str) {
    counter!(BROKER_ERRORS, "group" => group.to_owned()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn events_operators_alert_on_are_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            event(
                "g",
                &Event::Truncated {
                    topic: "orders".into(),
                    partition: 0,
                    from: 100,
                    to: 250,
                },
            );
            event(
                "g",
                &Event::StaleState {
                    topic: "orders".into(),
                    partition: 1,
                    what: "a side entry of another split".into(),
                },
            );
            for partition in 0..2 {
                event(
                    "g",
                    &Event::LocalDiscarded {
                        topic: "orders".into(),
                        partition,
                        reason: "damaged".into(),
                    },
                );
            }
            event("g", &Event::BrokersReachable);
        });
        let counters: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(count) => Some((key.key().name().to_owned(), count)),
                _ => None,
            })
            .collect();
        for (name, expected) in [
            (TRUNCATED_OFFSETS, 150),
            (STALE_STATE, 1),
            (PARTITIONS_DISCARDED, 2),
        ] {
            assert!(
                counters.contains(&(name.to_owned(), expected)),
                "{name} should be {expected}: {counters:?}"
            );
        }
        assert_eq!(counters.len(), 3, "nothing else is counted: {counters:?}");
    }
}
