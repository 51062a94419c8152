//! What a power loss can leave of a buffer: each of its files rolled back on its own to an
//! earlier state (unsynced writes lost out of order), bytes flipped, the log truncated,
//! files missing. The consumer never calls `sync()` — the buffer is a cache of Kafka — so
//! whatever is on disk, starting on it must end in a verified buffer or a clean refetch, and
//! deliver every record from the group's committed offset with the produced content, without
//! an error (store audit C1, C2; issue "the buffer as a verified cache of Kafka").
//!
//! The images come from a real run: a consumer fetches and processes part of a topic while
//! the test copies the buffer's files every few hundred milliseconds (a copy of a live sled
//! directory is what a crash leaves); it then crashes. Each image mixes files of different
//! copies, seeded (`CATCHUP_POWER_LOSS_SEED` replays the choices; the copies themselves
//! follow the run's timing), and runs on its own group committed where the crashed run left
//! off. Outcomes seen: a recent image served from disk; an older one reset at reconciliation
//! (its positions do not cover the group's); a log sled cannot recover (flipped bytes, a
//! missing `db` next to a truncated `conf`) emptied at start — the first image always is one.
//! Without that last step the consumer refused to start ("buffer … is damaged: corrupted
//! data in the database files").

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use catchup::{CatchupConsumer, Mode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{Kafka, test_config, unique};

const WAIT: Duration = Duration::from_secs(60);
const PARTITIONS: i32 = 3;
const PER_PARTITION: i64 = 3_000;
/// Images built and run.
const IMAGES: usize = 10;

fn value(partition: i32, offset: i64) -> String {
    format!("{partition}:{offset}:{}", "v".repeat(200))
}

/// Copies the files of `from` into `to` (a file sled deletes meanwhile is simply absent).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            match std::fs::copy(entry.path(), &target) {
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(())
}

/// The files of a buffer directory, by path relative to it.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                let relative = path.strip_prefix(dir).expect("inside").to_path_buf();
                out.insert(relative, bytes);
            }
        }
    }
    out
}

