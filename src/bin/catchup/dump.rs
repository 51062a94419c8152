//! `catchup dump`: buffered records as JSON lines, in delivery order.

use std::io::Write;
use std::path::PathBuf;

use catchup::store::{Buffer, Lane, PartitionState, StoreError};

use crate::schema::RecordLine;

/// Arguments of `catchup dump`.
#[derive(clap::Args)]
pub struct DumpArgs {
    /// The buffer directory.
    pub dir: PathBuf,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this partition.
    #[arg(long)]
    pub partition: Option<i32>,
    /// Only this lane (default: both, catch-up first — the `Ordered` delivery order).
    #[arg(long, value_parser = parse_lane)]
    pub lane: Option<Lane>,
    /// Start at this offset (default: each lane's first unprocessed offset).
    #[arg(long)]
    pub from: Option<i64>,
    /// Print at most this many records.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Where the private copy of the buffer goes (default: the system's temporary
    /// directory); it needs the buffer's size free.
    #[arg(long)]
    pub tmp_dir: Option<PathBuf>,
}

fn parse_lane(text: &str) -> Result<Lane, String> {
    match text {
        "catchup" => Ok(Lane::Catchup),
        "live" => Ok(Lane::Live),
        other => Err(format!("unknown lane '{other}': use 'catchup' or 'live'")),
    }
}

pub fn print(args: &DumpArgs, buffer: &Buffer) -> Result<(), StoreError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut left = args.limit.unwrap_or(usize::MAX);
    for (topic, partition, state) in buffer.partitions()? {
        if args.topic.as_ref().is_some_and(|t| *t != topic)
            || args.partition.is_some_and(|p| p != partition)
        {
            continue;
        }
        let lanes: &[Lane] = match args.lane {
            Some(Lane::Catchup) => &[Lane::Catchup],
            Some(Lane::Live) => &[Lane::Live],
            None => &Lane::ALL,
        };
        for &lane in lanes {
            left = dump_lane(
                buffer,
                &mut out,
                (&topic, partition, &state),
                lane,
                args.from,
                left,
            )?;
            if left == 0 {
                return flush(out);
            }
        }
    }
    flush(out)
}

fn flush(mut out: impl Write) -> Result<(), StoreError> {
    // A closed pipe (`catchup dump | head`) is not an error worth reporting.
    let _ = out.flush();
    Ok(())
}

fn dump_lane(
    buffer: &Buffer,
    out: &mut impl Write,
    (topic, partition, state): (&str, i32, &PartitionState),
    lane: Lane,
    from: Option<i64>,
    mut left: usize,
) -> Result<usize, StoreError> {
    let mut next = from.unwrap_or(state.lane(lane).committed_next);
    while left > 0 {
        let batch = buffer.read(lane, topic, partition, next, left.min(10_000))?;
        if batch.records.is_empty() {
            break;
        }
        for record in batch.records.iter().take(left) {
            let line = RecordLine::stored(topic, partition, lane, record);
            if serde_json::to_writer(&mut *out, &line).is_err() || out.write_all(b"\n").is_err() {
                return Ok(0); // stdout closed: stop quietly
            }
            left -= 1;
        }
        next = batch.next;
    }
    Ok(left)
}
