//! 8 partitions with backlogs of different sizes, in both modes: every offset is delivered
//! at least once, in order per partition (per lane in `Concurrent`), and everything merges.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use catchup::{DeliveryLane, Event, Mode};
use support::{Kafka, catchup_consumer, unique};

const PARTITIONS: i32 = 8;
const WAIT: Duration = Duration::from_secs(30);

async fn run(mode: Mode) {
    let kafka = Kafka::connect();
    let topic = unique("eight");
    kafka.create_topic(&topic, PARTITIONS).await;
    // Partition p gets 40 + 60·p records: below and above min_lag.
    let mut ends = Vec::new();
    for partition in 0..PARTITIONS {
        let count = 40 + 60 * partition as usize;
        kafka.produce_to(&topic, partition, 0, count).await;
        ends.push(count as i64);
    }
    let group = unique("eight-group");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), mode, 100);
    let consumer = catchup_consumer(&kafka, &group, config);
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");

    // Live records arrive while the backlog is being read.
    let fresh = 5;
    let mut seen: BTreeMap<(i32, DeliveryLane), Vec<i64>> = BTreeMap::new();
    let total: i64 = ends.iter().sum::<i64>() + (fresh * PARTITIONS) as i64;
    let mut delivered = 0;
    let mut produced_fresh = false;
    while delivered < total {
        let Ok(delivery) = tokio::time::timeout(WAIT, consumer.recv()).await else {
            let progress: Vec<_> = seen.iter().map(|(k, v)| (k, v.len(), v.last())).collect();
            let happened: Vec<Event> = std::iter::from_fn(|| events.try_recv().ok()).collect();
            panic!("no delivery within {WAIT:?}: seen {progress:?}, events {happened:#?}");
        };
        let delivery = delivery.expect("recv");
        let lane_key = match mode {
            Mode::Concurrent => delivery.lane,
            _ => DeliveryLane::Plain, // one order per partition
        };
        seen.entry((delivery.partition, lane_key))
            .or_default()
            .push(delivery.offset);
        consumer.ack(&delivery);
        delivered += 1;
        if !produced_fresh && delivered == 100 {
            for partition in 0..PARTITIONS {
                kafka
                    .produce_to(&topic, partition, 10_000, fresh as usize)
                    .await;
            }
            produced_fresh = true;
        }
    }
    for (key, offsets) in &seen {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "{key:?} out of order: {offsets:?}"
        );
    }
    for partition in 0..PARTITIONS {
        let mut all: Vec<i64> = seen
            .iter()
            .filter(|((p, _), _)| *p == partition)
            .flat_map(|(_, o)| o.clone())
            .collect();
        all.sort_unstable();
        let end = ends[partition as usize] + fresh as i64;
        assert_eq!(
            all,
            (0..end).collect::<Vec<_>>(),
            "partition {partition}: every offset exactly once"
        );
    }
    // Partitions with a backlog of at least min_lag were split, and every split merges.
    let split_partitions = ends.iter().filter(|&&end| end >= 100).count();
    let mut merged = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while merged < split_partitions {
        consumer.commit().await.expect("commit");
        while let Ok(event) = events.try_recv() {
            merged += usize::from(matches!(event, Event::Merged { .. }));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {merged} of {split_partitions} merged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.commit().await.expect("commit");
    let committed = kafka.committed(&group, &topic, PARTITIONS);
    let expected: Vec<Option<i64>> = ends.iter().map(|end| Some(end + fresh as i64)).collect();
    assert_eq!(committed, expected);
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_eight_partitions() {
    run(Mode::Ordered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_eight_partitions() {
    run(Mode::Concurrent).await;
}