/// One image: every file taken from a copy of its own choosing (or left out), then damaged
/// one way or another. Returns what was done, for the failure message.
fn build_image(copies: &[BTreeMap<PathBuf, Vec<u8>>], to: &Path, rng: &mut StdRng) -> String {
    let names: BTreeSet<&PathBuf> = copies.iter().flat_map(|copy| copy.keys()).collect();
    let mut recipe = Vec::new();
    std::fs::create_dir_all(to).expect("image dir");
    for name in names {
        // The mark that this directory is catchup's is written once, when the buffer is
        // created, and is not part of what a power loss mixes here.
        if name.as_os_str() == "CATCHUP_BUFFER" {
            let last = copies.last().and_then(|copy| copy.get(name));
            std::fs::write(to.join(name), last.expect("the mark")).expect("write the mark");
            continue;
        }
        let from = rng.gen_range(0..copies.len());
        let Some(bytes) = copies[from].get(name) else {
            recipe.push(format!("{} absent (copy {from})", name.display()));
            continue;
        };
        let mut bytes = bytes.clone();
        let damage = rng.gen_range(0..10);
        let what = match damage {
            0 if !bytes.is_empty() => {
                for _ in 0..rng.gen_range(1..8) {
                    let at = rng.gen_range(0..bytes.len());
                    bytes[at] ^= 1 << rng.gen_range(0..8);
                }
                "bytes flipped"
            }
            1 if !bytes.is_empty() => {
                bytes.truncate(rng.gen_range(0..bytes.len()));
                "truncated"
            }
            2 => {
                recipe.push(format!("{} missing", name.display()));
                continue;
            }
            _ => "as copied",
        };
        recipe.push(format!("{} from copy {from}, {what}", name.display()));
        let path = to.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("parent");
        }
        std::fs::write(path, bytes).expect("write image file");
    }
    recipe.join("; ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_mix_of_lost_writes_ends_verified_or_refetched() {
    let seed: u64 = std::env::var("CATCHUP_POWER_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("CATCHUP_POWER_LOSS_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let kafka = Kafka::connect();
    let topic = unique("power-loss");
    kafka.create_topic(&topic, PARTITIONS).await;
    kafka
        .produce_values(&topic, PARTITIONS, PER_PARTITION, value)
        .await;
    let zeros = [0; PARTITIONS as usize];

    // The run the images come from: buffers everything, processes about half, and its
    // buffer's files are copied all along.
    let group = unique("power-loss-run");
    kafka.commit_as_operator(&group, &topic, &zeros);
    let run_dir = tempfile::tempdir().expect("tempdir");
    let copies_dir = tempfile::tempdir().expect("tempdir");
    let run = CatchupConsumer::new(
        &kafka.consumer_config(&group),
        test_config(run_dir.path(), Mode::Off, 100),
    )
    .expect("consumer");
    run.subscribe(&[&topic]).expect("subscribe");
    let mut copies = Vec::new();
    let mut processed = 0;
    let mut last_copy = Instant::now();
    let deadline = Instant::now() + WAIT;
    while processed < PARTITIONS as i64 * PER_PARTITION / 2 {
        assert!(
            Instant::now() < deadline,
            "the run processed only {processed}"
        );
        let delivery = support::next_delivery(&run, WAIT).await;
        run.ack(&delivery);
        processed += 1;
        if processed % 500 == 0 || last_copy.elapsed() > Duration::from_millis(300) {
            let copy = copies_dir.path().join(copies.len().to_string());
            copy_dir(run_dir.path(), &copy).expect("copy");
            copies.push(files(&copy));
            last_copy = Instant::now();
        }
    }
    run.commit().await.expect("commit");
    drop(run); // a crash
    copies.push(files(run_dir.path()));
    let committed: Vec<i64> = kafka
        .committed(&group, &topic, PARTITIONS)
        .into_iter()
        .map(|c| c.expect("the run committed every partition"))
        .collect();
    eprintln!("{} copies; the run committed {committed:?}", copies.len());

    for image in 0..IMAGES {
        let image_dir = tempfile::tempdir().expect("tempdir");
        let buffer = image_dir.path().join("buffer");
        let recipe = if image == 0 {
            // Certain to be beyond sled's recovery: the newest files, `conf` cut short (its
            // checksum fails). The consumer must empty the buffer and refetch everything.
            let newest = copies.last().expect("copies");
            std::fs::create_dir_all(&buffer).expect("image dir");
            for (name, bytes) in newest {
                let bytes = if name.as_os_str() == "conf" {
                    &bytes[..12]
                } else {
                    &bytes[..]
                };
                std::fs::write(buffer.join(name), bytes).expect("write image file");
            }
            "newest copy, conf cut to 12 bytes".to_owned()
        } else {
            build_image(&copies, &buffer, &mut rng)
        };
        let group = unique("power-loss-image");
        kafka.commit_as_operator(&group, &topic, &committed);
        let consumer = CatchupConsumer::new(
            &kafka.consumer_config(&group),
            test_config(&buffer, Mode::Off, 100),
        )
        .unwrap_or_else(|err| panic!("image {image} ({recipe}): {err}"));
        let mut events = consumer.events();
        consumer.subscribe(&[&topic]).expect("subscribe");
        let mut wanted: BTreeSet<(i32, i64)> = (0..PARTITIONS)
            .flat_map(|p| (committed[p as usize]..PER_PARTITION).map(move |o| (p, o)))
            .collect();
        while !wanted.is_empty() {
            let delivery = tokio::time::timeout(WAIT, consumer.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "image {image} ({recipe}): {} records never delivered",
                        wanted.len()
                    )
                })
                .unwrap_or_else(|err| panic!("image {image} ({recipe}): {err}"));
            assert_eq!(
                delivery.payload.as_deref(),
                Some(value(delivery.partition, delivery.offset).as_bytes()),
                "image {image} ({recipe}): {}/{} is not the produced record",
                delivery.partition,
                delivery.offset
            );
            wanted.remove(&(delivery.partition, delivery.offset));
            consumer.ack(&delivery);
        }
        consumer.close().await.expect("close");
        let (mut reused, mut discarded) = (0, Vec::new());
        while let Ok(event) = events.try_recv() {
            match event {
                catchup::Event::LocalReused { .. } => reused += 1,
                catchup::Event::LocalDiscarded { reason, .. } => discarded.push(reason),
                _ => {}
            }
        }
        eprintln!(
            "image {image}: {recipe}\n  -> {reused} partition(s) served from the image, discarded: {discarded:?}"
        );
        if image == 0 {
            assert_eq!(
                reused, 0,
                "image 0 could not be recovered: it must start empty"
            );
        }
        assert_eq!(
            kafka.committed(&group, &topic, PARTITIONS),
            vec![Some(PER_PARTITION); PARTITIONS as usize],
            "image {image} ({recipe})"
        );
    }
}
