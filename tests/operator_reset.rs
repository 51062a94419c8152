//! An operator resets the group's offsets while a side entry exists: the stale entry is
//! detected and processing restarts at the reset offset.

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, Event, Mode};
use support::{Kafka, catchup_consumer, side_value, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_offsets_make_the_side_entry_stale() {
    let kafka = Kafka::connect();
    let topic = unique("reset");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 500).await;
    let group = unique("reset-group");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || {
        CatchupConfig::new(dir.path())
            .mode(Mode::Ordered)
            .min_lag(100)
    };
    let side_key = format!("{group}/{topic}/0");
    {
        let consumer = catchup_consumer(&kafka, &group, config());
        let (_events, split) = support::subscribe_until_split(&consumer, &topic).await;
        assert!(
            matches!(split, Event::SplitStarted { epoch: 1, .. }),
            "{split:?}"
        );
        for _ in 0..100 {
            let delivery = support::next_delivery(&consumer, WAIT).await;
            consumer.ack(&delivery);
        }
        consumer.commit().await.expect("commit");
        consumer.close().await.expect("close");
    }
    assert!(side_value(&kafka, "__catchup_side", &side_key).is_some_and(|v| v.contains("e=1")));
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(100)]);

    // The operator's tool commits 50 with no metadata while the group is empty.
    kafka.commit_as_operator(&group, &topic, &[50]);

    let consumer = catchup_consumer(&kafka, &group, config());
    let mut events = consumer.events();
    consumer.subscribe(&[&topic]).expect("subscribe");
    let stale = wait_for_event(&mut events, WAIT, |e| matches!(e, Event::StaleState { .. })).await;
    assert!(
        matches!(&stale, Event::StaleState { what, .. }
            if what.contains(&format!("side entry {side_key} of epoch 1 has no split token"))),
        "{stale:?}"
    );
    let split = wait_for_event(&mut events, WAIT, |e| {
        matches!(e, Event::SplitStarted { .. })
    })
    .await;
    assert_eq!(
        split,
        Event::SplitStarted {
            topic: topic.clone(),
            partition: 0,
            epoch: 2,
            from: 50,
            boundary: 500
        }
    );
    let first = support::next_delivery(&consumer, WAIT).await;
    assert_eq!(first.offset, 50, "processing restarts at the reset offset");
    assert!(side_value(&kafka, "__catchup_side", &side_key).is_some_and(|v| v.contains("e=2")));
    consumer.close().await.expect("close");
}
