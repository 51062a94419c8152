//! A crash-resilient consumer: fresh records first after a restart, the backlog in order
//! behind them, at-least-once processing, a clean close on Ctrl-C.
//!
//! ```text
//! scripts/kafka start
//! CATCHUP_BROKERS=$(scripts/kafka bootstrap) cargo run --example consume -- orders orders-app ./orders-buffer
//! ```
//!
//! Kill it with SIGKILL at any point and start it again: it resumes at the first record not
//! yet committed, and the records it already buffered are served from disk.

use catchup::{CatchupConfig, CatchupConsumer, Event, Mode};
use rdkafka::ClientConfig;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(topic), Some(group), Some(buffer_dir)) = (args.next(), args.next(), args.next())
    else {
        eprintln!("usage: consume TOPIC GROUP BUFFER_DIR (brokers from CATCHUP_BROKERS)");
        std::process::exit(2);
    };
    let brokers = std::env::var("CATCHUP_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());

    let mut kafka = ClientConfig::new();
    kafka
        .set("bootstrap.servers", &brokers)
        .set("group.id", &group)
        // Where a group without a commit starts.
        .set("auto.offset.reset", "earliest");
    let config = CatchupConfig::new(&buffer_dir)
        // Fresh records while the backlog is read; each lane in offset order.
        .mode(Mode::Concurrent);
    let consumer = CatchupConsumer::connect(&kafka, config).await?;
    let mut events = consumer.events();
    consumer.subscribe(&[&topic])?;

    let mut processed: u64 = 0;
    loop {
        tokio::select! {
            delivery = consumer.recv() => {
                let delivery = delivery?;
                // Process the record here; ack it only once its effects are done.
                processed += 1;
                if processed % 10_000 == 0 {
                    println!("{processed} records, now at {}/{} offset {} ({:?} lane)",
                        delivery.topic, delivery.partition, delivery.offset, delivery.lane);
                }
                consumer.ack(&delivery);
            }
            Ok(event) = events.recv() => match event {
                Event::SplitStarted { .. } | Event::Merged { .. } | Event::Truncated { .. } => {
                    println!("{event:?}");
                }
                _ => {}
            },
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    // Commits what was acked and leaves the group.
    consumer.close().await?;
    println!("processed {processed} records");
    Ok(())
}
