//! What to write to Kafka for a partition's processed offsets (DESIGN §2, invariants 3, 4).

use super::{MainLogCommit, SideEntry, SideWrite, SplitToken, clip_ranges};
use crate::store::PartitionLayout;

/// Where a partition's progress stands.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// The split token in effect, `None` when not split.
    pub token: Option<SplitToken>,
    /// The side entry in effect while split.
    pub side: Option<&'a SideEntry>,
    /// The partition's lanes.
    pub layout: &'a PartitionLayout,
    /// The offset the main log holds.
    pub main_committed: i64,
    /// Every catch-up offset below this is processed.
    pub catchup_processed: i64,
    /// Every live offset below this is processed.
    pub live_processed: i64,
}

/// The writes that record a partition's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitPlan {
    /// Nothing new.
    Nothing,
    /// Not split: commit the offset to the main log, empty metadata.
    Plain {
        /// The offset.
        offset: i64,
    },
    /// Split: catch-up progress to the main log (with the token), live progress to the side
    /// log — never the other way round (invariant 3).
    Split {
        /// Main-log commit, with the token as metadata.
        main: Option<i64>,
        /// Side entry to write.
        side: Option<SideEntry>,
    },
    /// The catch-up lane is fully processed: commit `offset` (the live progress) with empty
    /// metadata, then tombstone the side entry.
    Merge {
        /// The offset the main log moves to.
        offset: i64,
    },
}

/// Decides the commit for one partition.
pub fn plan_commit(progress: &Progress<'_>) -> CommitPlan {
    let Some(token) = progress.token else {
        return if progress.live_processed > progress.main_committed {
            CommitPlan::Plain {
                offset: progress.live_processed,
            }
        } else {
            CommitPlan::Nothing
        };
    };
    let catchup_end = progress.layout.catchup_end().unwrap_or(token.boundary);
    // The end of one range is the start of the next (the offsets between were processed by
    // an earlier live lane): commit the start, so the side entry's first range never starts
    // past the main log's offset (what reconciliation checks).
    let catchup_processed = progress
        .layout
        .normalize_catchup(progress.catchup_processed);
    if catchup_processed >= catchup_end {
        return CommitPlan::Merge {
            offset: progress.live_processed.max(catchup_end),
        };
    }
    let main = (catchup_processed > progress.main_committed).then_some(catchup_processed);
    let side = progress.side.and_then(|side| {
        let ranges = clip_ranges(&side.ranges, catchup_processed);
        let moved = progress.live_processed > side.live_next || ranges != side.ranges;
        moved.then(|| SideEntry {
            ranges,
            live_next: progress.live_processed.max(side.live_next),
            ..side.clone()
        })
    });
    if main.is_none() && side.is_none() {
        CommitPlan::Nothing
    } else {
        CommitPlan::Split { main, side }
    }
}

/// The writes of one partition's commit, in the order they reach Kafka: the main log, then
/// the side log — the side log only once the main-log write succeeded, so that a member the
/// group fenced off never claims live progress it could not commit (and a merge's tombstone
/// never precedes the merge). A cycle sends the main-log writes of all its partitions as one
/// request, then the side-log writes together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitWrites {
    /// The group's offset and its metadata.
    pub main: Option<MainLogCommit>,
    /// What becomes of the side entry.
    pub side: SideWrite,
}

