//! The true progress of a partition, from what Kafka holds: during a split the group's
//! committed offset carries only catch-up progress, so standard lag tools report the whole
//! backlog; the split token and the side entry say where the live lane really is.

use super::{SealedSideEntry, SplitToken};

/// The progress of one partition of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrueLag {
    /// The group's committed offset (`None`: the group never committed one).
    pub committed: Option<i64>,
    /// The log end (high watermark).
    pub log_end: i64,
    /// The split's epoch and boundary while the partition is split.
    pub split: Option<(u64, i64)>,
    /// Offsets of the backlog still to process (0 when not split).
    pub catchup_remaining: i64,
    /// The first live offset not processed: the committed offset when not split, the side
    /// entry's when split (the boundary when the entry cannot be trusted).
    pub live_next: Option<i64>,
    /// Offsets between `live_next` and the log end.
    pub live_lag: Option<i64>,
    /// What standard lag tools report: the log end minus the committed offset.
    pub reported_lag: Option<i64>,
    /// How the side entry was read, while split.
    pub side: SideStatus,
}

/// The side entry of a split partition, as found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SideStatus {
    /// Not split: no side entry is used.
    NotSplit,
    /// Found, and it verifies under the split's secret.
    Verified,
    /// None written yet (nothing live processed and committed since the split).
    Missing,
    /// Found but not trusted (another epoch, a forged or damaged entry): why.
    Untrusted(String),
}

/// The progress of the partition whose side key is `key`, from its committed offset and
/// commit metadata, its side-topic value and its log end.
pub fn true_lag(
    key: &str,
    committed: Option<i64>,
    metadata: &str,
    side_value: Option<&[u8]>,
    log_end: i64,
) -> TrueLag {
    let reported_lag = committed.map(|c| (log_end - c).max(0));
    let plain = |side| TrueLag {
        committed,
        log_end,
        split: None,
        catchup_remaining: 0,
        live_next: committed,
        live_lag: reported_lag,
        reported_lag,
        side,
    };
    let (Some(committed_at), Some(token)) = (committed, SplitToken::decode(metadata)) else {
        return plain(SideStatus::NotSplit);
    };
    let side = match side_value.map(SealedSideEntry::decode) {
        None => Err(SideStatus::Missing),
        Some(Err(reason)) => Err(SideStatus::Untrusted(reason)),
        Some(Ok(sealed)) => match sealed.open(key, &token.secret) {
            None => Err(SideStatus::Untrusted("its MAC does not verify".into())),
            Some(entry) if entry.epoch != token.epoch => Err(SideStatus::Untrusted(format!(
                "epoch {} is not the split's {}",
                entry.epoch, token.epoch
            ))),
            Some(entry) => Ok(entry.clone()),
        },
    };
    let (catchup_remaining, live_next, side) = match side {
        Ok(entry) => {
            let remaining = entry
                .ranges
                .iter()
                .map(|range| (range.end - range.start.max(committed_at)).max(0))
                .sum();
            (remaining, entry.live_next, SideStatus::Verified)
        }
        // Nothing live is known processed: the live lane stands at the boundary.
        Err(status) => (
            (token.boundary - committed_at).max(0),
            token.boundary,
            status,
        ),
    };
    TrueLag {
        committed,
        log_end,
        split: Some((token.epoch, token.boundary)),
        catchup_remaining,
        live_next: Some(live_next),
        live_lag: Some((log_end - live_next).max(0)),
        reported_lag,
        side,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{SideEntry, SplitSecret};
    use crate::store::OffsetRange;

    const KEY: &str = "g/t/0";

    fn token(secret: &SplitSecret) -> String {
        SplitToken {
            epoch: 3,
            from: 100,
            boundary: 1000,
            secret: *secret,
        }
        .encode()
    }

    fn entry(epoch: u64, ranges: Vec<OffsetRange>, live_next: i64) -> SideEntry {
        SideEntry {
            epoch,
            boundary: 1000,
            ranges,
            live_next,
        }
    }

    /// (committed, metadata, side value, log end) and the expected (catch-up remaining,
    /// live next, live lag, reported lag, side status).
    type Case = (
        Option<i64>,
        String,
        Option<Vec<u8>>,
        i64,
        (i64, Option<i64>, Option<i64>, Option<i64>, SideStatus),
    );

    #[test]
    fn table() {
        let secret = SplitSecret::from_hex(&"07".repeat(16)).expect("secret");
        let other = SplitSecret::from_hex(&"08".repeat(16)).expect("secret");
        let sealed = |e: SideEntry, s: &SplitSecret| e.seal(KEY, s).into_bytes();
        let verified = sealed(entry(3, vec![OffsetRange::new(400, 1000)], 1500), &secret);
        let two_ranges = sealed(
            entry(
                3,
                vec![OffsetRange::new(400, 600), OffsetRange::new(800, 1000)],
                1200,
            ),
            &secret,
        );
        let forged = sealed(entry(3, vec![OffsetRange::new(400, 1000)], 1900), &other);
        let old_epoch = sealed(entry(2, vec![OffsetRange::new(400, 1000)], 1500), &secret);
        let cases: Vec<Case> = vec![
            // Not split: the committed offset is the whole truth.
            (
                Some(700),
                String::new(),
                None,
                2000,
                (0, Some(700), Some(1300), Some(1300), SideStatus::NotSplit),
            ),
            (
                None,
                String::new(),
                None,
                2000,
                (0, None, None, None, SideStatus::NotSplit),
            ),
            // Split, live progress known: tools report 1,600; the live lane lags 500.
            (
                Some(400),
                token(&secret),
                Some(verified),
                2000,
                (600, Some(1500), Some(500), Some(1600), SideStatus::Verified),
            ),
            // The committed offset moved into the first range since the entry was written.
            (
                Some(500),
                token(&secret),
                Some(two_ranges),
                2000,
                (300, Some(1200), Some(800), Some(1500), SideStatus::Verified),
            ),
            // No entry yet: the live lane stands at the boundary.
            (
                Some(400),
                token(&secret),
                None,
                2000,
                (600, Some(1000), Some(1000), Some(1600), SideStatus::Missing),
            ),
            (
                Some(400),
                token(&secret),
                Some(forged),
                2000,
                (
                    600,
                    Some(1000),
                    Some(1000),
                    Some(1600),
                    SideStatus::Untrusted("its MAC does not verify".into()),
                ),
            ),
            (
                Some(400),
                token(&secret),
                Some(old_epoch),
                2000,
                (
                    600,
                    Some(1000),
                    Some(1000),
                    Some(1600),
                    SideStatus::Untrusted("epoch 2 is not the split's 3".into()),
                ),
            ),
            (
                Some(400),
                token(&secret),
                Some(b"garbage".to_vec()),
                2000,
                (
                    600,
                    Some(1000),
                    Some(1000),
                    Some(1600),
                    SideStatus::Untrusted("unknown format: garbage".into()),
                ),
            ),
        ];
        for (committed, metadata, side, log_end, expected) in cases {
            let lag = true_lag(KEY, committed, &metadata, side.as_deref(), log_end);
            assert_eq!(
                (
                    lag.catchup_remaining,
                    lag.live_next,
                    lag.live_lag,
                    lag.reported_lag,
                    lag.side.clone()
                ),
                expected,
                "{committed:?} {metadata:?}"
            );
            assert_eq!(
                lag.split.is_some(),
                !metadata.is_empty() && committed.is_some()
            );
        }
    }
}
