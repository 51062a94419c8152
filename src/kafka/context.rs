//! What catchup's clients tell about the brokers: one WARN when none can be reached (naming
//! the last connection that failed) and one INFO when they are back — not an ERROR at every retry of each of the clients —
//! with events and a counter; librdkafka's log lines at levels that match what they mean.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::ClientConfig;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::engine::BrokerHealth;

/// How a client-wide error is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// No broker can be reached (the client retries by itself).
    AllDown,
    /// A connection to one broker failed (others may answer; the client retries).
    ConnectionFailed,
    /// An unknown topic: confirmed and reported through `recv` by the live thread.
    UnknownTopic,
    /// The brokers refused the client's credentials (SASL), or no OAUTHBEARER token could
    /// be had: librdkafka retries for ever; the consumer stops if it lasts (`plan::Refusal`).
    AuthenticationFailed,
    /// A signal of the fetch path that the fetchers act on themselves: an end of partition
    /// (the catch-up consumer asks for them), an offset out of range. Not an error to log.
    FetchSignal,
    /// Anything else.
    Other,
}

/// Classifies a client-wide error librdkafka reported.
pub(crate) fn classify_client_error(error: &KafkaError) -> ErrorClass {
    use RDKafkaErrorCode as Code;
    match error.rdkafka_error_code() {
        Some(Code::AllBrokersDown) => ErrorClass::AllDown,
        Some(
            Code::BrokerTransportFailure
            | Code::Resolve
            | Code::NetworkException
            | Code::BrokerNotAvailable,
        ) => ErrorClass::ConnectionFailed,
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic) => ErrorClass::UnknownTopic,
        Some(Code::Authentication | Code::SaslAuthenticationFailed) => {
            ErrorClass::AuthenticationFailed
        }
        Some(Code::PartitionEOF | Code::AutoOffsetReset | Code::OffsetOutOfRange) => {
            ErrorClass::FetchSignal
        }
        _ if matches!(error, KafkaError::PartitionEOF(_)) => ErrorClass::FetchSignal,
        _ => ErrorClass::Other,
    }
}

/// The rdkafka side of the health: what librdkafka reports, classified.
impl BrokerHealth {
    /// An OAUTHBEARER token for the client playing `role`, from the application's hooks.
    pub fn oauth_token(
        &self,
        role: &str,
        oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        let token = match self.hooks() {
            Some(hooks) => hooks.oauth_token(role, oauthbearer_config),
            None => Err(NO_TOKEN_HOOK.into()),
        };
        if let Err(error) = &token {
            self.token_failed(role, &error.to_string());
        }
        token
    }

    /// A client-wide error of the client playing `role`.
    pub fn on_error(&self, role: &str, error: KafkaError, reason: &str) {
        match classify_client_error(&error) {
            ErrorClass::AuthenticationFailed => {
                tracing::debug!(client = role, %error, reason, "librdkafka");
                self.authentication_failed(role, reason);
            }
            ErrorClass::ConnectionFailed => {
                tracing::debug!(client = role, %error, reason, "librdkafka");
                self.connection_failed(reason);
            }
            ErrorClass::AllDown => {
                tracing::debug!(client = role, %error, reason, "librdkafka");
                self.all_down(role, reason);
            }
            ErrorClass::UnknownTopic | ErrorClass::FetchSignal => {
                tracing::debug!(client = role, %error, reason, "librdkafka")
            }
            ErrorClass::Other => tracing::error!(client = role, %error, reason, "librdkafka"),
        }
    }

    /// A librdkafka log line of the client playing `role`. Connection failures (`FAIL`) are
    /// what `on_error` reports once per state change: DEBUG here.
    pub fn on_log(&self, role: &str, level: RDKafkaLogLevel, facility: &str, message: &str) {
        use RDKafkaLogLevel as Level;
        match level {
            _ if facility == "FAIL" => tracing::debug!(client = role, facility, "{message}"),
            Level::Emerg | Level::Alert | Level::Critical | Level::Error => {
                tracing::error!(client = role, facility, "{message}")
            }
            Level::Warning => tracing::warn!(client = role, facility, "{message}"),
            Level::Notice | Level::Info => tracing::info!(client = role, facility, "{message}"),
            Level::Debug => tracing::debug!(client = role, facility, "{message}"),
        }
    }
}