impl CommitPlan {
    /// The writes that carry out this plan under the split `token` in effect (a split's
    /// writes need it: no token, nothing to write).
    pub fn writes(&self, token: Option<&SplitToken>) -> CommitWrites {
        let plain = |offset: i64| MainLogCommit {
            offset,
            metadata: String::new(),
        };
        match (self, token) {
            (CommitPlan::Plain { offset }, _) => CommitWrites {
                main: Some(plain(*offset)),
                side: SideWrite::Keep,
            },
            (CommitPlan::Split { main, side }, Some(token)) => CommitWrites {
                main: main.map(|offset| MainLogCommit {
                    offset,
                    metadata: token.encode(),
                }),
                side: side.clone().map_or(SideWrite::Keep, SideWrite::Write),
            },
            (CommitPlan::Merge { offset }, _) => CommitWrites {
                main: Some(plain(*offset)),
                side: SideWrite::Tombstone,
            },
            (CommitPlan::Nothing | CommitPlan::Split { .. }, _) => CommitWrites {
                main: None,
                side: SideWrite::Keep,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OffsetRange;

    fn split() -> (SplitToken, SideEntry, PartitionLayout) {
        let token = SplitToken {
            epoch: 2,
            from: 70,
            boundary: 120,
            secret: crate::plan::SplitSecret::from_bytes([1; 16]),
        };
        let side = SideEntry {
            epoch: 2,
            boundary: 120,
            ranges: vec![OffsetRange::new(70, 120)],
            live_next: 120,
        };
        (token, side, PartitionLayout::split(2, 70, 120))
    }

    #[test]
    fn commit_table() {
        let (token, side, layout) = split();
        let plain = PartitionLayout::plain(0);
        let progress = |token, side, layout, main, catchup, live| Progress {
            token,
            side,
            layout,
            main_committed: main,
            catchup_processed: catchup,
            live_processed: live,
        };
        let cases = [
            (progress(None, None, &plain, 5, 0, 5), CommitPlan::Nothing),
            (
                progress(None, None, &plain, 5, 0, 9),
                CommitPlan::Plain { offset: 9 },
            ),
            (
                progress(Some(token), Some(&side), &layout, 70, 70, 120),
                CommitPlan::Nothing,
            ),
            (
                progress(Some(token), Some(&side), &layout, 70, 90, 120),
                CommitPlan::Split {
                    main: Some(90),
                    side: Some(SideEntry {
                        ranges: vec![OffsetRange::new(90, 120)],
                        ..side.clone()
                    }),
                },
            ),
            (
                progress(Some(token), Some(&side), &layout, 70, 70, 130),
                CommitPlan::Split {
                    main: None,
                    side: Some(SideEntry {
                        live_next: 130,
                        ..side.clone()
                    }),
                },
            ),
            (
                progress(Some(token), Some(&side), &layout, 110, 120, 130),
                CommitPlan::Merge { offset: 130 },
            ),
            (
                progress(Some(token), Some(&side), &layout, 110, 120, 120),
                CommitPlan::Merge { offset: 120 },
            ),
        ];
        for (progress, expected) in cases {
            assert_eq!(plan_commit(&progress), expected, "{progress:?}");
        }
    }

    #[test]
    fn the_end_of_a_range_is_committed_as_the_start_of_the_next() {
        // A re-split: catch-up 70..120 and 150..200 (120..150 was the old live lane's).
        let (token, _, _) = split();
        let token = SplitToken {
            boundary: 200,
            ..token
        };
        let ranges = vec![OffsetRange::new(70, 120), OffsetRange::new(150, 200)];
        let side = SideEntry {
            epoch: 2,
            boundary: 200,
            ranges: ranges.clone(),
            live_next: 200,
        };
        let layout = PartitionLayout {
            epoch: 2,
            catchup_ranges: ranges,
            live_from: 200,
        };
        let plan = plan_commit(&Progress {
            token: Some(token),
            side: Some(&side),
            layout: &layout,
            main_committed: 70,
            catchup_processed: 120,
            live_processed: 200,
        });
        let expected = CommitPlan::Split {
            main: Some(150),
            side: Some(SideEntry {
                ranges: vec![OffsetRange::new(150, 200)],
                ..side.clone()
            }),
        };
        assert_eq!(plan, expected);
    }

    #[test]
    fn the_main_log_never_gets_live_progress_while_split() {
        let (token, side, layout) = split();
        for live in [120, 150, 10_000] {
            let plan = plan_commit(&Progress {
                token: Some(token),
                side: Some(&side),
                layout: &layout,
                main_committed: 70,
                catchup_processed: 80,
                live_processed: live,
            });
            assert!(
                matches!(plan, CommitPlan::Split { main: Some(80), .. }),
                "{plan:?}"
            );
        }
    }

    #[test]
    fn writes_of_each_plan() {
        let (token, side, _) = split();
        let main = |offset: i64, metadata: &str| {
            Some(MainLogCommit {
                offset,
                metadata: metadata.to_owned(),
            })
        };
        let cases = [
            (
                CommitPlan::Nothing,
                main(0, "").filter(|_| false),
                SideWrite::Keep,
            ),
            (
                CommitPlan::Plain { offset: 9 },
                main(9, ""),
                SideWrite::Keep,
            ),
            (
                CommitPlan::Split {
                    main: Some(80),
                    side: Some(side.clone()),
                },
                main(80, &token.encode()),
                SideWrite::Write(side.clone()),
            ),
            (
                CommitPlan::Split {
                    main: None,
                    side: Some(side.clone()),
                },
                None,
                SideWrite::Write(side.clone()),
            ),
            (
                CommitPlan::Merge { offset: 130 },
                main(130, ""),
                SideWrite::Tombstone,
            ),
        ];
        for (plan, main, side) in cases {
            assert_eq!(
                plan.writes(Some(&token)),
                CommitWrites { main, side },
                "{plan:?}"
            );
        }
        // A split plan without its token writes nothing.
        let untokened = CommitPlan::Split {
            main: Some(80),
            side: Some(side),
        };
        assert_eq!(
            untokened.writes(None),
            CommitWrites {
                main: None,
                side: SideWrite::Keep
            }
        );
    }
}
