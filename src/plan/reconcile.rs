//! Reconciliation on assignment (DESIGN §5): from what Kafka and the local buffer say about a
//! partition, decide where each lane starts, what to write to the main and side logs, and
//! which local records stay. Pure: the caller gathers the inputs and applies the decision.

use super::{SealedSideEntry, SideEntry, SplitSecret, SplitToken};
use crate::store::{OffsetRange, PartitionLayout, PartitionState};

/// Where to start when the group has no committed offset (`auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetReset {
    /// The low watermark.
    Earliest,
    /// The high watermark.
    Latest,
}

/// The group's committed offset and its metadata string (`Debug` redacts the secret).
#[derive(Clone, PartialEq, Eq)]
pub struct Committed {
    /// `G`: the first offset not yet processed.
    pub offset: i64,
    /// The metadata committed with it (the split token while split).
    pub metadata: String,
}

impl std::fmt::Debug for Committed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committed")
            .field("offset", &self.offset)
            .field("metadata", &SplitToken::redacted(&self.metadata))
            .finish()
    }
}

/// The side topic's latest value for a partition, as read: not yet decoded nor trusted.
#[derive(Debug, Clone, Copy)]
pub struct SideValue<'a> {
    /// Its key, `group/topic/partition` (the MAC covers it).
    pub key: &'a str,
    /// Its value.
    pub value: &'a [u8],
}

/// Everything reconciliation looks at for one partition.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The main log's commit, `None` when the group never committed this partition.
    pub committed: Option<&'a Committed>,
    /// The side topic's value for the partition, `None` when there is none.
    pub side: Option<SideValue<'a>>,
    /// Low watermark.
    pub low: i64,
    /// High watermark (the last stable offset under `read_committed`).
    pub high: i64,
    /// Split when the backlog is at least this; `None` never splits (mode `Off`).
    pub min_lag: Option<u64>,
    /// `auto.offset.reset` of the group member.
    pub reset: OffsetReset,
    /// The local buffer's state of the partition, if any.
    pub local: Option<&'a PartitionState>,
    /// The secret of a split started now (drawn at random by the caller).
    pub fresh_secret: SplitSecret,
}

/// A write to the main log (a commit by the group member). Its `Debug` form redacts the
/// split secret: decisions are logged.
#[derive(Clone, PartialEq, Eq)]
pub struct MainLogCommit {
    /// The offset to commit.
    pub offset: i64,
    /// The metadata: a split token, or empty.
    pub metadata: String,
}

impl std::fmt::Debug for MainLogCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MainLogCommit")
            .field("offset", &self.offset)
            .field("metadata", &SplitToken::redacted(&self.metadata))
            .finish()
    }
}

/// What to do with the side entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SideWrite {
    /// Leave it as it is.
    Keep,
    /// Write this entry.
    Write(SideEntry),
    /// Delete it (stale, or merged).
    Tombstone,
}

/// What to do with the local buffer's records of the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalAction {
    /// Keep them; move the committed cursors up to what Kafka holds.
    Reuse {
        /// New `committed_next` of the catch-up lane.
        catchup_committed: i64,
        /// New `committed_next` of the live lane.
        live_committed: i64,
    },
    /// Drop them and lay the partition out as decided.
    Reset {
        /// Why the local records cannot be used (`None`: there were none).
        reason: Option<String>,
    },
}

impl LocalAction {
    /// The offsets a reuse serves from disk instead of refetching, as `[from, to)`: from
    /// Kafka's position in the lane delivery resumes in (the catch-up lane while `layout`
    /// has catch-up offsets left) to where the buffer's `local` state has fetched that lane.
    /// `None` for a reset, or when nothing buffered lies ahead.
    pub fn reused_range(
        &self,
        layout: &PartitionLayout,
        local: Option<&PartitionState>,
    ) -> Option<(i64, i64)> {
        let (
            LocalAction::Reuse {
                catchup_committed,
                live_committed,
            },
            Some(local),
        ) = (self, local)
        else {
            return None;
        };
        let in_catchup = layout
            .catchup_end()
            .is_some_and(|end| *catchup_committed < end);
        let (from, to) = if in_catchup {
            (*catchup_committed, local.catchup.fetched_next)
        } else {
            (*live_committed, local.live.fetched_next)
        };
        (to > from).then_some((from, to))
    }
}

