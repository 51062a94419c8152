//! The split, catch-up and merge under each group protocol: classic cooperative-sticky (the
//! default), classic eager (range), and KIP-848 `consumer`.

mod support;

use std::time::Duration;

use catchup::{CatchupConsumer, DeliveryLane, Event, Mode};
use support::{Kafka, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

async fn scenario(settings: &[(&str, &str)]) {
    let kafka = Kafka::connect();
    let topic = unique("protocol");
    kafka.create_topic(&topic, 2).await;
    kafka.produce(&topic, 2, 600).await; // 300 per partition
    let group = unique("protocol-group");
    kafka.commit_as_operator(&group, &topic, &[100, 250]);
    let mut client = rdkafka::ClientConfig::new();
    client
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest");
    for (key, value) in settings {
        client.set(*key, *value);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Ordered, 100);
    let consumer = CatchupConsumer::new(&client, config).expect("consumer");
    let (mut events, split) = support::subscribe_until_split(&consumer, &topic).await;
    assert_eq!(
        split,
        Event::SplitStarted {
            topic: topic.clone(),
            partition: 0,
            epoch: 1,
            from: 100,
            boundary: 300
        }
    );

    // Partition 1 has a backlog of 50 < min_lag: plain. Partition 0 is split.
    let mut next = [100i64, 250];
    while next != [300, 300] {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        let slot = &mut next[delivery.partition as usize];
        assert_eq!(
            delivery.offset, *slot,
            "partition {} in order",
            delivery.partition
        );
        *slot += 1;
        let expected_lane = if delivery.partition == 0 {
            DeliveryLane::Catchup
        } else {
            DeliveryLane::Plain
        };
        assert_eq!(delivery.lane, expected_lane);
        consumer.ack(&delivery);
    }
    wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::Merged { partition: 0, .. })
    })
    .await;
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        vec![Some(300), Some(300)]
    );
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_cooperative_sticky() {
    scenario(&[("session.timeout.ms", "6000")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_eager() {
    scenario(&[
        ("session.timeout.ms", "6000"),
        ("partition.assignment.strategy", "range"),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip_848_consumer_protocol() {
    scenario(&[("group.protocol", "consumer")]).await;
}
