//! `verify()`: a full consistency check of a buffer that reports findings instead of failing.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::keys::{self, ParsedKey, PartitionKey};
use super::record::Chunk;
use super::{Buffer, BufferMeta, Lane, PartitionState, StoreError, codec};

/// One problem `verify` found: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The entry or partition concerned, e.g. `orders/3 live chunk @1200`.
    pub location: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.problem)
    }
}

/// The chunks of one lane seen so far, by first offset: (first, next).
type Chain = Vec<(i64, i64)>;

/// The most findings `verify` lists; a badly damaged buffer would otherwise print one per
/// record. The last finding then says how many more there were.
pub const MAX_FINDINGS: usize = 1000;

/// Collects findings up to [`MAX_FINDINGS`], counting the rest.
#[derive(Default)]
struct Findings {
    listed: Vec<Finding>,
    more: u64,
}

impl Findings {
    fn add(&mut self, location: String, problem: String) {
        if self.listed.len() < MAX_FINDINGS {
            self.listed.push(Finding { location, problem });
        } else {
            self.more = self.more.saturating_add(1);
        }
    }

    fn finish(mut self) -> Vec<Finding> {
        if self.more > 0 {
            self.listed.push(Finding {
                location: "buffer".into(),
                problem: format!("{} more finding(s) not listed", self.more),
            });
        }
        self.listed
    }
}

impl Buffer {
    /// Checks every entry: each value decodes and its checksum holds; keys are well formed;
    /// topic ids are unique and below the next id to allocate; every chunk belongs to a
    /// laid-out partition, covers offsets, holds strictly increasing offsets inside the
    /// offsets it covers, and lies inside its lane (the live lane from `live_from`, a
    /// catch-up chunk inside one range); the chunks of each lane cover
    /// `[retained_from, fetched_next)` without a hole or overlap; the cursors are ordered
    /// (`retained_from <= committed_next <= fetched_next`: nothing unprocessed deleted),
    /// non-negative and inside the layout.
    ///
    /// Streams the chunks: memory stays at two offsets per chunk. Meant for a quiescent
    /// buffer (the CLI reads a snapshot): on a buffer being written it may report spurious
    /// holes. Lists at most [`MAX_FINDINGS`] findings.
    ///
    /// Returns the findings (empty when the buffer is sound). An `Err` means the buffer could
    /// not be read at all.
    pub fn verify(&self) -> Result<Vec<Finding>, StoreError> {
        self.contain_panics("verifying", || self.verify_entries())
    }

    fn verify_entries(&self) -> Result<Vec<Finding>, StoreError> {
        let mut findings = Findings::default();
        let mut topics: HashMap<u32, String> = HashMap::new();
        let mut states: BTreeMap<PartitionKey, Option<PartitionState>> = BTreeMap::new();
        let mut chains: BTreeMap<(PartitionKey, Lane), Chain> = BTreeMap::new();
        let mut next_topic_id = None;

        // Chunks must be judged against their partition's state and topic, which sort after
        // them: a first pass reads only those small entries, by prefix; a second walks every
        // key once, judging each chunk as it goes and reporting keys this format never writes.
        let db = self.db()?;
        let non_chunks = keys::NON_CHUNK_KINDS
            .iter()
            .flat_map(|kind| db.scan_prefix([*kind]));
        for entry in non_chunks {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            match keys::parse(&key) {
                // Reported by the second pass, which sees every key.
                None => {}
                Some(ParsedKey::Meta) => match codec::decode::<BufferMeta>(&value) {
                    Ok(meta) => next_topic_id = Some(meta.next_topic_id),
                    Err(err) => findings.add("buffer metadata".into(), err.to_string()),
                },
                Some(ParsedKey::Topic(name)) => match codec::decode::<u32>(&value) {
                    Ok(id) => {
                        if let Some(other) = topics.insert(id, name.clone()) {
                            findings.add(
                                format!("topic {name}"),
                                format!("id {id} is also used by topic {other}"),
                            );
                        }
                    }
                    Err(err) => findings.add(format!("topic {name}"), err.to_string()),
                },
                Some(ParsedKey::Incarnation(name)) => {
                    if let Err(err) = codec::decode::<String>(&value) {
                        findings.add(format!("incarnation of topic {name}"), err.to_string());
                    }
                }
                Some(ParsedKey::State(part)) => match codec::decode::<PartitionState>(&value) {
                    Ok(state) => {
                        states.insert(part, Some(state));
                    }
                    Err(err) => {
                        findings.add(
                            format!("{} state", describe(&topics, part)),
                            err.to_string(),
                        );
                        states.insert(part, None);
                    }
                },
                Some(ParsedKey::Chunk(..)) => {}
            }
        }
        match next_topic_id {
            None => findings.add("buffer metadata".into(), "missing".into()),
            Some(next) => {
                for (id, name) in &topics {
                    if *id >= next {
                        findings.add(
                            format!("topic {name}"),
                            format!(
                                "id {id} is not below the next id to allocate ({next}): a new topic would share it"
                            ),
                        );
                    }
                }
            }
        }

        for entry in self.db()?.iter() {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            let (lane, part, first) = match keys::parse(&key) {
                Some(ParsedKey::Chunk(lane, part, first)) => (lane, part, first),
                Some(_) => continue,
                None => {
                    findings.add(
                        format!("key {key:?}"),
                        "not a key this format writes".into(),
                    );
                    continue;
                }
            };
            let location = format!("{} {lane} chunk @{first}", describe(&topics, part));
            let Ok(first) = i64::try_from(first) else {
                findings.add(location, "first offset out of range".into());
                continue;
            };
            let chunk = match codec::decode::<Chunk>(&value) {
                Ok(chunk) => chunk,
                Err(err) => {
                    findings.add(location, err.to_string());
                    continue;
                }
            };
            let Some(state) = states.get(&part) else {
                findings.add(location, "belongs to no laid-out partition".into());
                continue;
            };
            let next = i64::try_from(chunk.next).unwrap_or(i64::MAX);
            if next <= first {
                findings.add(location.clone(), format!("covers no offsets (next {next})"));
            }
            if let Some(state) = state {
                if let Some(problem) = outside_lane(state, lane, first, next) {
                    findings.add(location.clone(), problem);
                }
            }
            let mut previous = None;
            for record in &chunk.records {
                if record.offset < first || record.offset >= next {
                    findings.add(
                        location.clone(),
                        format!("record {} lies outside [{first}, {next})", record.offset),
                    );
                }
                if previous.is_some_and(|p| p >= record.offset) {
                    findings.add(
                        location.clone(),
                        format!("offset {} does not increase", record.offset),
                    );
                }
                previous = Some(record.offset);
            }
            chains.entry((part, lane)).or_default().push((first, next));
        }

        for (part, state) in &states {
            if !topics.contains_key(&part.topic_id) {
                findings.add(
                    describe(&topics, *part),
                    "state of a topic id with no name".into(),
                );
            }
            let Some(state) = state else { continue };
            let name = describe(&topics, *part);
            if let Err(problem) = state.layout.validate() {
                findings.add(format!("{name} layout"), problem);
            }
            for lane in Lane::ALL {
                let location = format!("{name} {lane} lane");
                for problem in cursor_problems(state, lane) {
                    findings.add(location.clone(), problem);
                }
                let chain = chains.remove(&(*part, lane)).unwrap_or_default();
                check_chain(state, lane, &chain, &mut |problem| {
                    findings.add(location.clone(), problem)
                });
            }
        }
        Ok(findings.finish())
    }
}

