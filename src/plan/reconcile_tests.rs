//! Table tests of reconciliation: every row of DESIGN §5 and every crash point between two
//! writes.

use super::*;
use crate::store::{OffsetRange, PartitionLayout, PartitionState};

const MIN_LAG: Option<u64> = Some(10);

fn committed(offset: i64, metadata: &str) -> Committed {
    Committed {
        offset,
        metadata: metadata.to_owned(),
    }
}

/// The secret of every split in these tables, including new ones.
const SECRET: SplitSecret = SplitSecret::from_bytes([42; 16]);
/// The side-topic key of the partition in these tables.
const KEY: &str = "group/topic/0";

fn split_token(epoch: u64, from: i64, boundary: i64) -> SplitToken {
    SplitToken {
        epoch,
        from,
        boundary,
        secret: SECRET,
    }
}

fn token(epoch: u64, from: i64, boundary: i64) -> String {
    split_token(epoch, from, boundary).encode()
}

fn entry(epoch: u64, boundary: i64, ranges: &[(i64, i64)], live_next: i64) -> SideEntry {
    SideEntry {
        epoch,
        boundary,
        ranges: ranges
            .iter()
            .map(|&(s, e)| OffsetRange::new(s, e))
            .collect(),
        live_next,
    }
}

/// A side-topic value as this group writes it (sealed under `SECRET` and `KEY`).
fn side(epoch: u64, boundary: i64, ranges: &[(i64, i64)], live_next: i64) -> Vec<u8> {
    entry(epoch, boundary, ranges, live_next)
        .seal(KEY, &SECRET)
        .into_bytes()
}

fn raw(value: &[u8]) -> SideValue<'_> {
    SideValue { key: KEY, value }
}

fn inputs<'a>(
    committed: Option<&'a Committed>,
    side: Option<&'a Vec<u8>>,
    high: i64,
) -> Inputs<'a> {
    Inputs {
        committed,
        side: side.map(|value| raw(value)),
        low: 0,
        high,
        min_lag: MIN_LAG,
        reset: OffsetReset::Earliest,
        local: None,
        fresh_secret: SECRET,
    }
}

fn stale_side_entry(d: &Decision, reason: &str) -> bool {
    d.events
        .iter()
        .any(|e| matches!(e, PlanEvent::StaleSideEntry { reason: r } if r.contains(reason)))
}

#[test]
fn no_commit_uses_auto_offset_reset_then_splits_or_not() {
    let d = reconcile(&inputs(None, None, 50));
    assert_eq!(d.layout, PartitionLayout::split(1, 0, 50));
    assert_eq!(
        d.main_log,
        Some(MainLogCommit {
            offset: 0,
            metadata: token(1, 0, 50)
        })
    );
    assert_eq!(d.side, SideWrite::Write(entry(1, 50, &[(0, 50)], 50)));

    let d = reconcile(&Inputs {
        reset: OffsetReset::Latest,
        ..inputs(None, None, 50)
    });
    assert_eq!(
        (d.layout, d.main_log, d.side),
        (PartitionLayout::plain(50), None, SideWrite::Keep)
    );
}

#[test]
fn proposal_example_splits_at_the_log_end() {
    // Commit at 70, log end 120 on return: boundary 120, catch-up 70..120, live from 120.
    let c = committed(70, "");
    let d = reconcile(&inputs(Some(&c), None, 120));
    assert_eq!(d.layout, PartitionLayout::split(1, 70, 120));
    assert_eq!(d.token, Some(split_token(1, 70, 120)));
    assert_eq!(
        d.events,
        vec![PlanEvent::SplitStarted {
            epoch: 1,
            from: 70,
            boundary: 120
        }]
    );
    assert_eq!(d.local, LocalAction::Reset { reason: None });
}

#[test]
fn small_backlog_or_off_mode_does_not_split() {
    let c = committed(115, "");
    let d = reconcile(&inputs(Some(&c), None, 120));
    assert_eq!((d.layout, d.main_log), (PartitionLayout::plain(115), None));
    let c = committed(0, "");
    let off = Inputs {
        min_lag: None,
        ..inputs(Some(&c), None, 1000)
    };
    assert_eq!(reconcile(&off).layout, PartitionLayout::plain(0));
    let caught_up = committed(120, "");
    assert_eq!(
        reconcile(&inputs(Some(&caught_up), None, 120)).layout,
        PartitionLayout::plain(120)
    );
}

