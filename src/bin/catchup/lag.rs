//! `catchup lag`: a group's true progress per partition. During a split the group's
//! committed offset carries only catch-up progress, so standard lag tools report the whole
//! backlog as lag; this reads the split tokens and side entries too.

use catchup::{PartitionLag, SideStatus};
use serde_json::json;

use crate::Failure;
use crate::run::ConnectionArgs;

/// Arguments of `catchup lag`.
#[derive(clap::Args)]
pub struct LagArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Topic the group consumes (repeat for several); without it, every partition the
    /// group has committed offsets for.
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// The group's side topic (`{group}` is replaced by the group id).
    #[arg(long, default_value = "__catchup_side")]
    pub side_topic: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `catchup lag`.
pub fn lag(args: LagArgs) -> Result<(), Failure> {
    let client = args.connection.client()?;
    let group = &args.connection.group;
    let topics: Vec<&str> = args.topics.iter().map(String::as_str).collect();
    let lags =
        catchup::group_lag(&client, group, &topics, &args.side_topic).map_err(crate::failure)?;
    if lags.is_empty() && !args.json {
        eprintln!("group {group} has no committed offsets");
    }
    if args.json {
        let partitions: Vec<_> = lags.iter().map(partition_json).collect();
        println!("{}", json!({ "group": group, "partitions": partitions }));
        return Ok(());
    }
    println!(
        "{:<24} {:>5} {:>6} {:>10} {:>12} {:>10} {:>10} {:>12} {:>10} {:>10}  side",
        "topic",
        "part",
        "epoch",
        "boundary",
        "committed",
        "catch-up",
        "live next",
        "log end",
        "live lag",
        "reported"
    );
    let show = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for PartitionLag {
        topic,
        partition,
        lag,
        ..
    } in &lags
    {
        println!(
            "{:<24} {:>5} {:>6} {:>10} {:>12} {:>10} {:>10} {:>12} {:>10} {:>10}  {}",
            topic,
            partition,
            lag.split
                .map_or_else(|| "-".to_owned(), |(epoch, _)| epoch.to_string()),
            show(lag.split.map(|(_, boundary)| boundary)),
            show(lag.committed),
            lag.catchup_remaining,
            show(lag.live_next),
            lag.log_end,
            show(lag.live_lag),
            show(lag.reported_lag),
            side_text(&lag.side)
        );
    }
    Ok(())
}

fn side_text(side: &SideStatus) -> String {
    match side {
        SideStatus::NotSplit => "-".into(),
        SideStatus::Verified => "verified".into(),
        SideStatus::Missing => "none yet".into(),
        SideStatus::Untrusted(reason) => format!("untrusted: {reason}"),
        other => format!("{other:?}"),
    }
}

fn partition_json(partition: &PartitionLag) -> serde_json::Value {
    let lag = &partition.lag;
    json!({
        "topic": partition.topic,
        "partition": partition.partition,
        "split": lag.split.is_some(),
        "epoch": lag.split.map(|(epoch, _)| epoch),
        "boundary": lag.split.map(|(_, boundary)| boundary),
        "committed": lag.committed,
        "catchup_remaining": lag.catchup_remaining,
        "live_next": lag.live_next,
        "log_end": lag.log_end,
        "live_lag": lag.live_lag,
        "reported_lag": lag.reported_lag,
        "side_entry": side_text(&lag.side),
    })
}