/// Something worth telling the application about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanEvent {
    /// Retention removed `[from, to)` before it was processed.
    Truncated {
        /// The committed offset that no longer exists.
        from: i64,
        /// The low watermark processing continues from.
        to: i64,
    },
    /// A new split: catch-up `[from, boundary)`, live from `boundary`.
    SplitStarted {
        /// New epoch.
        epoch: u64,
        /// Start of the catch-up lane.
        from: i64,
        /// The boundary.
        boundary: i64,
    },
    /// An unfinished split resumes.
    SplitResumed {
        /// Its epoch.
        epoch: u64,
    },
    /// The side entry could not be trusted: it does not decode, there is no split token,
    /// it belongs to another split, its MAC does not verify (forged, or copied from another
    /// group or partition), or it claims progress the main log contradicts.
    StaleSideEntry {
        /// Why, for the operator.
        reason: String,
    },
    /// The main log held a token without a trusted side entry, or a token of another format
    /// version.
    StaleToken {
        /// Which token.
        what: String,
    },
    /// A merge interrupted by a crash is finished now.
    MergeFinished {
        /// The offset the main log moves to.
        offset: i64,
    },
}

/// The outcome of reconciliation for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The lanes when laid out afresh.
    pub layout: PartitionLayout,
    /// The token in effect afterwards (`None`: not split).
    pub token: Option<SplitToken>,
    /// The side entry in effect afterwards.
    pub side_entry: Option<SideEntry>,
    /// A commit to write to the main log first, if any.
    pub main_log: Option<MainLogCommit>,
    /// What to do with the side entry.
    pub side: SideWrite,
    /// What to do with the local records.
    pub local: LocalAction,
    /// Events to report.
    pub events: Vec<PlanEvent>,
}

/// Clips `ranges` to `[from, ∞)`: ranges wholly below go, a range containing `from` starts
/// there.
pub fn clip_ranges(ranges: &[OffsetRange], from: i64) -> Vec<OffsetRange> {
    ranges
        .iter()
        .filter(|range| range.end > from)
        .map(|range| OffsetRange::new(range.start.max(from), range.end))
        .collect()
}

/// Decides one partition (see the module docs and DESIGN §5).
pub fn reconcile(inputs: &Inputs<'_>) -> Decision {
    let mut decision = reconcile_offsets(inputs);
    // Without a commit in Kafka nothing ties the local records to this incarnation of the
    // topic: a topic deleted and recreated numbers its offsets from 0 again, with other data,
    // and Kafka drops the group's offsets with it. Never reuse them then;
    // refetching costs only time.
    if inputs.committed.is_none() && matches!(decision.local, LocalAction::Reuse { .. }) {
        decision.local = LocalAction::Reset {
            reason: Some(
                "the group has no committed offset, so nothing proves the buffered records belong to this incarnation of the topic (recreated, or offsets expired)".into(),
            ),
        };
    }
    decision
}

fn reconcile_offsets(inputs: &Inputs<'_>) -> Decision {
    let mut events = Vec::new();
    let reset_to = match inputs.reset {
        OffsetReset::Earliest => inputs.low,
        OffsetReset::Latest => inputs.high,
    };
    let (mut committed, metadata) = match inputs.committed {
        Some(c) => (c.offset, c.metadata.as_str()),
        None => (reset_to, ""),
    };
    if committed < inputs.low {
        events.push(PlanEvent::Truncated {
            from: committed,
            to: inputs.low,
        });
        committed = inputs.low;
    } else if committed > inputs.high {
        // The log is shorter than the commit (recreated or truncated topic): Kafka's own
        // out-of-range rule applies.
        committed = reset_to;
    }
    let token = SplitToken::decode(metadata);
    // Epochs only name splits (trust is the secret); counting past a stale entry's epoch
    // keeps the names increasing for operators. An unverified entry may carry any number:
    // one that large is ignored, so that a forgery cannot pin the epochs at u64::MAX.
    let side_epoch = inputs
        .side
        .and_then(|side| SealedSideEntry::decode(side.value).ok())
        .map(|sealed| sealed.unverified().epoch)
        .filter(|&epoch| epoch < 1 << 32);
    let epochs = [
        token.map(|t| t.epoch),
        side_epoch,
        inputs.local.map(|l| l.layout.epoch),
    ];
    let next_epoch = epochs
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    // What the main log says is processed: retention may have removed the head since (the
    // entry was then written from the low watermark on).
    let main_processed = inputs
        .committed
        .map_or(committed, |c| c.offset.max(inputs.low));
    let side = inputs
        .side
        .map(|side| trusted_side_entry(side, token.as_ref(), main_processed));

    if let (Some(token), Some(Ok(side))) = (token, &side) {
        let ranges = clip_ranges(&side.ranges, committed);
        if committed < token.boundary && !ranges.is_empty() {
            return resume(inputs, committed, token, side, ranges, next_epoch, events);
        }
        // Catch-up done, merge unfinished: finish it.
        let offset = committed.max(side.live_next);
        events.push(PlanEvent::MergeFinished { offset });
        let layout = PartitionLayout::plain(offset);
        let local = local_action(inputs.local, &layout, offset, offset);
        return Decision {
            layout,
            token: None,
            side_entry: None,
            main_log: Some(MainLogCommit {
                offset,
                metadata: String::new(),
            }),
            side: SideWrite::Tombstone,
            local,
            events,
        };
    }
    if let Some(token) = token {
        events.push(PlanEvent::StaleToken {
            what: format!("split token of epoch {}", token.epoch),
        });
    } else if SplitToken::is_any_version(metadata) {
        events.push(PlanEvent::StaleToken {
            what: format!(
                "split token of another format version: {:.60}",
                SplitToken::redacted(metadata)
            ),
        });
    }
    if let Some(Err(reason)) = &side {
        events.push(PlanEvent::StaleSideEntry {
            reason: reason.clone(),
        });
    }
    let side = if side.is_some() {
        SideWrite::Tombstone
    } else {
        SideWrite::Keep
    };
    // A commit the log no longer reaches is replaced in the main log too, or the group would
    // keep the stale offset until the live lane passed it.
    let rewrite_main = SplitToken::is_any_version(metadata)
        || inputs.committed.is_some_and(|c| c.offset > inputs.high);
    fresh(inputs, committed, rewrite_main, side, next_epoch, events)
}

