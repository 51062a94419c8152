//! A topic the broker stores zstd-compressed (`compression.type=zstd` recompresses whatever
//! the producer sent): the default build (feature `zstd`) reads it through both lanes. A
//! build without the codec gets each batch back as an error, and librdkafka moves past it;
//! refetching from the buffer's position would meet the same batch round after round, so
//! such a build stops with `Error::Undecodable` instead (run with
//! `--no-default-features --features cli`).

mod support;

use std::time::Duration;

use catchup::{CatchupConfig, CatchupConsumer, Mode};
use support::{Kafka, catchup_consumer, unique};

const RECORDS: usize = 2_000;
const WAIT: Duration = Duration::from_secs(30);

/// A consumer in `mode` of a group committed at the start of a one-partition topic of
/// `RECORDS` records stored zstd-compressed: in `ordered` the backlog goes through the
/// catch-up consumer, in `off` through the group member. Its buffer directory too.
async fn zstd_backlog(name: &str, mode: Mode) -> (CatchupConsumer, tempfile::TempDir) {
    let kafka = Kafka::connect();
    let topic = unique(name);
    kafka
        .create_topic_with(&topic, 1, &[("compression.type", "zstd")])
        .await;
    kafka.produce_keyed(&topic, 0, &records()).await;
    let group = unique(&format!("{name}-group"));
    kafka.commit_as_operator(&group, &topic, &[0]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = CatchupConfig::new(dir.path()).mode(mode).min_lag(100);
    let consumer = catchup_consumer(&kafka, &group, config);
    consumer.subscribe(&[&topic]).expect("subscribe");
    (consumer, dir)
}

fn records() -> Vec<(String, String)> {
    (0..RECORDS)
        .map(|offset| (format!("key-{offset}"), format!("value-{offset}")))
        .collect()
}

#[cfg(feature = "zstd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zstd_topic_is_read_through_both_lanes() {
    for (name, mode) in [("zstd-off", Mode::Off), ("zstd-ordered", Mode::Ordered)] {
        let (consumer, _dir) = zstd_backlog(name, mode).await;
        for (offset, (key, value)) in records().into_iter().enumerate() {
            let delivery = tokio::time::timeout(WAIT, consumer.recv())
                .await
                .unwrap_or_else(|_| panic!("{mode:?}: offset {offset} not delivered in time"))
                .unwrap_or_else(|err| panic!("{mode:?}: offset {offset}: {err}"));
            assert_eq!(delivery.offset, offset as i64, "{mode:?}");
            assert_eq!(delivery.key.as_deref(), Some(key.as_bytes()), "{mode:?}");
            assert_eq!(
                delivery.payload.as_deref(),
                Some(value.as_bytes()),
                "{mode:?}"
            );
            consumer.ack(&delivery);
        }
        consumer.close().await.expect("close");
    }
}

#[cfg(not(feature = "zstd"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_codec_the_consumer_stops_with_a_clear_error() {
    for (name, mode) in [("zstd-off", Mode::Off), ("zstd-ordered", Mode::Ordered)] {
        let (consumer, _dir) = zstd_backlog(name, mode).await;
        let outcome = tokio::time::timeout(WAIT, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: neither a record nor an error in time"));
        match outcome {
            Err(err @ catchup::Error::Undecodable { .. }) => {
                eprintln!("{mode:?}: {err}");
                assert!(err.to_string().contains("zstd"), "{mode:?}: {err}");
                assert!(!err.is_recoverable(), "{mode:?}");
            }
            Err(other) => panic!("{mode:?}: expected Error::Undecodable, got {other}"),
            Ok(delivery) => panic!(
                "{mode:?}: offset {} delivered by a build without zstd",
                delivery.offset
            ),
        }
        let stopped = consumer.recv().await;
        assert!(
            matches!(stopped, Err(catchup::Error::Undecodable { .. })),
            "{mode:?}: the error stays: {stopped:?}"
        );
        let _ = consumer.close().await;
    }
}