#[test]
fn trusted_split_resumes_with_clipped_ranges() {
    let c = committed(90, &token(4, 70, 120));
    let s = side(4, 120, &[(70, 120)], 125);
    let d = reconcile(&inputs(Some(&c), Some(&s), 128));
    assert_eq!(
        d.layout,
        PartitionLayout {
            epoch: 4,
            catchup_ranges: vec![OffsetRange::new(90, 120)],
            live_from: 125
        }
    );
    assert_eq!((d.main_log, d.side), (None, SideWrite::Keep));
    assert_eq!(d.events, vec![PlanEvent::SplitResumed { epoch: 4 }]);
}

#[test]
fn resumed_split_whose_live_lane_fell_behind_splits_again() {
    let c = committed(90, &token(4, 70, 120));
    let s = side(4, 120, &[(70, 120)], 125);
    let d = reconcile(&inputs(Some(&c), Some(&s), 400));
    let ranges = vec![OffsetRange::new(90, 120), OffsetRange::new(125, 400)];
    assert_eq!(
        d.layout,
        PartitionLayout {
            epoch: 5,
            catchup_ranges: ranges.clone(),
            live_from: 400
        }
    );
    assert_eq!(
        d.main_log,
        Some(MainLogCommit {
            offset: 90,
            metadata: token(5, 90, 400)
        })
    );
    assert_eq!(
        d.side,
        SideWrite::Write(SideEntry {
            epoch: 5,
            boundary: 400,
            ranges,
            live_next: 400
        })
    );
}

/// Retention raised the commit past a whole range, into the gap before the next one (the
/// simulation's seed 0x13c0): a re-split commits at the first range left, never below its
/// own side entry, which the next assignment must trust.
#[test]
fn a_resplit_after_retention_emptied_a_range_commits_at_the_next_range() {
    let c = committed(115, &token(3, 115, 319));
    let s = side(3, 319, &[(115, 147), (148, 197), (198, 319)], 319);
    let d = reconcile(&Inputs {
        low: 147,
        ..inputs(Some(&c), Some(&s), 346)
    });
    let main = d.main_log.clone().expect("a new split is committed");
    assert_eq!(main.offset, 148, "{d:?}");
    let SideWrite::Write(entry) = &d.side else {
        panic!("a side entry is written: {d:?}")
    };
    assert_eq!(entry.ranges.first().map(|r| r.start), Some(148));
    // The next assignment trusts what this one wrote.
    let next_commit = committed(main.offset, &main.metadata);
    let next_side = entry.seal(KEY, &SECRET).into_bytes();
    let next = reconcile(&Inputs {
        low: 147,
        ..inputs(Some(&next_commit), Some(&next_side), 346)
    });
    assert!(
        next.events.iter().all(|e| !matches!(
            e,
            PlanEvent::StaleSideEntry { .. } | PlanEvent::StaleToken { .. }
        )),
        "{next:?}"
    );
}

#[test]
fn catchup_done_but_merge_unfinished_is_merged() {
    let c = committed(120, &token(4, 70, 120));
    let s = side(4, 120, &[(70, 120)], 160);
    let d = reconcile(&inputs(Some(&c), Some(&s), 170));
    assert_eq!(d.layout, PartitionLayout::plain(160));
    assert_eq!(
        d.main_log,
        Some(MainLogCommit {
            offset: 160,
            metadata: String::new()
        })
    );
    assert_eq!(d.side, SideWrite::Tombstone);
    assert_eq!(d.events, vec![PlanEvent::MergeFinished { offset: 160 }]);
}

#[test]
fn token_without_matching_side_entry_is_stale() {
    // Crash point: the token was committed, the side entry not yet written.
    let c = committed(70, &token(4, 70, 120));
    let d = reconcile(&inputs(Some(&c), None, 125));
    assert_eq!(
        d.layout,
        PartitionLayout::split(5, 70, 125),
        "reprocess from G under a new epoch"
    );
    assert!(
        matches!(&d.events[0], PlanEvent::StaleToken { what } if what.contains("epoch 4")),
        "{:?}",
        d.events
    );
    // Same with a side entry of another epoch, which is deleted too.
    let s = side(3, 100, &[(50, 100)], 110);
    let d = reconcile(&inputs(Some(&c), Some(&s), 125));
    assert_eq!(d.side, SideWrite::Write(entry(5, 125, &[(70, 125)], 125)));
    assert!(stale_side_entry(&d, "another split"), "{:?}", d.events);
    // Small backlog: plain, and the stale token is cleared from the main log.
    let d = reconcile(&inputs(Some(&c), None, 72));
    assert_eq!(d.layout, PartitionLayout::plain(70));
    assert_eq!(
        d.main_log,
        Some(MainLogCommit {
            offset: 70,
            metadata: String::new()
        })
    );
}

