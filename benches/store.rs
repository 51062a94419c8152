//! Buffer throughput, reopen time and disk use, for 100 B and 1 KiB records.
//!
//! Side by side in one run: the chunked layout the buffer uses (one sled entry per fetched
//! batch) against one sled entry per record, written in batches of the same size through
//! sled directly with the same value codec shape. After criterion's groups a table prints
//! records/s and MB/s of one fixed-size pass of each, disk bytes per payload byte (after
//! filling 1M records, draining them, and filling again, compacting as the consumer does),
//! and the reopen time of a 1M-record buffer.
//!
//! `cargo bench --bench store`; `CATCHUP_BENCH_TABLE_ONLY=1` skips the criterion groups;
//! `CATCHUP_BENCH_CHUNK_BYTES=N` tries another chunk size.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use catchup::store::{Buffer, BufferOptions, Fetched, Lane, PartitionLayout, Record, Timestamp};
use criterion::{BenchmarkId, Criterion, Throughput};

const BATCH: usize = 1000;
const SIZES: [usize; 2] = [100, 1024];
const TABLE_RECORDS: usize = 1_000_000;

fn records(start: i64, count: usize, size: usize) -> Vec<Record> {
    (0..count as i64)
        .map(|i| Record {
            offset: start + i,
            timestamp: Timestamp::CreateTime(1_764_000_000_000 + i),
            key: Some(
                format!("k{:06}", (start + i) % 1_000_000)
                    .into_bytes()
                    .into(),
            ),
            payload: Some(vec![(i % 251) as u8; size - 7].into()), // key + payload = size bytes
            headers: Vec::new(),
        })
        .collect()
}

fn batches(first_offset: i64, total: usize, size: usize) -> Vec<Vec<Record>> {
    (0..total / BATCH)
        .map(|i| records(first_offset + (i * BATCH) as i64, BATCH, size))
        .collect()
}

fn options() -> BufferOptions {
    let mut options = BufferOptions::default();
    if let Some(bytes) = std::env::var("CATCHUP_BENCH_CHUNK_BYTES")
        .ok()
        .and_then(|b| b.parse().ok())
    {
        options.chunk_target_bytes = bytes;
    }
    options
}

/// The layouts compared: append a fetched batch; read a batch and commit it.
trait Layout {
    fn append(&mut self, batch: &[Record]);
    fn read_commit(&mut self) -> usize;
    fn sync(&mut self);
    /// What the consumer does every 10 s: compact a bloated buffer. Returns how long the
    /// compaction took and how long writers waited, if it compacted (here the same thread
    /// pays both; the consumer runs it on a thread of its own).
    fn maintain(&mut self) -> Option<(Duration, Duration)> {
        None
    }
}

/// The buffer as shipped: one sled entry per fetched batch.
struct Chunked {
    buffer: Buffer,
    next: i64,
    fetched_next: i64,
}

impl Chunked {
    fn open(dir: &Path) -> Self {
        let buffer = Buffer::open(dir, options()).expect("open buffer");
        buffer
            .reset_partition("bench", 0, PartitionLayout::plain(0))
            .expect("layout");
        Self {
            buffer,
            next: 0,
            fetched_next: 0,
        }
    }
}

impl Layout for Chunked {
    fn append(&mut self, batch: &[Record]) {
        let end = batch.last().map_or(self.fetched_next, |r| r.offset + 1);
        let layout = self
            .buffer
            .layout_id("bench", 0)
            .expect("layout id")
            .expect("laid out");
        let fetched = Fetched {
            layout,
            continues_from: self.fetched_next,
            records: batch,
            next: end,
        };
        self.buffer
            .append(Lane::Live, "bench", 0, fetched)
            .expect("append");
        self.fetched_next = end;
    }

    fn read_commit(&mut self) -> usize {
        let read = self
            .buffer
            .read(Lane::Live, "bench", 0, self.next, BATCH)
            .expect("read");
        self.next = read.next;
        self.buffer
            .record_committed(Lane::Live, "bench", 0, read.next)
            .expect("commit");
        read.records.len()
    }

    fn sync(&mut self) {
        self.buffer.sync().expect("sync");
    }

    fn maintain(&mut self) -> Option<(Duration, Duration)> {
        let compaction = self.buffer.compact_if_bloated().expect("compact")?;
        Some((compaction.took, compaction.writers_waited))
    }
}

/// The alternative evaluated: one sled entry per record (one sled batch per fetched batch).
struct PerRecord {
    db: sled::Db,
    next: i64,
}

fn per_record_key(offset: i64) -> [u8; 17] {
    let mut key = [0; 17];
    key[0] = b'L';
    key[9..].copy_from_slice(&(offset as u64).to_be_bytes());
    key
}

