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

impl Buffer {
    /// Checks every entry: each value decodes and its checksum holds; keys are well formed;
    /// every chunk belongs to a laid-out partition, holds strictly increasing offsets inside
    /// the offsets it covers and inside its lane; the chunks of each lane cover
    /// `[retained_from, fetched_next)` without a hole; the cursors are ordered.
    ///
    /// Returns the findings (empty when the buffer is sound). An `Err` means the buffer could
    /// not be read at all.
    pub fn verify(&self) -> Result<Vec<Finding>, StoreError> {
        self.contain_panics("verifying", || self.verify_entries())
    }

    fn verify_entries(&self) -> Result<Vec<Finding>, StoreError> {
        let mut findings = Vec::new();
        let mut find =
            |location: String, problem: String| findings.push(Finding { location, problem });
        let mut topics: HashMap<u32, String> = HashMap::new();
        let mut states: BTreeMap<PartitionKey, Option<PartitionState>> = BTreeMap::new();
        let mut chains: BTreeMap<(PartitionKey, Lane), Chain> = BTreeMap::new();
        let mut meta_seen = false;

        // Key order puts chunks ('C', 'L') before states ('S') and topics ('T'): collect, then
        // judge the chains once everything is known.
        let mut chunks: Vec<(Lane, PartitionKey, u64, Result<Chunk, codec::CodecError>)> =
            Vec::new();
        for entry in self.db.iter() {
            let (key, value) = entry.map_err(|err| self.sled_error(err))?;
            match keys::parse(&key) {
                None => find(
                    format!("key {key:?}"),
                    "not a key this format writes".into(),
                ),
                Some(ParsedKey::Meta) => {
                    meta_seen = true;
                    if let Err(err) = codec::decode::<BufferMeta>(&value) {
                        find("buffer metadata".into(), err.to_string());
                    }
                }
                Some(ParsedKey::Topic(name)) => match codec::decode::<u32>(&value) {
                    Ok(id) => {
                        if let Some(other) = topics.insert(id, name.clone()) {
                            find(
                                format!("topic {name}"),
                                format!("id {id} is also used by topic {other}"),
                            );
                        }
                    }
                    Err(err) => find(format!("topic {name}"), err.to_string()),
                },
                Some(ParsedKey::Incarnation(name)) => {
                    if let Err(err) = codec::decode::<String>(&value) {
                        find(format!("incarnation of topic {name}"), err.to_string());
                    }
                }
                Some(ParsedKey::State(part)) => match codec::decode::<PartitionState>(&value) {
                    Ok(state) => {
                        states.insert(part, Some(state));
                    }
                    Err(err) => {
                        find(
                            format!("{} state", describe(&topics, part)),
                            err.to_string(),
                        );
                        states.insert(part, None);
                    }
                },
                Some(ParsedKey::Chunk(lane, part, first)) => {
                    chunks.push((lane, part, first, codec::decode::<Chunk>(&value)));
                }
            }
        }
        if !meta_seen {
            find("buffer metadata".into(), "missing".into());
        }

        for (lane, part, first, chunk) in chunks {
            let first = first as i64;
            let location = format!("{} {lane} chunk @{first}", describe(&topics, part));
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(err) => {
                    find(location, err.to_string());
                    continue;
                }
            };
            let Some(state) = states.get(&part) else {
                find(location, "belongs to no laid-out partition".into());
                continue;
            };
            let next = chunk.next as i64;
            if next <= first {
                find(location.clone(), format!("covers no offsets (next {next})"));
            }
            let mut previous = None;
            for record in &chunk.records {
                if record.offset < first || record.offset >= next {
                    find(
                        location.clone(),
                        format!("record {} lies outside [{first}, {next})", record.offset),
                    );
                }
                if previous.is_some_and(|p| p >= record.offset) {
                    find(
                        location.clone(),
                        format!("offset {} does not increase", record.offset),
                    );
                }
                if let (Lane::Catchup, Some(state)) = (lane, state) {
                    if !state
                        .layout
                        .catchup_ranges
                        .iter()
                        .any(|r| r.contains(record.offset))
                    {
                        find(
                            location.clone(),
                            format!("record {} lies outside the catch-up ranges", record.offset),
                        );
                    }
                }
                previous = Some(record.offset);
            }
            chains.entry((part, lane)).or_default().push((first, next));
        }

        for (part, state) in &states {
            if !topics.contains_key(&part.topic_id) {
                find(
                    describe(&topics, *part),
                    "state of a topic id with no name".into(),
                );
            }
            let Some(state) = state else { continue };
            let name = describe(&topics, *part);
            if let Err(problem) = state.layout.validate() {
                find(format!("{name} layout"), problem);
            }
            for lane in Lane::ALL {
                let cursors = state.lane(lane);
                let location = format!("{name} {lane} lane");
                if !(cursors.retained_from <= cursors.committed_next.max(cursors.retained_from)
                    && cursors.committed_next <= cursors.fetched_next)
                {
                    find(
                        location.clone(),
                        format!("cursors out of order: {cursors:?}"),
                    );
                }
                let chain = chains.remove(&(*part, lane)).unwrap_or_default();
                check_chain(state, lane, &chain, &mut |problem| {
                    find(location.clone(), problem)
                });
            }
        }
        Ok(findings)
    }
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
