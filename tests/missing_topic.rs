//! A subscribed topic that does not exist is an error the application sees: `recv` returns
//! `Error::TopicMissing` naming it (once the cluster's metadata confirms it; subscribing again
//! once it exists goes on), and
//! `catchup run` exits 1 with one line naming it — before, it waited forever (or exited 0
//! with "processed 0 record(s)") among librdkafka ERROR lines.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use catchup::{CatchupConsumer, Error, Mode};
use support::cli::wait_with_deadline;
use support::{Kafka, test_config, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_reports_a_topic_that_does_not_exist() {
    let kafka = Kafka::connect();
    let topic = unique("never-created");
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = CatchupConsumer::new(
        &kafka.consumer_config(&unique("missing-topic-group")),
        test_config(dir.path(), Mode::Ordered, 100),
    )
    .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let result = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
        .await
        .expect("recv reports the missing topic within 30 s");
    match result {
        Err(Error::TopicMissing { topic: named }) => assert_eq!(named, topic),
        other => panic!("expected TopicMissing, got {other:?}"),
    }

    // Created and subscribed again: the consumer goes on.
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 5).await;
    consumer.subscribe(&[&topic]).expect("subscribe again");
    let delivery = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
        .await
        .expect("a record once the topic exists")
        .expect("recv after subscribing again");
    assert_eq!((&*delivery.topic, delivery.offset), (topic.as_str(), 0));
}

/// The stream goes on after a missing topic, as rdkafka's `MessageStream` goes on after an
/// error: it yields `TopicMissing` once, yields nothing more while nothing changed (no loop
/// on the same error), delivers once the application subscribed again, and ends after the
/// consumer closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_goes_on_after_a_missing_topic() {
    use futures::StreamExt;

    let kafka = Kafka::connect();
    let topic = unique("created-late");
    let dir = tempfile::tempdir().expect("tempdir");
    let consumer = CatchupConsumer::new(
        &kafka.consumer_config(&unique("missing-topic-stream")),
        test_config(dir.path(), Mode::Ordered, 100),
    )
    .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut stream = consumer.stream();
    match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
        Ok(Some(Err(error @ Error::TopicMissing { .. }))) => {
            assert!(error.is_recoverable());
            assert!(error.to_string().contains(&topic), "{error}");
        }
        other => panic!("expected TopicMissing from the stream, got {other:?}"),
    }
    // Nothing changed: the stream neither ends nor repeats the error.
    let quiet = tokio::time::timeout(Duration::from_secs(2), stream.next()).await;
    assert!(
        quiet.is_err(),
        "after TopicMissing the stream gave {quiet:?}"
    );

    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 5).await;
    consumer.subscribe(&[&topic]).expect("subscribe again");
    let mut offsets = Vec::new();
    while offsets.len() < 5 {
        match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
            Ok(Some(Ok(delivery))) => {
                consumer.ack(&delivery);
                offsets.push(delivery.offset);
            }
            other => panic!("expected a record once the topic exists, got {other:?}"),
        }
    }
    assert_eq!(offsets, [0, 1, 2, 3, 4]);

    consumer.close().await.expect("close");
    assert!(matches!(stream.next().await, Some(Err(Error::Closed))));
    assert!(
        stream.next().await.is_none(),
        "the stream ends after Closed"
    );
}

#[test]
fn catchup_run_exits_1_with_one_line_naming_the_topic() {
    let kafka = Kafka::connect();
    let topic = unique("never-created");
    let dir = tempfile::tempdir().expect("tempdir");
    let child = Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args([
            "run",
            "--brokers",
            &kafka.bootstrap,
            "--group",
            &unique("missing-topic-cli"),
            "--topic",
            &topic,
            "--discard",
            "--buffer-dir",
            &dir.path().join("buffer").display().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = wait_with_deadline(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines,
        [format!("catchup: topic {topic} does not exist")],
        "one line, naming the topic"
    );
}
