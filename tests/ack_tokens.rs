//! Acknowledging by `AckToken`, after the delivery itself was given away: the payloads move
//! into tasks, the tokens come back out of order, and the group's commits count exactly what
//! they acknowledged. `assignment()` names the partitions the member holds.

mod support;

use std::time::Duration;

use catchup::{AckToken, CatchupConsumer, Mode};
use support::{Kafka, catchup_consumer, test_config, unique};

const WAIT: Duration = Duration::from_secs(60);
const PER_PARTITION: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_acknowledge_what_moved_away() {
    let kafka = Kafka::connect();
    let topic = unique("ack-tokens");
    kafka.create_topic(&topic, 2).await;
    kafka.produce(&topic, 2, 2 * PER_PARTITION).await;
    let group = unique("ack-tokens-group");
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer: CatchupConsumer = catchup_consumer(
        &kafka,
        &group,
        test_config(dir.path(), Mode::Ordered, 1_000),
    );
    consumer.subscribe(&[&topic]).expect("subscribe");

    // Each payload moves into a task of its own; only the token comes back.
    let mut handlers = Vec::new();
    for _ in 0..2 * PER_PARTITION {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        let token = delivery.ack_token();
        let payload = delivery.payload;
        handlers.push(tokio::spawn(async move {
            assert!(payload.is_some_and(|p| !p.is_empty()));
            token
        }));
    }
    let mut tokens: Vec<AckToken> = Vec::new();
    for handler in handlers {
        tokens.push(handler.await.expect("handler"));
    }
    assert_eq!(
        consumer.assignment(),
        [(topic.clone(), 0), (topic.clone(), 1)],
        "the member holds both partitions"
    );

    // Everything but partition 0's first record, newest first: partition 0 commits nothing
    // (its first record is not processed), partition 1 all of it.
    let held_back = *tokens
        .iter()
        .find(|t| t.partition() == 0 && t.offset() == 0)
        .expect("partition 0's first record");
    for token in tokens.iter().rev().filter(|t| **t != held_back) {
        consumer.ack(*token);
    }
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        [None, Some(PER_PARTITION as i64)]
    );

    consumer.ack(held_back);
    consumer.commit().await.expect("commit");
    assert_eq!(
        kafka.committed(&group, &topic, 2),
        [Some(PER_PARTITION as i64), Some(PER_PARTITION as i64)]
    );
    consumer.close().await.expect("close");
}