/// No usable split: a new one when the backlog is large enough, else plain from `committed`.
fn fresh(
    inputs: &Inputs<'_>,
    committed: i64,
    rewrite_main: bool,
    side: SideWrite,
    next_epoch: u64,
    events: Vec<PlanEvent>,
) -> Decision {
    let backlog = inputs.high.saturating_sub(committed);
    if inputs
        .min_lag
        .is_some_and(|min_lag| backlog > 0 && backlog as u64 >= min_lag)
    {
        let ranges = vec![OffsetRange::new(committed, inputs.high)];
        return new_split(inputs, committed, committed, ranges, next_epoch, events);
    }
    let layout = PartitionLayout::plain(committed);
    let main_log = rewrite_main.then(|| MainLogCommit {
        offset: committed,
        metadata: String::new(),
    });
    Decision {
        local: local_action(inputs.local, &layout, committed, committed),
        layout,
        token: None,
        side_entry: None,
        main_log,
        side,
        events,
    }
}

/// A trusted split resumes at `committed` for the catch-up lane and the side entry's
/// `live_next` for the live lane — re-split when the live lane is itself far behind.
fn resume(
    inputs: &Inputs<'_>,
    committed: i64,
    token: SplitToken,
    side: &SideEntry,
    mut ranges: Vec<OffsetRange>,
    next_epoch: u64,
    mut events: Vec<PlanEvent>,
) -> Decision {
    // Retention may have raised the commit past a whole range, into the gap before the next:
    // the offsets of a gap were processed, so the commit moves to the first range left — or
    // a new split would commit below its own side entry's first range, which the next
    // assignment rejects as implausible (found by the simulation, seed 0x13c0).
    let committed = ranges
        .first()
        .map_or(committed, |first| committed.max(first.start));
    let live_backlog = inputs.high.saturating_sub(side.live_next);
    let resplit = inputs
        .min_lag
        .is_some_and(|min_lag| live_backlog > 0 && live_backlog as u64 >= min_lag);
    if !resplit {
        events.push(PlanEvent::SplitResumed { epoch: token.epoch });
        let layout = PartitionLayout {
            epoch: token.epoch,
            catchup_ranges: ranges,
            live_from: side.live_next,
        };
        return Decision {
            local: local_action(inputs.local, &layout, committed, side.live_next),
            layout,
            token: Some(token),
            side_entry: Some(side.clone()),
            main_log: None,
            side: SideWrite::Keep,
            events,
        };
    }
    // The live lane's own backlog becomes one more catch-up range under a new epoch.
    ranges.push(OffsetRange::new(side.live_next, inputs.high));
    new_split(
        inputs,
        committed,
        side.live_next,
        ranges,
        next_epoch,
        events,
    )
}

/// A split under `epoch` with the boundary at the high watermark: catch-up `ranges` (from
/// the committed offset on), live from the boundary; the token and the side entry to write.
fn new_split(
    inputs: &Inputs<'_>,
    committed: i64,
    split_from: i64,
    ranges: Vec<OffsetRange>,
    epoch: u64,
    mut events: Vec<PlanEvent>,
) -> Decision {
    let boundary = inputs.high;
    let token = SplitToken {
        epoch,
        from: committed,
        boundary,
        secret: inputs.fresh_secret,
    };
    let entry = SideEntry {
        epoch,
        boundary,
        ranges: ranges.clone(),
        live_next: boundary,
    };
    events.push(PlanEvent::SplitStarted {
        epoch,
        from: split_from,
        boundary,
    });
    let layout = PartitionLayout {
        epoch,
        catchup_ranges: ranges,
        live_from: boundary,
    };
    Decision {
        local: local_action(inputs.local, &layout, committed, boundary),
        layout,
        token: Some(token),
        side_entry: Some(entry.clone()),
        main_log: Some(MainLogCommit {
            offset: committed,
            metadata: token.encode(),
        }),
        side: SideWrite::Write(entry),
        events,
    }
}