impl PerRecord {
    fn open(dir: &Path) -> Self {
        let defaults = BufferOptions::default();
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(defaults.cache_capacity)
            .flush_every_ms(defaults.flush_every_ms)
            .segment_size(defaults.segment_bytes)
            .mode(sled::Mode::HighThroughput)
            .open()
            .expect("sled");
        Self { db, next: 0 }
    }
}

impl Layout for PerRecord {
    fn append(&mut self, batch: &[Record]) {
        let mut sled_batch = sled::Batch::default();
        for record in batch {
            // The buffer's value shape: version byte, CRC32C, bincode body.
            let mut value = vec![1, 0, 0, 0, 0];
            bincode::encode_into_std_write(record, &mut value, bincode::config::standard())
                .expect("encode");
            let crc = crc32c::crc32c(&value[5..]);
            value[1..5].copy_from_slice(&crc.to_le_bytes());
            sled_batch.insert(&per_record_key(record.offset), value);
        }
        self.db.apply_batch(sled_batch).expect("apply");
    }

    fn read_commit(&mut self) -> usize {
        let mut read = 0;
        let mut deletes = sled::Batch::default();
        for entry in self.db.range(per_record_key(self.next)..).take(BATCH) {
            let (key, value) = entry.expect("entry");
            assert_eq!(crc32c::crc32c(&value[5..]).to_le_bytes(), value[1..5]);
            let (record, _): (Record, usize) =
                bincode::decode_from_slice(&value[5..], bincode::config::standard())
                    .expect("decode");
            black_box(record);
            deletes.remove(key);
            read += 1;
        }
        self.next += read as i64;
        self.db.apply_batch(deletes).expect("delete");
        read
    }

    fn sync(&mut self) {
        self.db.flush().expect("flush");
    }
}

type OpenLayout = fn(&Path) -> Box<dyn Layout>;

/// The layouts compared, side by side in every run.
const LAYOUTS: [(&str, OpenLayout); 2] = [
    ("chunked", |dir| Box::new(Chunked::open(dir))),
    ("per-record", |dir| Box::new(PerRecord::open(dir))),
];

fn bench_groups(c: &mut Criterion) {
    for size in SIZES {
        let mut group = c.benchmark_group(format!("{size}B"));
        group.throughput(Throughput::Elements(BATCH as u64));
        group
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1))
            .sample_size(20);
        for (name, open) in LAYOUTS {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut layout = open(dir.path());
            let mut offset = 0;
            group.bench_function(BenchmarkId::new(name, "append+read+commit"), |b| {
                b.iter(|| {
                    layout.append(&records(offset, BATCH, size));
                    offset += BATCH as i64;
                    black_box(layout.read_commit())
                })
            });
        }
        group.finish();
    }
}

/// Bytes allocated on disk under `dir` (blocks, not apparent length: sled's files can be
/// sparse).
fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_bytes(&entry.path()),
            Ok(meta) => std::os::unix::fs::MetadataExt::blocks(&meta) * 512,
            Err(_) => 0,
        })
        .sum()
}

struct Pass {
    append: Duration,
    read_commit: Duration,
    /// Disk bytes after buffering everything, after draining it, after buffering it again.
    disk: [u64; 3],
    /// The highest ratio, over every sample, of the disk to its bound: twice the payload
    /// still buffered plus the allowance (≤ 1 meets the target).
    worst_vs_bound: f64,
    compactions: usize,
    longest_compaction: Duration,
    longest_pause: Duration,
}

/// Batches between two samples of the disk (and calls to `maintain`).
const SAMPLE_EVERY: usize = 50;

/// Tracks the disk against its bound while a pass runs.
struct Sampler<'a> {
    dir: &'a Path,
    payload_per_record: f64,
    worst_vs_bound: f64,
    compactions: usize,
    longest_compaction: Duration,
    longest_pause: Duration,
}

impl Sampler<'_> {
    fn sample(&mut self, layout: &mut dyn Layout, buffered_records: usize) {
        if let Some((took, pause)) = layout.maintain() {
            self.compactions += 1;
            self.longest_compaction = self.longest_compaction.max(took);
            self.longest_pause = self.longest_pause.max(pause);
        }
        let bound = 2.0 * self.payload_per_record * buffered_records as f64
            + options().disk_allowance_bytes as f64;
        self.worst_vs_bound = self.worst_vs_bound.max(disk_bytes(self.dir) as f64 / bound);
    }
}