/// The context of catchup's own clients (the catch-up consumer, the side log's producer,
/// reader and admin client): their errors and logs go through the consumer's
/// [`BrokerHealth`].
#[derive(Clone)]
pub(crate) struct RoleContext {
    health: Arc<BrokerHealth>,
    role: &'static str,
    /// This client reported that no broker can be reached, since the last
    /// [`take_down_report`](Self::take_down_report).
    down_reported: Arc<AtomicBool>,
}

impl RoleContext {
    pub fn new(health: Arc<BrokerHealth>, role: &'static str) -> Self {
        Self {
            health,
            role,
            down_reported: Arc::default(),
        }
    }

    /// Whether this client reported that no broker can be reached since the last call
    /// (`kafka::Rebootstrap::follow` counts it for this client alone).
    pub fn take_down_report(&self) -> bool {
        self.down_reported.swap(false, Ordering::Relaxed)
    }
}

impl ClientContext for RoleContext {
    /// Tokens come from the application's hooks (see `ClientHooks::oauth_token`).
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.health.oauth_token(self.role, oauthbearer_config)
    }

    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.health.on_log(self.role, level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if classify_client_error(&error) == ErrorClass::AllDown {
            self.down_reported.store(true, Ordering::Relaxed);
        }
        self.health.on_error(self.role, error, reason);
    }

    /// Statistics are not logged (rdkafka's default prints the whole report at INFO).
    fn stats_raw(&self, statistics: &[u8]) {
        self.health.on_statistics(self.role, statistics);
    }
}

impl ConsumerContext for RoleContext {}

/// What an OAUTHBEARER client without a token hook says.
const NO_TOKEN_HOOK: &str = "sasl.mechanism=OAUTHBEARER needs a token: give CatchupConfig::hooks a ClientHooks::oauth_token, or let librdkafka fetch tokens with sasl.oauthbearer.method=oidc";

/// Whether `config` has the application hand OAUTHBEARER tokens to the clients (rather than
/// librdkafka's own OIDC fetcher). Without SASL in `security.protocol` the mechanism is
/// never used.
pub(crate) fn tokens_from_hooks(config: &ClientConfig) -> bool {
    let protocol = config.get("security.protocol").unwrap_or("plaintext");
    let mechanism = config
        .get("sasl.mechanism")
        .or_else(|| config.get("sasl.mechanisms"))
        .unwrap_or_default();
    let method = config.get("sasl.oauthbearer.method").unwrap_or("default");
    protocol.to_ascii_lowercase().starts_with("sasl_")
        && mechanism.eq_ignore_ascii_case("OAUTHBEARER")
        && !method.eq_ignore_ascii_case("oidc")
}

/// Whether catchup can run its clients with these OAUTHBEARER settings: its contexts take
/// tokens from the hooks, which rules out librdkafka's unsecured-token builder (the two are
/// exclusive) and needs hooks to ask.
pub(crate) fn check_token_settings(config: &ClientConfig, has_hooks: bool) -> Result<(), String> {
    if !tokens_from_hooks(config) {
        return Ok(());
    }
    // librdkafka's booleans: true, t, 1 (any case).
    if config
        .get("enable.sasl.oauthbearer.unsecure.jwt")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "t" | "1"))
    {
        return Err("enable.sasl.oauthbearer.unsecure.jwt is not supported: catchup's clients take OAUTHBEARER tokens from ClientHooks::oauth_token (it may return an unsecured token)".into());
    }
    if !has_hooks {
        return Err(NO_TOKEN_HOOK.into());
    }
    Ok(())
}

/// Creates a consumer and serves the first event librdkafka queued at its creation — with
/// OAUTHBEARER the first token request, queued ahead of everything else — so that a
/// blocking request made before its first poll (metadata, watermarks, committed offsets)
/// does not wait for a token nobody asked for.
pub(crate) fn create_consumer<C: ConsumerContext>(
    config: &ClientConfig,
    context: C,
) -> rdkafka::error::KafkaResult<BaseConsumer<C>> {
    let consumer: BaseConsumer<C> = config.create_with_context(context)?;
    // Nothing is assigned yet: nothing but events can come out.
    let _ = consumer.poll(std::time::Duration::ZERO);
    Ok(consumer)
}

