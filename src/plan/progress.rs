//! What a consumer reports about each of its partitions, from its own positions
//! (`docs/operations.md`, "Monitoring"): the backlog left, the live lane's lag to the log end
//! in offsets and in seconds, and when the backlog will be done at the rate it is being
//! processed. Standard lag tools see only the group's committed offset, which during a split
//! carries catch-up progress alone and so reports the whole backlog.

use std::time::{Duration, Instant};

use crate::store::PartitionLayout;

/// Offsets of the catch-up ranges not processed yet, the catch-up lane having processed
/// everything below `catchup_processed` (0 when not split).
pub fn backlog_left(layout: &PartitionLayout, catchup_processed: i64) -> i64 {
    layout
        .catchup_ranges
        .iter()
        .map(|range| (range.end - range.start.max(catchup_processed)).max(0))
        .sum()
}

/// Offsets between what the live lane processed (everything below `live_processed`) and the
/// log end.
pub fn live_lag(layout: &PartitionLayout, live_processed: i64, log_end: i64) -> i64 {
    (log_end - live_processed.max(layout.live_from)).max(0)
}

/// Seconds the application is behind on the live lane: how long ago the newest record handed
/// out was written (`newest_ms`, its timestamp), while records fetched for it wait to be
/// processed (`waiting`); 0 once it processed everything fetched — what is not fetched yet
/// shows in [`live_lag`] (and a trailing transaction marker, proven only by the next record,
/// must not look like minutes of lag on an idle topic). `None`: records wait, but none with a
/// timestamp was handed out yet.
pub fn live_lag_seconds(waiting: bool, newest_ms: Option<i64>, now_ms: i64) -> Option<f64> {
    if !waiting {
        return Some(0.0);
    }
    newest_ms.map(|written| (now_ms - written).max(0) as f64 / 1000.0)
}

/// The rate the catch-up lane processes its backlog at, smoothed over about
/// [`RATE_WINDOW`], and the time left at that rate.
#[derive(Debug, Clone, Default)]
pub struct BacklogRate {
    last: Option<(Instant, i64)>,
    /// Offsets per second.
    rate: Option<f64>,
}

/// How far back the rate looks (an exponential average with this time constant).
pub const RATE_WINDOW: Duration = Duration::from_secs(30);

impl BacklogRate {
    /// The catch-up lane has processed everything below `processed` at `now`.
    pub fn observe(&mut self, now: Instant, processed: i64) {
        if let Some((then, before)) = self.last {
            let elapsed = now.saturating_duration_since(then).as_secs_f64();
            if elapsed <= 0.0 {
                return;
            }
            let sample = (processed - before).max(0) as f64 / elapsed;
            let weight = 1.0 - (-elapsed / RATE_WINDOW.as_secs_f64()).exp();
            self.rate = Some(match self.rate {
                Some(rate) => rate + weight * (sample - rate),
                None => sample,
            });
        }
        self.last = Some((now, processed));
    }

    /// Seconds until `backlog` offsets are processed at the current rate: 0 when none are
    /// left, `None` while nothing is being processed (or no rate is known yet).
    pub fn eta(&self, backlog: i64) -> Option<f64> {
        if backlog <= 0 {
            return Some(0.0);
        }
        match self.rate {
            Some(rate) if rate > 0.0 => Some(backlog as f64 / rate),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OffsetRange;

    fn split(ranges: &[(i64, i64)], live_from: i64) -> PartitionLayout {
        PartitionLayout {
            epoch: 1,
            catchup_ranges: ranges
                .iter()
                .map(|&(start, end)| OffsetRange { start, end })
                .collect(),
            live_from,
        }
    }

    #[test]
    fn the_backlog_left_counts_what_the_ranges_still_hold() {
        let layout = split(&[(100, 200), (300, 400)], 400);
        for (processed, left) in [
            (0, 200),
            (100, 200),
            (150, 150),
            (250, 100),
            (350, 50),
            (400, 0),
        ] {
            assert_eq!(
                backlog_left(&layout, processed),
                left,
                "processed {processed}"
            );
        }
        assert_eq!(backlog_left(&PartitionLayout::plain(10), 10), 0);
    }

    #[test]
    fn the_live_lag_runs_from_the_boundary_or_what_was_processed_to_the_log_end() {
        let layout = split(&[(0, 100)], 100);
        assert_eq!(
            live_lag(&layout, 0, 150),
            50,
            "nothing live processed: from the boundary"
        );
        assert_eq!(live_lag(&layout, 120, 150), 30);
        assert_eq!(live_lag(&layout, 150, 150), 0);
        assert_eq!(
            live_lag(&layout, 150, 140),
            0,
            "a log end read before the last fetch"
        );
    }

    #[test]
    fn lag_in_seconds_comes_from_the_newest_record_handed_out() {
        assert_eq!(
            live_lag_seconds(false, Some(4_000), 10_000),
            Some(0.0),
            "nothing waits"
        );
        assert_eq!(live_lag_seconds(true, Some(4_000), 10_000), Some(6.0));
        assert_eq!(live_lag_seconds(true, None, 10_000), None);
        assert_eq!(
            live_lag_seconds(true, Some(11_000), 10_000),
            Some(0.0),
            "clock skew"
        );
    }

    #[test]
    fn the_eta_follows_the_rate_of_processing() {
        let start = Instant::now();
        let mut rate = BacklogRate::default();
        assert_eq!(rate.eta(1000), None, "no rate yet");
        assert_eq!(rate.eta(0), Some(0.0));
        // 100 offsets per second for a minute.
        for second in 0..=60 {
            rate.observe(start + Duration::from_secs(second), 100 * second as i64);
        }
        let eta = rate.eta(1000).expect("a rate");
        assert!((eta - 10.0).abs() < 0.01, "{eta}");
        // It stalls: the estimate grows, then none is given once nothing moves at all.
        for second in 61..=300 {
            rate.observe(start + Duration::from_secs(second), 6000);
        }
        assert!(
            rate.eta(1000).is_none_or(|eta| eta > 1000.0),
            "{:?}",
            rate.eta(1000)
        );
    }
}