/// The side entry's contents if it can be trusted for `token`, else why not. `committed` is
/// the main log's offset (raised to the low watermark if retention removed the head).
///
/// Trust needs the MAC under the token's secret: only a holder of the group's commit
/// metadata can write it. The other checks cost nothing and catch a buggy writer that has
/// the secret: a legitimate entry is written after the main-log commit it extends, so its
/// first range never starts past that commit; its ranges lie in `[token.from, boundary)`;
/// it always has a range left (the split ends by a merge, not by an empty entry).
pub fn trusted_side_entry(
    side: SideValue<'_>,
    token: Option<&SplitToken>,
    committed: i64,
) -> Result<SideEntry, String> {
    let key = side.key;
    let sealed = SealedSideEntry::decode(side.value)
        .map_err(|reason| format!("side entry {key} does not decode: {reason}"))?;
    let claimed = sealed.unverified();
    let Some(token) = token else {
        return Err(format!(
            "side entry {key} of epoch {} has no split token in the group's commit",
            claimed.epoch
        ));
    };
    if (claimed.epoch, claimed.boundary) != (token.epoch, token.boundary) {
        return Err(format!(
            "side entry {key} belongs to another split (epoch {}, boundary {}; the token has epoch {}, boundary {})",
            claimed.epoch, claimed.boundary, token.epoch, token.boundary
        ));
    }
    let Some(entry) = sealed.open(key, &token.secret) else {
        return Err(format!(
            "side entry {key}: its MAC does not verify under the split's secret (forged, or copied from another group or partition)"
        ));
    };
    let implausible = |why: String| Err(format!("side entry {key} is implausible: {why}"));
    let (Some(first), Some(last)) = (entry.ranges.first(), entry.ranges.last()) else {
        return implausible("it has no catch-up range left".into());
    };
    if first.start < token.from || last.end > token.boundary {
        return implausible(format!(
            "its ranges {:?} leave [{}, {})",
            entry.ranges, token.from, token.boundary
        ));
    }
    if first.start > committed {
        return implausible(format!(
            "its first range starts at {}, past the committed offset {committed}",
            first.start
        ));
    }
    Ok(entry.clone())
}

/// Local records are reused only when they belong to the same split and cover, without a
/// gap, everything from Kafka's committed positions on.
pub fn local_action(
    local: Option<&PartitionState>,
    layout: &PartitionLayout,
    catchup_committed: i64,
    live_committed: i64,
) -> LocalAction {
    let Some(local) = local else {
        return LocalAction::Reset { reason: None };
    };
    let reset = |reason: String| LocalAction::Reset {
        reason: Some(reason),
    };
    if local.layout.epoch != layout.epoch {
        return reset(format!(
            "local epoch {} is not Kafka's epoch {}",
            local.layout.epoch, layout.epoch
        ));
    }
    let local_catchup = clip_ranges(&local.layout.catchup_ranges, catchup_committed);
    let wanted_catchup = clip_ranges(&layout.catchup_ranges, catchup_committed);
    if local_catchup != wanted_catchup || local.layout.live_from > layout.live_from {
        return reset(format!(
            "local layout {:?} does not match {:?}",
            local.layout, layout
        ));
    }
    let catchup_committed = local.normalize(crate::store::Lane::Catchup, catchup_committed);
    let catchup_end = local
        .layout
        .catchup_end()
        .unwrap_or(local.catchup.fetched_next);
    // The buffer never reads below its own committed cursor, so Kafka's position must be at
    // or past it (it is, unless someone moved the group back). Past what the lane fetched is
    // fine: Kafka says everything the lane holds is processed (what memory held before a
    // crash is not on disk), and the lane resumes at Kafka's position with nothing buffered
    // (`Buffer::record_resumed`) — the other lane's records are still good.
    let catchup_ok =
        catchup_committed >= catchup_end || local.catchup.committed_next <= catchup_committed;
    let live_ok = local.live.committed_next <= live_committed;
    if !(catchup_ok && live_ok) {
        return reset(format!(
            "local positions {:?}/{:?} do not cover Kafka's {catchup_committed}/{live_committed}",
            local.catchup, local.live
        ));
    }
    LocalAction::Reuse {
        catchup_committed: catchup_committed.min(catchup_end),
        live_committed,
    }
}