/// Buffers `TABLE_RECORDS` records, drains them (read + commit), buffers as many again;
/// samples the disk every `SAMPLE_EVERY` batches. Timings include the samples (a
/// directory walk) and any compaction, as a consumer would pay them.
fn pass(layout: &mut dyn Layout, dir: &Path, size: usize) -> Pass {
    let mut sampler = Sampler {
        dir,
        payload_per_record: records(0, 1, size)[0].payload_bytes() as f64,
        worst_vs_bound: 0.0,
        compactions: 0,
        longest_compaction: Duration::ZERO,
        longest_pause: Duration::ZERO,
    };
    let first = batches(0, TABLE_RECORDS, size);
    let started = Instant::now();
    for (index, batch) in first.iter().enumerate() {
        layout.append(batch);
        if index % SAMPLE_EVERY == SAMPLE_EVERY - 1 {
            sampler.sample(layout, (index + 1) * BATCH);
        }
    }
    let append = started.elapsed();
    layout.sync();
    let buffered = disk_bytes(dir);
    let started = Instant::now();
    let mut read = 0;
    let mut reads = 0;
    while read < TABLE_RECORDS {
        read += layout.read_commit();
        reads += 1;
        if reads % SAMPLE_EVERY == 0 {
            sampler.sample(layout, TABLE_RECORDS - read);
        }
    }
    let read_commit = started.elapsed();
    sampler.sample(layout, 0);
    layout.sync();
    let drained = disk_bytes(dir);
    for (index, batch) in batches(TABLE_RECORDS as i64, TABLE_RECORDS, size)
        .iter()
        .enumerate()
    {
        layout.append(batch);
        if index % SAMPLE_EVERY == SAMPLE_EVERY - 1 {
            sampler.sample(layout, (index + 1) * BATCH);
        }
    }
    layout.sync();
    Pass {
        append,
        read_commit,
        disk: [buffered, drained, disk_bytes(dir)],
        worst_vs_bound: sampler.worst_vs_bound,
        compactions: sampler.compactions,
        longest_compaction: sampler.longest_compaction,
        longest_pause: sampler.longest_pause,
    }
}

fn summary_table() {
    println!(
        "\none pass of {TABLE_RECORDS} records in batches of {BATCH}; disk = allocated bytes per payload byte;\n\
         worst = highest disk / (2 x payload still buffered + {} MiB) over samples every {SAMPLE_EVERY} batches",
        options().disk_allowance_bytes >> 20
    );
    println!(
        "{:<11} {:>7} {:>13} {:>7} {:>14} {:>7} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9}",
        "layout",
        "record",
        "append rec/s",
        "MB/s",
        "read+commit/s",
        "MB/s",
        "buffered",
        "drained",
        "again",
        "worst",
        "compacted",
        "longest",
        "max pause"
    );
    for size in SIZES {
        let payload = records(0, BATCH, size)
            .iter()
            .map(|r| r.payload_bytes() as f64)
            .sum::<f64>()
            * (TABLE_RECORDS / BATCH) as f64;
        let rate = |d: Duration| TABLE_RECORDS as f64 / d.as_secs_f64();
        let mb = |d: Duration| payload / d.as_secs_f64() / 1e6;
        let ratio = |bytes: u64| format!("{:.2}x", bytes as f64 / payload);

        for (name, open) in LAYOUTS {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut layout = open(dir.path());
            let result = pass(layout.as_mut(), dir.path(), size);
            let [buffered, drained, again] = result.disk;
            println!(
                "{name:<11} {:>7} {:>13.0} {:>7.1} {:>14.0} {:>7.1} {:>9} {:>9} {:>9} {:>6.2} {:>9} {:>9} {:>9}",
                format!("{size} B"),
                rate(result.append),
                mb(result.append),
                rate(result.read_commit),
                mb(result.read_commit),
                ratio(buffered),
                ratio(drained),
                ratio(again),
                result.worst_vs_bound,
                result.compactions,
                format!("{} ms", result.longest_compaction.as_millis()),
                format!("{} ms", result.longest_pause.as_millis())
            );
        }
    }

    // Reopen with 1M buffered records: what a restart pays before the first delivery.
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut chunked = Chunked::open(dir.path());
        for batch in batches(0, TABLE_RECORDS, 100) {
            chunked.append(&batch);
        }
        chunked.buffer.sync().expect("sync");
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let buffer = Buffer::open(dir.path(), options()).expect("reopen");
        let state = buffer
            .partition_state("bench", 0)
            .expect("state")
            .expect("laid out");
        let first = buffer.read(Lane::Live, "bench", 0, 0, 1).expect("read");
        times.push(started.elapsed());
        assert_eq!(state.live.fetched_next, TABLE_RECORDS as i64);
        assert_eq!(first.records.first().map(|r| r.offset), Some(0));
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\nreopen of a {TABLE_RECORDS}-record (100 B) buffer + first read: median {:.1} ms (min {:.1}, max {:.1})",
        ms(times[2]),
        ms(times[0]),
        ms(times[4])
    );
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`: criterion then runs
    // each benchmark once as a test; the table (1M records per pass) is skipped.
    let benching = std::env::args().any(|arg| arg == "--bench");
    if std::env::var_os("CATCHUP_BENCH_TABLE_ONLY").is_none() {
        let mut criterion = Criterion::default().configure_from_args();
        bench_groups(&mut criterion);
        criterion.final_summary();
    }
    if benching {
        summary_table();
    }
}