#[test]
fn side_entry_without_token_is_stale() {
    // Crash point: side entry written before the token; or the merge committed and crashed
    // before the tombstone; or an operator reset the offsets (which clears metadata).
    let s = side(4, 120, &[(70, 120)], 130);
    for (name, c) in [
        ("side first", committed(70, "")),
        ("merge", committed(130, "")),
        ("reset", committed(20, "")),
    ] {
        let d = reconcile(&inputs(Some(&c), Some(&s), 135));
        assert!(stale_side_entry(&d, "no split token"), "{name}");
        assert!(d.side != SideWrite::Keep, "{name}: the stale entry must go");
        let start = d
            .layout
            .catchup_ranges
            .first()
            .map_or(d.layout.live_from, |r| r.start);
        assert_eq!(
            start, c.offset,
            "{name}: processing restarts at the main log's offset"
        );
        // Epochs are names; trust is the secret. Whatever a new split is numbered, the
        // stale entry does not verify under its token.
        let fresh = reconcile(&Inputs {
            fresh_secret: SplitSecret::from_bytes([43; 16]),
            ..inputs(Some(&c), Some(&s), 135)
        });
        if let Some(token) = fresh.token {
            assert!(
                trusted_side_entry(raw(&s), Some(&token), c.offset).is_err(),
                "{name}"
            );
        }
    }
}

#[test]
fn retention_truncation_is_reported_and_skipped() {
    let c = committed(20, "");
    let d = reconcile(&Inputs {
        low: 50,
        ..inputs(Some(&c), None, 55)
    });
    assert_eq!(d.events, vec![PlanEvent::Truncated { from: 20, to: 50 }]);
    assert_eq!(d.layout, PartitionLayout::plain(50));
}

#[test]
fn commit_beyond_the_log_end_follows_auto_offset_reset() {
    let c = committed(900, "");
    let d = reconcile(&inputs(Some(&c), None, 5));
    assert_eq!(d.layout, PartitionLayout::plain(0));
    // F10: the main log is rewritten to the new start, not left at the stale 900.
    assert_eq!(
        d.main_log,
        Some(MainLogCommit {
            offset: 0,
            metadata: String::new()
        })
    );
}

#[test]
fn local_records_are_reused_only_when_they_fit() {
    let mut local = PartitionState::new(PartitionLayout::split(4, 70, 120));
    local.catchup.fetched_next = 110;
    local.catchup.committed_next = 80;
    local.live.fetched_next = 140;
    let c = committed(90, &token(4, 70, 120));
    let s = side(4, 120, &[(70, 120)], 125);
    let with_local = Inputs {
        local: Some(&local),
        ..inputs(Some(&c), Some(&s), 130)
    };
    let d = reconcile(&with_local);
    assert_eq!(
        d.local,
        LocalAction::Reuse {
            catchup_committed: 90,
            live_committed: 125
        }
    );

    // Kafka's live position beyond what was fetched locally (what memory held before a
    // crash): the live lane resumes there with nothing local, the catch-up lane's records
    // are reused.
    let s_far = side(4, 120, &[(70, 120)], 145);
    let d = reconcile(&Inputs {
        side: Some(raw(&s_far)),
        ..with_local.clone()
    });
    assert_eq!(
        d.local,
        LocalAction::Reuse {
            catchup_committed: 90,
            live_committed: 145
        }
    );
    // Another epoch.
    let other = PartitionState::new(PartitionLayout::split(3, 70, 120));
    let d = reconcile(&Inputs {
        local: Some(&other),
        ..with_local.clone()
    });
    assert!(matches!(d.local, LocalAction::Reset { reason: Some(_) }));
    // The group moved back below what the buffer already counts as committed.
    let back = committed(75, &token(4, 70, 120));
    let d = reconcile(&Inputs {
        committed: Some(&back),
        ..with_local
    });
    assert!(matches!(d.local, LocalAction::Reset { reason: Some(_) }));
    // Plain partitions: reuse while Kafka's offset is inside the fetched live lane.
    let mut plain = PartitionState::new(PartitionLayout::plain(10));
    plain.live.fetched_next = 30;
    assert_eq!(
        local_action(Some(&plain), &PartitionLayout::plain(25), 25, 25),
        LocalAction::Reuse {
            catchup_committed: 10,
            live_committed: 25
        }
    );
    // Past what the lane fetched: nothing local to reuse, the lane resumes at Kafka's.
    assert_eq!(
        local_action(Some(&plain), &PartitionLayout::plain(31), 31, 31),
        LocalAction::Reuse {
            catchup_committed: 10,
            live_committed: 31
        }
    );
}

