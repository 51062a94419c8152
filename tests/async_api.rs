//! The async API leaves the runtime free: `connect` opens the consumer on tokio's blocking
//! threads, `subscribe` returns at once (what the member's client refuses comes through
//! `recv`, and a new subscription clears it), requests are awaited, not waited for.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use catchup::{CatchupConsumer, Error, Mode};
use support::{Backlog, Kafka, unique};

const WAIT: Duration = Duration::from_secs(60);

/// On a runtime of one thread, a task keeps running while `connect` waits on the brokers:
/// here until they refuse a wrong password (a TLS handshake and a SASL exchange away, far
/// longer than the task's five short sleeps). A blocking open would hold the only thread
/// until it returned, and the task would not have ticked.
#[tokio::test(flavor = "current_thread")]
async fn connect_leaves_the_runtime_free() {
    let client = support::secure_client(
        &unique("async-connect"),
        &[("sasl.password", "not-the-password")],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Ordered, 10);
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticks.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let opened = tokio::time::timeout(WAIT, CatchupConsumer::connect(&client, config))
        .await
        .expect("connect answers in time");
    let ticks_while_connecting = ticks.load(Ordering::SeqCst);
    assert!(
        matches!(opened, Err(Error::Refused { .. })),
        "{:?}",
        opened.err()
    );
    assert_eq!(
        ticks_while_connecting, 5,
        "the runtime's only thread was held while connecting"
    );
    ticker.await.expect("ticker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_returns_at_once_and_recv_reports_what_the_client_refused() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("async-subscribe", 1, 10).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = support::test_config(dir.path(), Mode::Ordered, 1_000).auto_ack(true);
    let consumer = CatchupConsumer::connect(&kafka.consumer_config(&group), config)
        .await
        .expect("consumer");

    for malformed in [&[][..], &["has space"][..], &["^"][..]] {
        assert!(
            matches!(consumer.subscribe(malformed), Err(Error::Config(_))),
            "{malformed:?} accepted"
        );
    }
    // A pattern librdkafka cannot compile: `subscribe` does not wait to hear it.
    consumer
        .subscribe(&["^catchup-[unclosed"])
        .expect("subscribe");
    match tokio::time::timeout(WAIT, consumer.recv()).await {
        Ok(Err(Error::Subscription { reason })) => {
            assert!(
                reason.contains("subscribing to ^catchup-[unclosed"),
                "{reason}"
            )
        }
        other => panic!("expected the refused subscription from recv, got {other:?}"),
    }
    // A new subscription clears it.
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut offsets = Vec::new();
    while offsets.len() < 10 {
        let delivery = support::next_delivery(&consumer, WAIT).await;
        offsets.push(delivery.offset);
    }
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
    consumer.commit().await.expect("commit");
    consumer.close().await.expect("close");
    assert_eq!(kafka.committed(&group, &topic, 1), [Some(10)]);
}
