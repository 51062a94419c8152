//! Model test of the buffer: random operation sequences, including crashes, checked against
//! an in-memory model (see `model_harness.rs`), and a replay of the fuzz seed corpus.

mod model_harness;

use catchup::store::Lane;
use model_harness::{Harness, Op, PARTITIONS, ops_from_bytes};
use proptest::prelude::*;

fn lane() -> impl Strategy<Value = Lane> {
    prop_oneof![Just(Lane::Catchup), Just(Lane::Live)]
}

fn op() -> impl Strategy<Value = Op> {
    let partition = 0..PARTITIONS;
    prop_oneof![
        6 => (partition.clone(), lane(), 0..4u8, 0..700u16)
            .prop_map(|(partition, lane, back, count)| Op::Append { partition, lane, back, count }),
        2 => (partition.clone(), lane()).prop_map(|(partition, lane)| Op::Read { partition, lane }),
        3 => (partition.clone(), lane(), 0..=1000u16)
            .prop_map(|(partition, lane, permille)| Op::Commit { partition, lane, permille }),
        1 => partition.clone().prop_map(|partition| Op::Discard { partition }),
        2 => (partition, any::<bool>(), 0..1000u16)
            .prop_map(|(partition, split, from)| Op::Reset { partition, split, from }),
        1 => Just(Op::Sync),
        1 => Just(Op::Crash),
        1 => any::<u16>().prop_map(|seed| Op::TornCrash { seed }),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn buffer_matches_the_model_across_crashes(ops in prop::collection::vec(op(), 1..60)) {
        if let Err(problem) = Harness::run(&ops) {
            return Err(TestCaseError::fail(problem));
        }
    }
}

#[test]
fn a_crash_right_after_a_sync_keeps_everything() {
    let ops = [
        Op::Reset {
            partition: 0,
            split: true,
            from: 10,
        },
        Op::Append {
            partition: 0,
            lane: Lane::Catchup,
            back: 0,
            count: 300,
        },
        Op::Append {
            partition: 0,
            lane: Lane::Live,
            back: 0,
            count: 50,
        },
        Op::Commit {
            partition: 0,
            lane: Lane::Catchup,
            permille: 500,
        },
        Op::Sync,
        Op::Crash,
        Op::Read {
            partition: 0,
            lane: Lane::Catchup,
        },
    ];
    Harness::run(&ops).expect("model run");
}

/// A power loss tears what sled wrote since the last sync, page by page: whichever pages
/// persisted, the buffer recovers a state since that sync (the harness checks it; where sled
/// could not recover, the consumer would start empty, and here none such is expected). The
/// appends after the sync are large enough for sled to write its log, so the tears hit
/// written pages.
#[test]
fn a_torn_crash_recovers_a_state_since_the_sync() {
    let append = |partition, lane, count| Op::Append {
        partition,
        lane,
        back: 0,
        count,
    };
    let (mut torn, mut emptied) = (0, 0);
    for seed in 0..8 {
        let mut ops = vec![
            Op::Reset {
                partition: 0,
                split: true,
                from: 0,
            },
            Op::Reset {
                partition: 1,
                split: false,
                from: 0,
            },
            append(0, Lane::Catchup, 600),
            Op::Sync,
        ];
        for round in 0..AFTER_THE_SYNC {
            ops.push(append(round % 2, Lane::Live, 600));
            ops.push(Op::Commit {
                partition: round % 2,
                lane: Lane::Live,
                permille: 300,
            });
        }
        ops.push(Op::TornCrash { seed });
        let harness = Harness::run(&ops).unwrap_or_else(|problem| panic!("seed {seed}: {problem}"));
        torn += harness.torn;
        emptied += harness.emptied;
    }
    eprintln!("8 torn crashes took {torn} pages or files from the last sync");
    assert!(torn > 0, "no torn crash took a page written since the sync");
    // sled recovered each of these (none was emptied): its log stops at the first torn page.
    assert_eq!(emptied, 0, "torn images sled could not recover");
}

/// Appends (and commits) after the sync in the torn-crash test.
const AFTER_THE_SYNC: u8 = 40;

/// Replays the committed fuzz seeds (and anything the fuzzer found and was checked in).
#[test]
fn fuzz_corpus_replays_clean() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/buffer_model");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&corpus).expect("fuzz/corpus/buffer_model exists") {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        if let Err(problem) = Harness::run(&ops_from_bytes(&data)) {
            panic!("{}: {problem}", path.display());
        }
        replayed += 1;
    }
    assert!(
        replayed >= 8,
        "only {replayed} seeds in {}",
        corpus.display()
    );
}
