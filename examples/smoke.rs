//! Smoke run against a real broker: produce 10,000 keyed records to a fresh 4-partition
//! topic, consume them with a group consumer, commit, and check the committed offsets.
//!
//! ```text
//! scripts/kafka start && cargo run --example smoke
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};

const RECORDS: usize = 10_000;
const PARTITIONS: i32 = 4;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kafka = support::Kafka::connect();
    let topic = support::unique("smoke");
    kafka.create_topic(&topic, PARTITIONS).await;
    println!(
        "broker {}: topic {topic} with {PARTITIONS} partitions",
        kafka.bootstrap
    );

    let started = Instant::now();
    let produced = kafka.produce(&topic, PARTITIONS, RECORDS).await;
    let produce_time = started.elapsed();

    let group = support::unique("smoke-group");
    let consumer: StreamConsumer = kafka.consumer_config(&group).create()?;
    consumer.subscribe(&[&topic])?;
    let started = Instant::now();
    let consumed = support::consume_all(&consumer, RECORDS, Duration::from_secs(90)).await;
    let consume_time = started.elapsed();

    let committed = kafka.committed(&group, &topic, PARTITIONS);
    let watermarks = kafka.watermarks(&topic, PARTITIONS);
    let rate = |n: usize, t: Duration| n as f64 / t.as_secs_f64().max(1e-9);
    println!(
        "produced {:>6} records in {:>7.3} s ({:>9.0} records/s)",
        produced.len(),
        produce_time.as_secs_f64(),
        rate(produced.len(), produce_time)
    );
    println!(
        "consumed {:>6} records in {:>7.3} s ({:>9.0} records/s, group rebalance included)",
        consumed.records.len(),
        consume_time.as_secs_f64(),
        rate(consumed.records.len(), consume_time)
    );
    println!("partition  high watermark  committed");
    let mut ok = consumed.records.len() == RECORDS;
    for (partition, (_, high)) in watermarks.iter().enumerate() {
        let committed = committed[partition];
        ok &= committed == Some(*high);
        println!(
            "{partition:>9}  {high:>14}  {:>9}",
            committed.map_or("-".into(), |c| c.to_string())
        );
    }
    if !ok {
        return Err(
            "the committed offsets do not match the log end, or records are missing".into(),
        );
    }
    println!("ok: every record consumed, committed offsets equal the log end");
    Ok(())
}
