//! Through the test broker's SASL_SSL listener only (TLS with the broker's own CA, then
//! SCRAM-SHA-512, PLAIN or an OAUTHBEARER token from the application's hooks): the group
//! member, the catch-up consumer, the side-log admin, producer and reader all authenticate,
//! since the consumer never hears of the plaintext listener. Refused credentials reach the
//! application as a typed error, and `catchup run` connects from a properties file alone.

mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use catchup::{CatchupConsumer, ClientHooks, DeliveryLane, Error, Event, Mode};
use rdkafka::client::OAuthToken;
use support::cli::wait_with_deadline;
use support::{Backlog, Kafka, secure_client, side_value, unique, wait_for_event};

const WAIT: Duration = Duration::from_secs(60);

/// The proposal's example over the secure listener: 120 records, the group committed at 70,
/// a split at 120 (the side-log producer writes its entry), the catch-up consumer fetches
/// 70..119, the member 120..124, the merge commits 125. The side topic is new, so the side
/// log's admin client creates it through the same listener. Returns the consumer, open, and
/// its buffer directory.
async fn round_trip(
    overrides: &[(&str, &str)],
    hooks: Option<Arc<dyn ClientHooks>>,
) -> (CatchupConsumer, tempfile::TempDir) {
    let kafka = Kafka::connect();
    let topic = unique("secure");
    kafka.create_topic(&topic, 1).await;
    kafka.produce(&topic, 1, 120).await;
    let group = unique("secure-group");
    kafka.commit_as_operator(&group, &topic, &[70]);
    let side_topic = unique("secure-side");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config =
        support::test_config(dir.path(), Mode::Ordered, 10).side_topic(side_topic.clone());
    if let Some(hooks) = hooks {
        config = config.hooks(hooks);
    }
    let consumer = CatchupConsumer::connect(&secure_client(&group, overrides), config)
        .await
        .expect("consumer");
    let (mut events, split) = support::subscribe_until_split(&consumer, &topic).await;
    assert!(
        matches!(
            split,
            Event::SplitStarted {
                from: 70,
                boundary: 120,
                ..
            }
        ),
        "{split:?}"
    );
    assert!(
        side_value(&kafka, &side_topic, &format!("{group}/{topic}/0")).is_some(),
        "the side-log producer wrote the split's entry"
    );
    kafka.produce_from(&topic, 1, 120, 5).await;
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
        .map(|offset| (offset, DeliveryLane::Catchup))
        .chain((120..125).map(|offset| (offset, DeliveryLane::Live)))
        .collect();
    assert_eq!(delivered, expected);
    wait_for_event(&mut events, WAIT, |e| matches!(e, Event::Merged { .. })).await;
    consumer.commit().await.expect("commit");
    assert_eq!(kafka.committed(&group, &topic, 1), vec![Some(125)]);
    (consumer, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sha_512_round_trip() {
    let (consumer, _dir) = round_trip(&[], None).await;
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_round_trip() {
    let (consumer, _dir) = round_trip(&[("sasl.mechanism", "PLAIN")], None).await;
    consumer.close().await.expect("close");
}

/// Hands out unsecured tokens (what the broker's default OAUTHBEARER validator accepts),
/// valid for [`TOKEN_LIFETIME`], and counts the requests of each client role.
#[derive(Default)]
struct UnsecuredTokens {
    asked_by: Mutex<BTreeMap<String, usize>>,
    /// The group member's requests, to wait on.
    live_requests: tokio::sync::watch::Sender<usize>,
    /// Set: the identity provider is down, no token is handed out.
    withheld: AtomicBool,
}

/// Short enough that the clients ask again during the test (librdkafka refreshes at 80 %).
const TOKEN_LIFETIME: Duration = Duration::from_secs(5);

impl ClientHooks for UnsecuredTokens {
    fn oauth_token(
        &self,
        role: &str,
        _oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        *self
            .asked_by
            .lock()
            .map_err(|_| "poisoned")?
            .entry(role.to_owned())
            .or_default() += 1;
        if role == "live" {
            self.live_requests.send_modify(|requests| *requests += 1);
        }
        if self.withheld.load(Ordering::SeqCst) {
            return Err("the identity provider is down".into());
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
        let expires = now + TOKEN_LIFETIME;
        let header = base64url(br#"{"alg":"none"}"#);
        let claims = base64url(
            format!(
                r#"{{"sub":"catchup","iat":{},"exp":{}}}"#,
                now.as_secs(),
                expires.as_secs()
            )
            .as_bytes(),
        );
        Ok(OAuthToken {
            // An unsecured JWS: header, claims and an empty signature.
            token: format!("{header}.{claims}."),
            principal_name: "catchup".into(),
            lifetime_ms: i64::try_from(expires.as_millis())?,
        })
    }
}

/// Base64url without padding (RFC 7515), for the token above.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(bits >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[test]
fn base64url_matches_rfc_4648_vectors() {
    for (input, encoded) in [
        ("", ""),
        ("f", "Zg"),
        ("fo", "Zm8"),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg"),
        ("fooba", "Zm9vYmE"),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64url(input.as_bytes()), encoded);
    }
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_tokens_from_the_hooks() {
    let tokens = Arc::new(UnsecuredTokens::default());
    let (consumer, _dir) = round_trip(
        &[("sasl.mechanism", "OAUTHBEARER")],
        Some(tokens.clone() as Arc<dyn ClientHooks>),
    )
    .await;
    let asked_by = tokens.asked_by.lock().expect("lock").clone();
    // The side topic was new: the probe found it missing and the admin client created it.
    for role in [
        "live",
        "catchup",
        "side-probe",
        "side-admin",
        "side-producer",
        "side-reader",
    ] {
        assert!(
            asked_by.contains_key(role),
            "{role} asked for no token: {asked_by:?}"
        );
    }
    // Before its token expires the group member asks again, from its own polls.
    let mut live_requests = tokens.live_requests.subscribe();
    tokio::time::timeout(WAIT, live_requests.wait_for(|requests| *requests >= 2))
        .await
        .expect("the group member refreshed its token in time")
        .expect("watch");
    consumer.close().await.expect("close");
}

/// The broker ends each OAUTHBEARER session with its token: once the hook stops handing
/// tokens out, no request gets through, and after the grace `recv` says so (librdkafka alone
/// would retry for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_stop_coming_end_in_refused_from_recv() {
    let tokens = Arc::new(UnsecuredTokens::default());
    let (consumer, _dir) = round_trip(
        &[("sasl.mechanism", "OAUTHBEARER")],
        Some(tokens.clone() as Arc<dyn ClientHooks>),
    )
    .await;
    tokens.withheld.store(true, Ordering::SeqCst);
    let withheld_at = tokio::time::Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            if let Err(error) = consumer.recv().await {
                break error;
            }
        }
    })
    .await
    .expect("the consumer stopped in time");
    match &stopped {
        Error::Refused { reason } => {
            assert!(reason.contains("the identity provider is down"), "{reason}")
        }
        other => panic!("expected Error::Refused, got {other}"),
    }
    assert!(
        withheld_at.elapsed() >= catchup::plan::REFUSAL_GRACE,
        "stopped before the grace"
    );
    // Tokens again: the refusal stays final, and the consumer still closes cleanly.
    tokens.withheld.store(false, Ordering::SeqCst);
    assert!(matches!(consumer.recv().await, Err(Error::Refused { .. })));
    tokio::time::timeout(WAIT, consumer.close())
        .await
        .expect("closed in time")
        .expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_through_the_api() {
    let group = unique("secure-refused");
    let dir = tempfile::tempdir().expect("tempdir");
    let client = secure_client(&group, &[("sasl.password", "not-the-password")]);
    let config = support::test_config(dir.path(), Mode::Ordered, 10);
    // Opening checks the side topic: the refusal is what it reports, not a timeout.
    let opened = tokio::time::timeout(WAIT, CatchupConsumer::connect(&client, config))
        .await
        .expect("the refusal reported in time");
    match opened {
        Err(Error::Refused { reason }) => assert!(
            reason.contains("Authentication failed") || reason.contains("authentication"),
            "{reason}"
        ),
        Err(other) => panic!("expected Error::Refused, got {other}"),
        Ok(_) => panic!("a consumer opened with a wrong password"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_run_connects_from_a_properties_file() {
    let kafka = Kafka::connect();
    let Backlog { topic, group, .. } = kafka.backlog("secure-cli", 1, 30).await;
    let temp = tempfile::tempdir().expect("tempdir");
    let child = Command::new(env!("CARGO_BIN_EXE_catchup"))
        // No --brokers: the file's bootstrap.servers (the SASL_SSL listener) is all it has.
        .env_remove("CATCHUP_BROKERS")
        .args([
            "run",
            "--group",
            &group,
            "--topic",
            &topic,
            "--buffer-dir",
            &temp.path().join("buffer").display().to_string(),
            "--config-file",
            &support::secure_properties_file().display().to_string(),
            "--side-topic",
            &unique("secure-cli-side"),
            "--sink",
            "-",
            "--exit-when-idle",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let output = wait_with_deadline(child, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr: {stderr}");
    let offsets: Vec<i64> = support::cli::stdout_lines(&output)
        .iter()
        .map(|line| line["offset"].as_i64().expect("offset"))
        .collect();
    assert_eq!(offsets, (0..30).collect::<Vec<_>>());
    assert_eq!(kafka.committed(&group, &topic, 1), [Some(30)]);
}
