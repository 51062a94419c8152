//! Each partition's progress as gauges (`plan::progress`): the backlog left and its ETA, the
//! live lane's lag in offsets and in seconds.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::*;
use crate::plan::{backlog_left, live_lag, live_lag_seconds};

impl Shared {
    /// Reports every partition's progress; `log_ends` holds the log ends known (a partition
    /// without one reports no live lag this time).
    pub fn report_progress(&self, log_ends: &BTreeMap<PartitionId, i64>) {
        let now = Instant::now();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64);
        let mut partitions = self.partitions();
        for (key, runtime) in partitions.iter_mut() {
            let catchup_processed = runtime.acks(0).committable();
            runtime.backlog_rate.observe(now, catchup_processed);
            let backlog = backlog_left(&runtime.layout, catchup_processed);
            let live = log_ends
                .get(key)
                .map(|&end| live_lag(&runtime.layout, runtime.acks(1).committable(), end));
            let live_processed = runtime.acks(1).committable();
            let waiting = runtime.live.cursor().stored_next() > live_processed;
            // Before the first live record is handed out (`Ordered` during a split), fresh
            // records have waited at most since the assignment.
            let seconds = live_lag_seconds(waiting, runtime.newest_live_ms, now_ms).or_else(|| {
                runtime
                    .awaiting_fresh_since
                    .map(|since| since.elapsed().as_secs_f64())
            });
            telemetry::partition_progress(
                &self.group,
                key,
                telemetry::Progress {
                    backlog,
                    backlog_eta_seconds: runtime.backlog_rate.eta(backlog),
                    live_lag: live,
                    live_lag_seconds: seconds,
                },
            );
        }
    }
}