#[test]
fn local_records_are_not_reused_once_the_group_lost_its_offsets() {
    // F8: a plain partition committed at 1000 and fetched to 5000; the topic is deleted and
    // recreated (Kafka drops the group's offsets) and `latest` puts the new start at 3000,
    // inside the old local range. The old incarnation's records must not be delivered.
    let mut local = PartitionState::new(PartitionLayout::plain(0));
    local.live.fetched_next = 5000;
    local.live.committed_next = 1000;
    let recreated = Inputs {
        local: Some(&local),
        reset: OffsetReset::Latest,
        min_lag: None,
        ..inputs(None, None, 3000)
    };
    let d = reconcile(&recreated);
    assert_eq!(d.layout, PartitionLayout::plain(3000));
    assert!(
        matches!(&d.local, LocalAction::Reset { reason: Some(reason) } if reason.contains("incarnation")),
        "{:?}",
        d.local
    );
    // Not even a buffer that never recorded a commit: the records it fetched before a crash
    // may be the old incarnation's at the new start.
    let mut fresh = PartitionState::new(PartitionLayout::plain(3000));
    fresh.live.fetched_next = 3500;
    let d = reconcile(&Inputs {
        local: Some(&fresh),
        ..recreated
    });
    assert!(
        matches!(d.local, LocalAction::Reset { .. }),
        "{:?}",
        d.local
    );
    // With a commit, local records that fit are reused as before.
    let c = committed(3000, "");
    let d = reconcile(&Inputs {
        committed: Some(&c),
        local: Some(&fresh),
        ..recreated
    });
    assert!(
        matches!(d.local, LocalAction::Reuse { .. }),
        "{:?}",
        d.local
    );
}

#[test]
fn side_entries_are_trusted_only_with_the_groups_secret_and_when_plausible() {
    // Split at G = 0: catch-up 0..5000, live from 5000; the log has grown to 9000 since.
    let c = committed(0, &token(1, 0, 5000));
    let another_secret = SplitSecret::from_bytes([7; 16]);
    let sealed =
        |entry: SideEntry, key: &str, secret: &SplitSecret| entry.seal(key, secret).into_bytes();
    let skip_all = entry(1, 5000, &[(0, 5000)], 9000);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "the forgery of the issue, in the old format",
            b"catchup-side/1 e=1 b=5000 l=5000 r=4990-5000".to_vec(),
            "does not decode",
        ),
        (
            "right epoch and boundary, MAC under a guessed secret",
            sealed(skip_all.clone(), KEY, &another_secret),
            "MAC does not verify",
        ),
        (
            "another group's entry copied under this group's key",
            sealed(skip_all.clone(), "other-group/topic/0", &another_secret),
            "MAC does not verify",
        ),
        (
            "this split's entry of another partition",
            sealed(skip_all.clone(), "group/topic/1", &SECRET),
            "MAC does not verify",
        ),
        (
            "a genuine entry with its live_next edited",
            String::from_utf8_lossy(&side(1, 5000, &[(0, 5000)], 5000))
                .replace("l=5000", "l=9000")
                .into_bytes(),
            "MAC does not verify",
        ),
        (
            "a MAC that is not hex",
            b"catchup-side/2 e=1 b=5000 l=9000 r=0-5000 m=zz".to_vec(),
            "does not decode",
        ),
        (
            "an epoch nobody could use",
            sealed(entry(u64::MAX, 5000, &[(0, 5000)], 9000), KEY, &SECRET),
            "another split",
        ),
        (
            "genuine MAC, first range past the committed offset",
            side(1, 5000, &[(4990, 5000)], 5000),
            "past the committed offset 0",
        ),
        (
            "genuine MAC, no range left",
            side(1, 5000, &[], 9000),
            "no catch-up range",
        ),
        (
            "genuine MAC, a range past the boundary",
            sealed(entry(1, 6000, &[(0, 6000)], 9000), KEY, &SECRET),
            "another split",
        ),
    ];
    for (name, value, reason) in cases {
        let d = reconcile(&inputs(Some(&c), Some(&value), 9000));
        assert!(stale_side_entry(&d, reason), "{name}: {:?}", d.events);
        assert!(
            d.events
                .iter()
                .any(|e| matches!(e, PlanEvent::StaleSideEntry { reason } if reason.contains(KEY))),
            "{name}: the event names the key"
        );
        assert_eq!(
            d.layout.catchup_ranges.first().map(|r| r.start),
            Some(0),
            "{name}: everything from G is processed again"
        );
        assert!(d.side != SideWrite::Keep, "{name}: the entry is replaced");
        assert!(
            d.token.is_some_and(|t| t.secret == SECRET && t.from == 0),
            "{name}"
        );
    }
}

