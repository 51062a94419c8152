//! The deterministic simulation of the consumer (see `sim/harness.rs`): thousands of seeds,
//! each a different history of faults; a failing seed is printed and replays exactly with
//! `CATCHUP_SIM_SEED=<seed> cargo test --test simulation`. `CATCHUP_SIM_SEEDS=N` runs seeds
//! 0..N (10,000 by default), `CATCHUP_SIM_SEEDS=A..B` seeds A..B.

#[path = "sim/harness.rs"]
mod harness;

#[test]
fn the_consumer_never_loses_a_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seeds: Vec<u64> = match std::env::var("CATCHUP_SIM_SEED") {
        Ok(seed) => vec![parse_seed(&seed)],
        Err(_) => match std::env::var("CATCHUP_SIM_SEEDS") {
            // `N` runs seeds 0..N; `A..B` runs seeds A..B (a long run beyond CI's seeds).
            Ok(spec) => match spec.split_once("..") {
                Some((first, end)) => (parse_seed(first)..parse_seed(end)).collect(),
                None => (0..parse_seed(&spec)).collect(),
            },
            Err(_) => (0..10_000).collect(),
        },
    };
    // The seeds run on a thread of their own, watched: sled 0.34 has been seen to deadlock
    // inside its log writer after tens of thousands of seeds' churn in one database (all its
    // threads parked in `IoBufs::write_to_log`, the writer in `SegmentAccountant::next`). A
    // wedged buffer must fail with that said, not hang the suite. A fresh database every
    // `SEEDS_PER_BUFFER` seeds keeps each one small.
    let (progress, seeds_done) = std::sync::mpsc::channel::<u64>();
    let count = seeds.len();
    let runner = std::thread::spawn(move || {
        let mut buffer = None;
        let mut stats = harness::Stats::default();
        for (index, &seed) in seeds.iter().enumerate() {
            if index % SEEDS_PER_BUFFER == 0 {
                buffer = None;
            }
            let buffer_dir = dir
                .path()
                .join(format!("buffer-{}", index / SEEDS_PER_BUFFER));
            let (result, returned) = harness::run_seed(seed, buffer_dir, buffer);
            buffer = returned;
            match result {
                Ok(ran) => stats += ran,
                Err(failure) => panic!(
                    "seed {seed:#x} failed: {failure}\nreplay: CATCHUP_SIM_SEED={seed:#x} cargo test --test simulation"
                ),
            }
            let _ = progress.send(seed);
        }
        stats
    });
    let mut last = None;
    loop {
        match seeds_done.recv_timeout(SEED_WATCHDOG) {
            Ok(seed) => last = Some(seed),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                "no seed finished within {SEED_WATCHDOG:?} after seed {last:?}: the buffer's database is wedged (sled deadlock), not a loss"
            ),
        }
    }
    let stats = match runner.join() {
        Ok(stats) => stats,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    eprintln!(
        "{count} seeds over {} partitions, {} steps, {} splits ({} layouts with several ranges), \
         {} merges, {} truncations, {} positions held past the log end, {} errors naming no \
         partition, {} transient errors taken in a run, {} histories whose group member takes runs ({} errors in them), {} entries taken after an error in its run ({} of them in a long tail), {} assignments of everything (eager), {} main-log writes refused, {} \
         partitions whose assignment waited for a write to Kafka, {} writes reported failed yet \
         applied, {} failed creations of the catch-up consumer, {} failed assignments to it, {} failed creations of the rebuild consumer, {} topic ids unreadable, {} assignments without \
         the group's offsets, {} partitions waiting for what could not be read, {} reuses refused and laid out afresh, {} partitions reconciled on a retry and moved from the log end, {} crashes inside an assignment's local steps, {} reads finding a partition damaged ({} partitions discarded and reconciled again), {} local steps failing without stopping the consumer, {} histories with a free-space floor ({} stops below it, {} appends refused, {} resumes on a drained buffer, {} live appends refused below it while a backlog waited), {} histories with a byte budget ({} pauses, {} appends counted late ({} after a change of layout), {} reads the reader leaves out ({} finding records whose report was to come), {} partitions held to their read-ahead, {} rounds polling less for it, {} histories sharing one catch-up queue ({} holds paused there), {} drains on a disk with less room than the budget), {} partitions assigned \
         again within a poll round, {} histories with a memory tier ({} crashes losing what it \
         held, {} bytes spilled to sled), {} histories whose restarts may find the buffer lost ({} \
         buffers lost and refetched), {} histories whose restarts may find it damaged ({} chunks \
         damaged on disk, {} reads finding it, {} reuses and {} commits finding it), {} histories in mode latest ({} records superseded, {} \
         assignments waiting for their keys to be read again), {} reads waiting for commits, {} \
         drains with one partition's every commit failing: no loss, no stall",
        stats.partitions,
        stats.steps,
        stats.splits,
        stats.multi_range,
        stats.merges,
        stats.truncations,
        stats.holds,
        stats.unnamed_errors,
        stats.transient_errors_in_runs,
        stats.member_runs,
        stats.member_run_errors,
        stats.taken_after_an_error,
        stats.long_tails,
        stats.eager_reassigns,
        stats.commit_refusals,
        stats.assign_deferrals,
        stats.failed_yet_written,
        stats.create_failures,
        stats.catchup_assign_failures,
        stats.rebuild_create_failures,
        stats.id_failures,
        stats.offsets_unread,
        stats.waited_unread,
        stats.reuse_fallbacks,
        stats.parked_repositioned,
        stats.local_step_crashes,
        stats.damaged_reads,
        stats.damaged_refetched,
        stats.local_failures,
        stats.disks,
        stats.disk_stops,
        stats.disk_refusals,
        stats.disk_reuses,
        stats.disk_live_stops,
        stats.budgets,
        stats.budget_pauses,
        stats.late_counts,
        stats.counts_of_old_layouts,
        stats.reads_left_out,
        stats.left_out_awaiting_report,
        stats.read_ahead_holds,
        stats.read_ahead_rounds,
        stats.shared_queues,
        stats.hold_pauses,
        stats.short_drains,
        stats.rebalances_in_a_round,
        stats.memory_tier,
        stats.memory_lost,
        stats.spilled_bytes,
        stats.losing_histories,
        stats.buffers_lost,
        stats.damaging_histories,
        stats.disk_damages,
        stats.damage_found,
        stats.damaged_reuses,
        stats.damaged_commits,
        stats.latest,
        stats.superseded,
        stats.rebuilds,
        stats.commit_waits,
        stats.failing_partition_drains,
    );
    assert!(stats.steps > 0);
    if count >= 1000 {
        // The histories must reach every part of the protocol, and every fault.
        assert!(
            stats.partitions > count as u64
                && stats.splits > 0
                && stats.multi_range > 0
                && stats.merges > 0
                && stats.truncations > 0
                && stats.holds > 0
                && stats.unnamed_errors > 0
                && stats.transient_errors_in_runs > 0
                && stats.member_run_errors > 0
                && stats.taken_after_an_error > 0
                && stats.long_tails > 0
                && stats.eager_reassigns > 0
                && stats.commit_refusals > 0
                && stats.assign_deferrals > 0
                && stats.failed_yet_written > 0
                && stats.create_failures > 0
                && stats.catchup_assign_failures > 0
                && stats.rebuild_create_failures > 0
                && stats.id_failures > 0
                && stats.offsets_unread > 0
                && stats.waited_unread > 0
                && stats.reuse_fallbacks > 0
                && stats.parked_repositioned > 0
                && stats.local_step_crashes > 0
                && stats.damaged_refetched > 0
                && stats.local_failures > 0
                && stats.disk_stops > 0
                && stats.disk_refusals > 0
                && stats.disk_reuses > 0
                && stats.disk_live_stops > 0
                && stats.budget_pauses > 0
                && stats.late_counts > 0
                && stats.reads_left_out > 0
                && stats.left_out_awaiting_report > 0
                && stats.counts_of_old_layouts > 0
                && stats.read_ahead_holds > 0
                && stats.read_ahead_rounds > 0
                && stats.shared_queues > 0
                && stats.hold_pauses > 0
                && stats.short_drains > 0
                && stats.rebalances_in_a_round > 0
                && stats.memory_tier > 0
                && stats.memory_lost > 0
                && stats.spilled_bytes > 0
                && stats.buffers_lost > 0
                && stats.damage_found > 0
                && stats.latest > 0
                && stats.superseded > 0
                && stats.commit_waits > 0
                && stats.failing_partition_drains > 0
                && stats.rebuilds > 0,
            "{stats:?}"
        );
    }
}

/// Seeds that share one buffer database.
const SEEDS_PER_BUFFER: usize = 500;
/// Longest time one seed may take (they take milliseconds).
const SEED_WATCHDOG: std::time::Duration = std::time::Duration::from_secs(120);

/// The fuzz target's corpus replays here too, each input as the fuzzer ran it (its first
/// eight bytes the seed, the rest the simulation's choices).
#[test]
fn fuzz_corpus_replays() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/fetch_sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut buffer = None;
    let mut replayed = 0;
    for entry in std::fs::read_dir(&corpus).expect("corpus directory") {
        let path = entry.expect("corpus entry").path();
        let input = std::fs::read(&path).expect("corpus file");
        let (result, returned) = harness::run_input(&input, dir.path().join("buffer"), buffer);
        buffer = returned;
        if let Err(failure) = result {
            panic!("corpus input {} failed: {failure}", path.display());
        }
        replayed += 1;
    }
    assert!(replayed > 0, "no corpus in {}", corpus.display());
}

fn parse_seed(text: &str) -> u64 {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.expect("a seed must be a number (decimal or 0x hex)")
}