/// `config` for the client playing `role`: its `client.id` (the user's, `rdkafka` by
/// default) ends in the role, so that broker logs and quotas tell the clients apart.
pub(crate) fn for_role(config: &ClientConfig, role: &str) -> ClientConfig {
    let mut config = config.clone();
    let base = config.get("client.id").unwrap_or("rdkafka").to_owned();
    config.set("client.id", format!("{base}-{role}"));
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::types::Event;
    use tokio::sync::broadcast;

    #[test]
    fn client_errors_table() {
        use RDKafkaErrorCode as Code;
        for (code, class) in [
            (Code::AllBrokersDown, ErrorClass::AllDown),
            (Code::BrokerTransportFailure, ErrorClass::ConnectionFailed),
            (Code::Resolve, ErrorClass::ConnectionFailed),
            (Code::UnknownTopicOrPartition, ErrorClass::UnknownTopic),
            (Code::UnknownTopic, ErrorClass::UnknownTopic),
            (
                Code::SaslAuthenticationFailed,
                ErrorClass::AuthenticationFailed,
            ),
            (Code::Authentication, ErrorClass::AuthenticationFailed),
            (Code::PartitionEOF, ErrorClass::FetchSignal),
            (Code::AutoOffsetReset, ErrorClass::FetchSignal),
            (Code::OffsetOutOfRange, ErrorClass::FetchSignal),
            (Code::Fatal, ErrorClass::Other),
        ] {
            let error = KafkaError::Global(code);
            assert_eq!(classify_client_error(&error), class, "{code:?}");
        }
        // What the catch-up consumer's fetch queues report at each end of partition.
        assert_eq!(
            classify_client_error(&KafkaError::PartitionEOF(3)),
            ErrorClass::FetchSignal
        );
    }

    /// Counts the events logged at ERROR while it is the default subscriber.
    struct ErrorLines(Arc<std::sync::atomic::AtomicUsize>);

    impl tracing::Subscriber for ErrorLines {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::ERROR {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// A healthy run prints no ERROR line: the ends of partition the catch-up consumer asks
    /// for, and out-of-range errors the fetchers act on, are not errors to log.
    #[test]
    fn fetch_signals_are_not_logged_as_errors() {
        let health = BrokerHealth::new("g", None);
        let count = |error: KafkaError| {
            let lines = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            tracing::subscriber::with_default(ErrorLines(lines.clone()), || {
                health.on_error("catchup", error, "reported by librdkafka")
            });
            lines.load(std::sync::atomic::Ordering::Relaxed)
        };
        assert_eq!(count(KafkaError::Global(RDKafkaErrorCode::PartitionEOF)), 0);
        assert_eq!(count(KafkaError::PartitionEOF(3)), 0);
        assert_eq!(
            count(KafkaError::Global(RDKafkaErrorCode::AutoOffsetReset)),
            0
        );
        // What nothing handles still is one.
        assert_eq!(count(KafkaError::Global(RDKafkaErrorCode::Fatal)), 1);
    }

    /// A client's own "all brokers down" is kept for it (`Rebootstrap::follow`), whatever
    /// the consumer announces; a failed connection to one broker is not such a report.
    #[test]
    fn a_client_keeps_its_own_report_of_all_brokers_down() {
        let context = RoleContext::new(Arc::new(BrokerHealth::new("g", None)), "catchup");
        let report = |code| {
            context.error(
                KafkaError::Global(code),
                "127.0.0.1:1/bootstrap: Connect failed",
            )
        };
        report(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(!context.take_down_report());
        report(RDKafkaErrorCode::AllBrokersDown);
        report(RDKafkaErrorCode::AllBrokersDown);
        assert!(context.take_down_report());
        assert!(!context.take_down_report(), "taken once");
        // The group member's probe getting through ends the announcement, not this report.
        context.health.reached();
        report(RDKafkaErrorCode::AllBrokersDown);
        context.health.reached();
        assert!(context.take_down_report());
    }

    #[test]
    fn refused_credentials_are_announced_once_per_run_of_failures() {
        let health = BrokerHealth::new("g", None);
        let (events, mut received) = broadcast::channel(16);
        health.attach(events);
        assert!(!health.is_refusing());
        let failed = |role| {
            health.on_error(
                role,
                KafkaError::Global(RDKafkaErrorCode::Authentication),
                "SASL authentication error: invalid credentials",
            )
        };
        failed("live");
        failed("catchup");
        assert!(health.is_refusing());
        assert_eq!(health.refused(), None, "not final before the grace");
        assert!(matches!(received.try_recv(), Ok(Event::Error { .. })));
        assert!(received.try_recv().is_err(), "announced once");
        health.accepted();
        assert!(!health.is_refusing(), "a request got through");
        failed("live");
        assert!(matches!(received.try_recv(), Ok(Event::Error { .. })));
        // When a run of failures becomes final is `plan::Refusal`'s table.
    }

    #[test]
    fn token_settings_table() {
        let config = |pairs: &[(&str, &str)]| -> ClientConfig {
            pairs
                .iter()
                .map(|&(key, value)| (key.into(), value.into()))
                .collect()
        };
        let sasl = ("security.protocol", "SASL_SSL");
        let oauth = ("sasl.mechanism", "OAUTHBEARER");
        for (pairs, has_hooks, tokens, accepted) in [
            (vec![], false, false, true),
            (
                vec![sasl, ("sasl.mechanism", "SCRAM-SHA-512")],
                false,
                false,
                true,
            ),
            (vec![sasl, oauth], true, true, true),
            (
                vec![("security.protocol", "sasl_plaintext"), oauth],
                true,
                true,
                true,
            ),
            (
                vec![sasl, ("sasl.mechanisms", "oauthbearer")],
                true,
                true,
                true,
            ),
            (vec![sasl, oauth], false, true, false),
            // A mechanism left over while SASL is off is never used.
            (vec![oauth], false, false, true),
            (
                vec![("security.protocol", "SSL"), oauth],
                false,
                false,
                true,
            ),
            (
                vec![
                    sasl,
                    oauth,
                    ("enable.sasl.oauthbearer.unsecure.jwt", "true"),
                ],
                true,
                true,
                false,
            ),
            (
                vec![sasl, oauth, ("enable.sasl.oauthbearer.unsecure.jwt", "T")],
                true,
                true,
                false,
            ),
            (
                vec![sasl, oauth, ("sasl.oauthbearer.method", "oidc")],
                false,
                false,
                true,
            ),
        ] {
            let config = config(&pairs);
            assert_eq!(tokens_from_hooks(&config), tokens, "{pairs:?}");
            assert_eq!(
                check_token_settings(&config, has_hooks).is_ok(),
                accepted,
                "{pairs:?} hooks: {has_hooks}"
            );
        }
    }

    #[test]
    fn unreachable_is_announced_once_per_change() {
        let health = BrokerHealth::new("g", None);
        let (events, mut received) = broadcast::channel(16);
        health.attach(events);
        let failed = || {
            health.on_error(
                "live",
                KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
                "127.0.0.1:1/bootstrap: Connect failed",
            )
        };
        failed();
        assert!(
            !health.is_unreachable(),
            "one broker failing is not all of them"
        );
        for _ in 0..5 {
            failed();
            health.on_error(
                "live",
                KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
                "1/1 brokers are down",
            );
        }
        assert!(health.is_unreachable());
        health.reached();
        health.reached();
        assert!(!health.is_unreachable());
        let mut seen = Vec::new();
        while let Ok(event) = received.try_recv() {
            seen.push(event);
        }
        assert!(
            matches!(
                seen.as_slice(),
                [Event::BrokersUnreachable { reason }, Event::BrokersReachable]
                    if reason.contains("127.0.0.1:1")
            ),
            "{seen:?}"
        );
    }

    #[test]
    fn each_role_gets_its_own_client_id() {
        let mut user = ClientConfig::new();
        assert_eq!(
            for_role(&user, "catchup").get("client.id"),
            Some("rdkafka-catchup")
        );
        user.set("client.id", "orders");
        assert_eq!(
            for_role(&user, "side-producer").get("client.id"),
            Some("orders-side-producer")
        );
    }
}
