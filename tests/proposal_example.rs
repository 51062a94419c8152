//! The proposal's example: commit at 70, crash, log end 120 on return → boundary 120,
//! catch-up lane exactly 70..119, live lane from 120.

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, DeliveryLane, Event, Mode};
use support::{Kafka, catchup_consumer, side_value, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

async fn setup(kafka: &Kafka) -> (String, String) {
    let topic = unique("proposal");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 120).await;
    let group = unique("proposal-group");
    kafka.commit_as_operator(&group, &topic, &[70]); // the crashed consumer's last commit
    (topic, group)
}

fn config(dir: &tempfile::TempDir, mode: Mode) -> CatchupConfig {
    support::test_config(dir.path(), mode, 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_delivers_the_backlog_then_live_and_merges() {
    let kafka = Kafka::connect();
    let (topic, group) = setup(&kafka).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = catchup_consumer(&kafka, &group, config(&dir, Mode::Ordered));
    let (mut events, split) = support::subscribe_until_split(&consumer, &topic).await;
    assert_eq!(
        split,
        Event::SplitStarted {
            topic: topic.clone(),
            partition: 0,
            epoch: 1,
            from: 70,
            boundary: 120
        }
    );
    assert!(
        side_value(&kafka, "__catchup_side", &format!("{group}/{topic}/0")).is_some(),
        "side entry written"
    );
    assert_eq!(
        kafka.committed(&group, &topic, 1),
        vec![Some(70)],
        "the split keeps G at 70"
    );

    kafka.produce_from(&topic, 1, 120, 5).await; // fresh records after the restart
    // The member holds 120..124 before the reader passes the boundary: read after the merge
    // (catch-up processed), they would be delivered as Plain.
    support::wait_until_buffered(&consumer, 1, 125).await;
    let mut delivered = Vec::new();
    while delivered.len() < 55 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        delivered.push((delivery.offset, delivery.lane));
        consumer.ack(&delivery);
    }
    let expected: Vec<(i64, DeliveryLane)> = (70..120)
        .map(|o| (o, DeliveryLane::Catchup))
        .chain((120..125).map(|o| (o, DeliveryLane::Live)))
        .collect();
    assert_eq!(
        delivered, expected,
        "strictly increasing: catch-up 70..119, then live from 120"
    );

    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&group, &topic, 1),
        vec![Some(125)],
        "after the merge G is the log end"
    );
    assert_eq!(
        side_value(&kafka, "__catchup_side", &format!("{group}/{topic}/0")),
        None,
        "side entry deleted"
    );
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_delivers_fresh_records_before_the_backlog_is_done() {
    let kafka = Kafka::connect();
    let (topic, group) = setup(&kafka).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = catchup_consumer(&kafka, &group, config(&dir, Mode::Concurrent));
    let (mut events, split) = support::subscribe_until_split(&consumer, &topic).await;
    assert!(
        matches!(split, Event::SplitStarted { boundary: 120, .. }),
        "{split:?}"
    );

    let mut catchup_seen = Vec::new();
    let mut live_seen = Vec::new();
    let mut produced_fresh = false;
    let mut fresh_before_backlog_done = false;
    while catchup_seen.len() < 50 || live_seen.is_empty() {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        match delivery.lane {
            DeliveryLane::Catchup => {
                catchup_seen.push(delivery.offset);
                if !produced_fresh {
                    kafka.produce_from(&topic, 1, 120, 1).await;
                    produced_fresh = true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await; // slow processing
            }
            DeliveryLane::Live => {
                live_seen.push(delivery.offset);
                fresh_before_backlog_done |= catchup_seen.len() < 50;
            }
            DeliveryLane::Plain => panic!("a split partition delivered a plain record"),
        }
        consumer.ack(&delivery);
    }
    assert_eq!(
        catchup_seen,
        (70..120).collect::<Vec<_>>(),
        "catch-up lane in order"
    );
    assert_eq!(live_seen, vec![120]);
    assert!(
        fresh_before_backlog_done,
        "the fresh record waited behind the backlog"
    );
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.commit().await.expect("commit");
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(121)]);
    consumer.close().await.expect("close");
}