/// Why a chunk covering `[first, next)` does not belong in `lane` of `state`'s layout.
fn outside_lane(state: &PartitionState, lane: Lane, first: i64, next: i64) -> Option<String> {
    let layout = &state.layout;
    match lane {
        Lane::Live if first < layout.live_from => Some(format!(
            "starts below the live lane's first offset {}",
            layout.live_from
        )),
        Lane::Live => None,
        Lane::Catchup => match layout.catchup_ranges.iter().find(|r| r.contains(first)) {
            None => Some(format!(
                "starts outside the catch-up ranges {:?}",
                layout.catchup_ranges
            )),
            Some(range) if next > range.end => Some(format!(
                "reaches {next}, past the end of its catch-up range {range:?}"
            )),
            Some(_) => None,
        },
    }
}

/// What is wrong with `lane`'s cursors: their order (a `retained_from` past
/// `committed_next` means unprocessed records were deleted), their sign, and their place in
/// the layout.
fn cursor_problems(state: &PartitionState, lane: Lane) -> Vec<String> {
    let cursors = state.lane(lane);
    let mut problems = Vec::new();
    let cursor_values = [
        cursors.retained_from,
        cursors.committed_next,
        cursors.fetched_next,
    ];
    if cursor_values.iter().any(|c| *c < 0) {
        problems.push(format!("negative cursor: {cursors:?}"));
    }
    let retained = state.normalize(lane, cursors.retained_from);
    let committed = state.normalize(lane, cursors.committed_next);
    let fetched = state.normalize(lane, cursors.fetched_next);
    if retained > committed {
        problems.push(format!(
            "records deleted before they were processed: retained_from past committed_next ({cursors:?})"
        ));
    }
    if committed > fetched {
        problems.push(format!("committed_next past fetched_next ({cursors:?})"));
    }
    let layout = &state.layout;
    match lane {
        Lane::Live => {
            if cursors.retained_from < layout.live_from {
                problems.push(format!(
                    "cursors below the live lane's first offset {}: {cursors:?}",
                    layout.live_from
                ));
            }
        }
        Lane::Catchup => {
            if let (Some(first), Some(end)) = (layout.catchup_ranges.first(), layout.catchup_end())
            {
                if cursors.retained_from < first.start || cursors.fetched_next > end {
                    problems.push(format!(
                        "cursors outside the catch-up ranges {:?}: {cursors:?}",
                        layout.catchup_ranges
                    ));
                }
                // Stored positions are normalized (a range end becomes the next range's
                // start); a commit inside a gap is harmless (the gap was processed).
                for pair in layout.catchup_ranges.windows(2) {
                    let gap = pair[0].end + 1..pair[1].start;
                    if [cursors.retained_from, cursors.fetched_next]
                        .iter()
                        .any(|c| gap.contains(c))
                    {
                        problems.push(format!(
                            "a cursor between the catch-up ranges {:?} and {:?}: {cursors:?}",
                            pair[0], pair[1]
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// The chunks of a lane must start at `retained_from`, follow each other without a hole and
/// end at `fetched_next`.
fn check_chain(state: &PartitionState, lane: Lane, chain: &Chain, find: &mut dyn FnMut(String)) {
    let cursors = state.lane(lane);
    let mut expected = cursors.retained_from;
    for &(first, next) in chain {
        if first != expected {
            let what = if first > expected { "hole" } else { "overlap" };
            find(format!(
                "{what}: a chunk starts at {first}, expected {expected}"
            ));
        }
        expected = state.normalize(lane, next);
    }
    if expected != cursors.fetched_next {
        find(format!(
            "chunks end at {expected} but fetched_next is {}",
            cursors.fetched_next
        ));
    }
}

fn describe(topics: &HashMap<u32, String>, part: PartitionKey) -> String {
    match topics.get(&part.topic_id) {
        Some(name) => format!("{name}/{}", part.partition),
        None => format!("topic id {}/{}", part.topic_id, part.partition),
    }
}
