//! `recv_many` hands out runs of the records `recv` would hand out, in the same order, each
//! run under one lock; with `auto_ack` a run counts as processed when it is handed out, and
//! `ack_many` acknowledges a run by hand. Two lives over one group on a real broker: the
//! first acknowledges its runs by hand and closes mid-way, the second auto-acks the rest;
//! together they see every record once per partition, in order, and the group's commit
//! is exactly what was handed out and acknowledged.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use catchup::{CatchupConsumer, Delivery, Error, Mode};
use support::{Kafka, catchup_consumer, unique};

const PARTITIONS: i32 = 2;
const PER_PARTITION: i64 = 1_500;
/// The most records a run may hold.
const LIMIT: usize = 64;
/// Records the first life takes (and acknowledges) before it closes.
const FIRST_LIFE: usize = 1_000;
const WAIT: Duration = Duration::from_secs(60);

/// One run, checked against `LIMIT`, and each record against the next offset expected of its
/// partition (`next`): in order, nothing skipped, nothing twice.
async fn take_run(
    consumer: &CatchupConsumer,
    topic: &str,
    next: &mut BTreeMap<i32, i64>,
    limit: usize,
) -> Vec<Delivery> {
    let mut run = Vec::new();
    let appended = tokio::time::timeout(WAIT, consumer.recv_many(&mut run, limit))
        .await
        .unwrap_or_else(|_| panic!("no run within {WAIT:?}"))
        .expect("recv_many");
    assert_eq!(appended, run.len(), "the count is what was appended");
    assert!(
        (1..=limit).contains(&appended),
        "a run of {appended} records, limit {limit}"
    );
    for delivery in &run {
        let expected = next.entry(delivery.partition).or_insert(0);
        assert_eq!(
            delivery.offset, *expected,
            "partition {}: offset {} where {} was next",
            delivery.partition, delivery.offset, expected
        );
        let index = (delivery.offset * PARTITIONS as i64 + delivery.partition as i64) as usize;
        let (key, payload) = support::key_and_payload(topic, index);
        assert_eq!(
            (delivery.key.as_deref(), delivery.payload.as_deref()),
            (Some(&key[..]), Some(&payload[..])),
            "partition {} offset {}: the record produced there",
            delivery.partition,
            delivery.offset
        );
        *expected += 1;
    }
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_recvs_records_in_order_and_commit_exactly_what_was_acknowledged() {
    let kafka = Kafka::connect();
    let topic = unique("recv-many");
    kafka.create_topic(&topic, PARTITIONS).await;
    kafka
        .produce(
            &topic,
            PARTITIONS,
            (PARTITIONS as i64 * PER_PARTITION) as usize,
        )
        .await;
    let group = unique("recv-many-group");
    kafka.commit_as_operator(&group, &topic, &[0, 0]);
    let mut next = BTreeMap::new();

    // First life: runs acknowledged by hand with `ack_many`, in `Ordered` (the backlog is
    // split off: both lanes feed the runs).
    let dir_a = tempfile::tempdir().expect("tempdir");
    let first = catchup_consumer(
        &kafka,
        &group,
        support::test_config(dir_a.path(), Mode::Ordered, 100),
    );
    first.subscribe(&[&topic]).expect("subscribe");
    let mut empty = Vec::new();
    assert_eq!(
        first.recv_many(&mut empty, 0).await.expect("limit 0"),
        0,
        "a limit of 0 takes nothing and does not wait"
    );
    let mut taken = 0;
    while taken < FIRST_LIFE {
        let run = take_run(&first, &topic, &mut next, LIMIT.min(FIRST_LIFE - taken)).await;
        taken += run.len();
        first.ack_many(&run);
    }
    first.close().await.expect("close");
    let committed: i64 = kafka
        .committed(&group, &topic, PARTITIONS)
        .iter()
        .map(|c| c.expect("committed"))
        .sum();
    assert_eq!(
        committed, FIRST_LIFE as i64,
        "the commit is exactly the runs acknowledged"
    );
    let after_close = first.recv_many(&mut Vec::new(), LIMIT).await;
    assert!(
        matches!(after_close, Err(Error::Closed)),
        "a closed consumer says so: {after_close:?}"
    );

    // Second life, fresh buffer, `auto_ack`: resumes at the commit (`next` expects exactly
    // that), and its runs count as processed when handed out.
    let dir_b = tempfile::tempdir().expect("tempdir");
    let second = catchup_consumer(
        &kafka,
        &group,
        support::test_config(dir_b.path(), Mode::Off, 100).auto_ack(true),
    );
    second.subscribe(&[&topic]).expect("subscribe");
    let total = (PARTITIONS as i64 * PER_PARTITION) as usize;
    while taken < total {
        taken += take_run(&second, &topic, &mut next, LIMIT).await.len();
    }
    assert_eq!(taken, total, "no run went past the records produced");
    assert_eq!(second.unacked(), 0, "auto_ack acknowledged every run");
    second.close().await.expect("close");
    assert_eq!(
        kafka.committed(&group, &topic, PARTITIONS),
        vec![Some(PER_PARTITION); PARTITIONS as usize],
        "everything handed out is committed at close"
    );
}