#[test]
fn plausibility_rules_reject_a_writer_with_the_secret_that_runs_ahead() {
    let token = split_token(2, 70, 200);
    let check = |ranges: &[(i64, i64)], live_next: i64, committed: i64| {
        trusted_side_entry(
            raw(&side(2, 200, ranges, live_next)),
            Some(&token),
            committed,
        )
    };
    // Legitimate: clipped at the commit, or not yet clipped (crash between the two writes),
    // a re-split's second range, the live lane far ahead.
    assert!(check(&[(90, 200)], 200, 90).is_ok());
    assert!(check(&[(70, 200)], 250, 90).is_ok());
    assert!(check(&[(70, 120), (150, 200)], 200, 70).is_ok());
    assert!(check(&[(150, 200)], 200, 150).is_ok());
    // Ahead of the main log, outside the split, or finished without a merge.
    let rejected = [
        (check(&[(91, 200)], 200, 90), "past the committed offset"),
        (check(&[(150, 200)], 200, 120), "past the committed offset"),
        (check(&[(60, 200)], 200, 90), "leave [70, 200)"),
        (check(&[], 200, 90), "no catch-up range"),
    ];
    for (result, reason) in rejected {
        assert!(
            matches!(&result, Err(r) if r.contains(reason)),
            "{reason}: {result:?}"
        );
    }
    // No token at all: nothing to verify against.
    let no_token = trusted_side_entry(raw(&side(2, 200, &[(90, 200)], 200)), None, 90);
    assert!(matches!(no_token, Err(r) if r.contains("no split token")));
}

#[test]
fn an_entry_written_after_retention_removed_the_head_is_trusted() {
    // Split at G = 70 (boundary 200); retention moved the low watermark to 100, and the
    // entry written since starts there while the main log still says 70.
    let c = committed(70, &token(2, 70, 200));
    let s = side(2, 200, &[(100, 200)], 230);
    let d = reconcile(&Inputs {
        low: 100,
        ..inputs(Some(&c), Some(&s), 235)
    });
    assert_eq!(
        d.events,
        vec![
            PlanEvent::Truncated { from: 70, to: 100 },
            PlanEvent::SplitResumed { epoch: 2 }
        ]
    );
    assert_eq!(d.layout.catchup_ranges, vec![OffsetRange::new(100, 200)]);
    assert_eq!(d.layout.live_from, 230);
}

#[test]
fn a_forged_huge_epoch_does_not_pin_new_splits() {
    let c = committed(0, "");
    let forged = entry(u64::MAX - 1, 50, &[(0, 50)], 50)
        .seal(KEY, &SplitSecret::from_bytes([1; 16]))
        .into_bytes();
    let d = reconcile(&inputs(Some(&c), Some(&forged), 50));
    assert_eq!(d.token.map(|t| t.epoch), Some(1), "{:?}", d.events);
}

#[test]
fn a_reuse_serves_from_the_groups_position_to_what_the_lane_fetched() {
    let mut local = PartitionState::new(PartitionLayout::split(3, 100, 500));
    local.catchup.fetched_next = 300;
    local.live.fetched_next = 650;
    let layout = local.layout.clone();
    let reuse = |catchup_committed, live_committed| LocalAction::Reuse {
        catchup_committed,
        live_committed,
    };
    // Catch-up offsets left: the catch-up lane's range.
    assert_eq!(
        reuse(150, 520).reused_range(&layout, Some(&local)),
        Some((150, 300))
    );
    // Catch-up done: the live lane's.
    assert_eq!(
        reuse(500, 520).reused_range(&layout, Some(&local)),
        Some((520, 650))
    );
    // Nothing buffered ahead, no local state, or a reset: nothing reused.
    assert_eq!(reuse(500, 650).reused_range(&layout, Some(&local)), None);
    assert_eq!(reuse(150, 520).reused_range(&layout, None), None);
    let reset = LocalAction::Reset { reason: None };
    assert_eq!(reset.reused_range(&layout, Some(&local)), None);
}
