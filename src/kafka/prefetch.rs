//! How much each of catchup's consumers prefetches: librdkafka's queues sized from the byte
//! budget, so that one setting bounds the memory of both fetchers.
//!
//! librdkafka's defaults suit one consumer polled in a tight loop: up to 64 MiB and 100,000
//! messages prefetched per queue (per *partition* once its queue is split off, as the catch-up
//! fetcher does), and — since librdkafka 2.4 — a partition whose prefetch queue is full stops
//! fetching for `fetch.queue.backoff.ms`, one second by default. catchup's fetchers poll in
//! rounds and write to the buffer between them, so their queues are full for a moment again
//! and again: with the defaults the live lane idled through one-second backoffs and read
//! 130k records/s where a bare loop read 400k (and that loop, too, 1.6M with a short backoff),
//! and the catch-up consumer held 64 MiB per partition.
//!
//! Neither consumer lets the broker hold a fetch long (`FETCH_WAIT_MS`): a fetch of
//! partitions at their end kept every other partition waiting.
//!
//! A user's own setting of any of these keys wins.

use rdkafka::ClientConfig;

/// How long a partition whose prefetch queue is full waits before fetching again. The queue
/// drains in a few milliseconds; a long wait leaves the fetcher idle.
const QUEUE_BACKOFF_MS: u64 = 10;

/// Each consumer's prefetch may hold this fraction of the byte budget (16 MiB of the default
/// 256 MiB).
const BUDGET_SHARE: u64 = 16;

/// The least a queue prefetches, whatever the budget: one fetch of a partition
/// (`max.partition.fetch.bytes`' default).
const MIN_QUEUE_BYTES: u64 = 1 << 20;

/// The most a queue prefetches, whatever the budget: librdkafka's default (and its limit is
/// about 2 GiB).
const MAX_QUEUE_BYTES: u64 = 64 << 20;

/// How many queues the group member's partitions fetch into (`kafka::live::queues`), however
/// many are assigned: librdkafka's limits apply per queue, so this bounds the member's whole
/// prefetch. At eight partitions or fewer, each has a queue of its own.
pub(crate) const MEMBER_QUEUES: usize = 8;

/// How many queues the catch-up consumer's partitions fetch into (`kafka::fetch_queues`), as
/// [`MEMBER_QUEUES`] for the group member.
pub(crate) const CATCHUP_QUEUES: usize = 8;

/// The group member's fetch responses are this fraction of its share at most. A response's
/// buffer lives until the last of its messages is freed, so each of the member's queues may
/// keep one alive: what the queues hold can pin [`MEMBER_QUEUES`] responses. Alternating runs
/// of `off` over 2M records of 1 KiB:
///
/// * One partition's share per fetch (2 MiB) read 512–653k records/s against 634–685k with the
///   whole share, at 8 partitions.
/// * A quarter (4 MiB) read as fast as the whole share (16 MiB) at 8 partitions (2.0–2.1 s),
///   and at 64 partitions (5.4–5.7 s against 5.9–6.4), where it peaked at 111–138 MiB
///   against 181–190 (8 MiB: 165–170).
const MEMBER_FETCHES_PER_SHARE: u64 = 4;

/// Messages per prefetched KiB: librdkafka keeps a few hundred bytes beside each message,
/// so small records are bounded by count before their bytes add up.
const MESSAGES_PER_KIB: u64 = 1;

/// Messages per prefetched KiB of the group member's partitions. At one, a partition's queue
/// held 2,048 records of 100 B: drained in a couple of milliseconds, it fetched again only
/// after a backoff, and the member idled (`off` at 100 B fell from 70–85 % of the bare loop
/// to 38–59 %, with less CPU per record). Four per KiB read 95–100 % in the same runs, at a
/// peak RSS of 95 MiB; sixteen read no faster and held 135 MiB.
const MEMBER_MESSAGES_PER_KIB: u64 = 4;

/// The settings of the group member's consumer, whose partitions fetch into at most
/// [`MEMBER_QUEUES`] queues (`kafka::live::queues`): its share divided among them.
///
/// A fetch carries a quarter of the share (`fetch.max.bytes`, [`MEMBER_FETCHES_PER_SHARE`];
/// librdkafka would lower it to one queue's size).
///
/// It also waits at most [`FETCH_WAIT_MS`] for a fetch to find records.
pub(crate) fn member(budget_bytes: u64) -> Vec<(&'static str, String)> {
    let mut settings = settings(
        queue_bytes(budget_bytes, MEMBER_QUEUES as u64),
        MEMBER_MESSAGES_PER_KIB,
    );
    let fetch_bytes =
        (queue_bytes(budget_bytes, 1) / MEMBER_FETCHES_PER_SHARE).max(MIN_QUEUE_BYTES);
    settings.push(("fetch.max.bytes", fetch_bytes.to_string()));
    settings.push(("fetch.wait.max.ms", FETCH_WAIT_MS.to_string()));
    settings
}

/// The settings of the catch-up consumer, whose partitions fetch into at most
/// [`CATCHUP_QUEUES`] queues (`kafka::fetch_queues`): its share divided among them.
/// (librdkafka then lowers `fetch.max.bytes` to one queue's size: a whole fetch response
/// carries at most one queue's share. Raising it to the whole share read 1 KiB records
/// 10–30 % faster but doubled the peak RSS, so it stays.)
///
/// It also waits at most [`FETCH_WAIT_MS`] for a fetch to find records.
pub(crate) fn catchup(budget_bytes: u64) -> Vec<(&'static str, String)> {
    let mut settings = settings(
        queue_bytes(budget_bytes, CATCHUP_QUEUES as u64),
        MESSAGES_PER_KIB,
    );
    settings.push(("fetch.wait.max.ms", FETCH_WAIT_MS.to_string()));
    settings
}

/// How long the broker may hold a fetch that finds no records (librdkafka's default: 500
/// ms). librdkafka leaves a partition out of a fetch while the queue it fetches into is full.
/// So when the partitions whose queues had room all sat at their end, the fetch carried only
/// those, the broker held it, and librdkafka sends a broker its next fetch only once the last
/// one answered: every other partition waited behind it, its records still in Kafka.
///
/// * The catch-up consumer fetches what exists (its ranges end at the boundary, the log end at
///   assignment); a partition that has just fetched its last range is fetched once more at
///   its end before the fetcher lets it go. `catchup run --mode ordered` at 1 KiB went from
///   300–320k to 430–450k records/s with a wait of 50 ms (its queues stood empty 1.0–1.5 s
///   of a 3.5 s run; 0.04 s with 10 ms).
/// * The group member meets it whenever one of its partitions is caught up and another is
///   not, as on a topic whose partitions are of unequal length (`debug=fetch`: fetches of the
///   caught-up partition alone, answered 480–500 ms later). The bench's uneven topic
///   (`CATCHUP_BENCH_UNEVEN=1`, 2M records of 1 KiB) read in `off` at 14 % of the bare loop
///   with 500 ms, 48–52 % with 50, 79 % with 10 and 95 % with 1; `catchup run --mode off`
///   at 52k, 310k, 533k and 584k records/s.
///
/// 10 ms: a caught-up member then asks its brokers a hundred times a second, which cost the
/// broker no CPU it could measure (100–110 ms in 8 s idle, with 500 ms as with 10); 1 ms
/// would ask a thousand times.
const FETCH_WAIT_MS: u64 = 10;

/// Sets `settings` in `config` where the user did not. The two queue limits go together: a
/// user who set either keeps librdkafka's default for the other (mixing theirs with ours
/// would let the count cap what they sized by bytes).
///
/// A fetch size is left to librdkafka when the user set the largest response or message
/// (`receive.message.max.bytes`, `message.max.bytes`): librdkafka refuses a fetch size above
/// the one or below the other. And the fetch wait is left to librdkafka when the user set
/// `fetch.min.bytes`: a broker waits for that many bytes only as long as the wait allows, so
/// a short wait would undo the batching they asked for.
pub(crate) fn apply(config: &mut ClientConfig, settings: &[(&'static str, String)]) {
    let user_sized_queue = QUEUE_KEYS.iter().any(|key| config.get(key).is_some());
    let user_sized_response = ["receive.message.max.bytes", "message.max.bytes"]
        .iter()
        .any(|key| config.get(key).is_some());
    let user_batches_fetches = config.get("fetch.min.bytes").is_some();
    for (key, value) in settings {
        let theirs = (user_sized_queue && QUEUE_KEYS.contains(key))
            || (user_sized_response && *key == "fetch.max.bytes")
            || (user_batches_fetches && *key == "fetch.wait.max.ms");
        if config.get(key).is_none() && !theirs {
            config.set(*key, value);
        }
    }
}

/// librdkafka's defaults: the most one fetch brings of one partition, of all partitions,
/// what one queue prefetches (KiB), and the largest message.
const PARTITION_FETCH_BYTES: u64 = 1 << 20;
const FETCH_MAX_BYTES: u64 = 52_428_800;
const QUEUE_KIB: u64 = 65_536;
const MESSAGE_MAX_BYTES: u64 = 1_000_000;

/// The most one fetch brings of one partition with `config` (the consumer's, with
/// [`apply`]'s settings): `max.partition.fetch.bytes` (or its older name
/// `fetch.message.max.bytes`), within the whole response. The response is `fetch.max.bytes`
/// where set; otherwise librdkafka lowers its default to one queue
/// (`queued.max.messages.kbytes`), and never below the largest message
/// (`message.max.bytes`). Each is the user's or librdkafka's default; a value that does not
/// parse counts as the default (creating the client reports it). (A record batch larger than
/// this still comes whole when it is the first of a fetch.)
pub(crate) fn partition_fetch_bytes(config: &ClientConfig) -> u64 {
    let number = |key: &str| {
        config
            .get(key)
            .and_then(|value| value.trim().parse::<u64>().ok())
    };
    let partition = number("max.partition.fetch.bytes")
        .or_else(|| number("fetch.message.max.bytes"))
        .unwrap_or(PARTITION_FETCH_BYTES);
    let response = number("fetch.max.bytes").unwrap_or_else(|| {
        let queue = number("queued.max.messages.kbytes")
            .unwrap_or(QUEUE_KIB)
            .saturating_mul(1024);
        FETCH_MAX_BYTES
            .min(queue)
            .max(number("message.max.bytes").unwrap_or(MESSAGE_MAX_BYTES))
    });
    partition.min(response)
}

/// The keys that size a prefetch queue.
const QUEUE_KEYS: [&str; 2] = ["queued.max.messages.kbytes", "queued.min.messages"];

fn queue_bytes(budget_bytes: u64, queues: u64) -> u64 {
    (budget_bytes / BUDGET_SHARE / queues).clamp(MIN_QUEUE_BYTES, MAX_QUEUE_BYTES)
}

fn settings(queue_bytes: u64, messages_per_kib: u64) -> Vec<(&'static str, String)> {
    let kib = queue_bytes >> 10;
    vec![
        ("fetch.queue.backoff.ms", QUEUE_BACKOFF_MS.to_string()),
        ("queued.max.messages.kbytes", kib.to_string()),
        ("queued.min.messages", (kib * messages_per_kib).to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(settings: &[(&'static str, String)], key: &str) -> u64 {
        settings
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} missing"))
    }

    #[test]
    fn queues_are_sized_from_the_budget() {
        for (budget_mib, member_kib, member_fetch_kib, catchup_kib) in [
            // The default budget: 16 MiB for each consumer, shared by its queues (however
            // many partitions fetch into them).
            (256, 2_048, 4_096, 2_048),
            // Never below one partition fetch.
            (16, 1_024, 1_024, 1_024),
            (4096, 32_768, 16_384, 32_768),
            // librdkafka refuses more than about 2 GiB: never near it.
            (65_536, 65_536, 16_384, 65_536),
        ] {
            let budget = budget_mib << 20;
            let member = member(budget);
            let catchup = catchup(budget);
            assert_eq!(value(&member, "queued.max.messages.kbytes"), member_kib);
            // A quarter of the share per fetch, never below one partition fetch.
            assert_eq!(value(&member, "fetch.max.bytes"), member_fetch_kib << 10);
            assert_eq!(value(&catchup, "queued.max.messages.kbytes"), catchup_kib);
            for (settings, per_kib) in [
                (&member, MEMBER_MESSAGES_PER_KIB),
                (&catchup, MESSAGES_PER_KIB),
            ] {
                assert_eq!(value(settings, "fetch.queue.backoff.ms"), QUEUE_BACKOFF_MS);
                assert_eq!(
                    value(settings, "queued.min.messages"),
                    value(settings, "queued.max.messages.kbytes") * per_kib
                );
            }
        }
    }

    #[test]
    fn a_partition_fetch_is_bounded_by_the_response() {
        let with = |pairs: &[(&str, &str)]| {
            let config: ClientConfig = pairs
                .iter()
                .map(|&(key, value)| (key.into(), value.into()))
                .collect();
            partition_fetch_bytes(&config)
        };
        assert_eq!(with(&[]), 1 << 20);
        assert_eq!(with(&[("max.partition.fetch.bytes", "4194304")]), 4 << 20);
        assert_eq!(with(&[("fetch.message.max.bytes", "65536")]), 65_536);
        assert_eq!(with(&[("max.partition.fetch.bytes", "lots")]), 1 << 20);
        let large = ("max.partition.fetch.bytes", "209715200");
        // librdkafka's response, lowered to one queue, never below the largest message.
        assert_eq!(with(&[large]), FETCH_MAX_BYTES);
        assert_eq!(
            with(&[large, ("queued.max.messages.kbytes", "2048")]),
            2 << 20
        );
        assert_eq!(
            with(&[large, ("queued.max.messages.kbytes", "512")]),
            MESSAGE_MAX_BYTES
        );
        assert_eq!(
            with(&[
                large,
                ("queued.max.messages.kbytes", "512"),
                ("message.max.bytes", "2000000")
            ]),
            2_000_000
        );
        // A response the user sized is not lowered to the queue.
        assert_eq!(
            with(&[
                large,
                ("fetch.max.bytes", "8388608"),
                ("queued.max.messages.kbytes", "512")
            ]),
            8 << 20
        );
        // As each consumer is set up at the default budget, a user's 50 MiB: the member's
        // response (4 MiB), and the catch-up consumer's queue (2 MiB).
        for (settings, expected) in [(member(256 << 20), 4 << 20), (catchup(256 << 20), 2 << 20)] {
            let mut config = ClientConfig::new();
            config.set("max.partition.fetch.bytes", "52428800");
            apply(&mut config, &settings);
            assert_eq!(partition_fetch_bytes(&config), expected);
            let mut config = ClientConfig::new();
            apply(&mut config, &settings);
            assert_eq!(partition_fetch_bytes(&config), 1 << 20);
        }
    }

    #[test]
    fn the_users_settings_win() {
        let mut config = ClientConfig::new();
        config.set("queued.max.messages.kbytes", "4096");
        config.set("fetch.max.bytes", "1048576");
        apply(&mut config, &catchup(256 << 20));
        assert_eq!(config.get("queued.max.messages.kbytes"), Some("4096"));
        assert_eq!(config.get("fetch.max.bytes"), Some("1048576"));
        assert_eq!(config.get("fetch.queue.backoff.ms"), Some("10"));
        assert_eq!(config.get("fetch.wait.max.ms"), Some("10"));
        // The user sized the queue by bytes: the count stays librdkafka's, not ours.
        assert_eq!(config.get("queued.min.messages"), None);
        let mut config = ClientConfig::new();
        apply(&mut config, &member(256 << 20));
        assert_eq!(config.get("queued.min.messages"), Some("8192"));
        // A fetch carries a quarter of the member's share, unless the user bounded a response.
        assert_eq!(config.get("fetch.max.bytes"), Some("4194304"));
        for (key, value) in [
            ("receive.message.max.bytes", "10000000"),
            ("message.max.bytes", "33554432"),
        ] {
            let mut config = ClientConfig::new();
            config.set(key, value);
            apply(&mut config, &member(256 << 20));
            assert_eq!(config.get("fetch.max.bytes"), None, "{key}");
        }
        let mut config = ClientConfig::new();
        config.set("fetch.wait.max.ms", "100");
        apply(&mut config, &catchup(256 << 20));
        assert_eq!(config.get("fetch.wait.max.ms"), Some("100"));
        for settings in [member(256 << 20), catchup(256 << 20)] {
            // Neither consumer lets the broker hold a fetch of partitions at their end long,
            assert_eq!(value(&settings, "fetch.wait.max.ms"), FETCH_WAIT_MS);
            // but a user who batches fetches by bytes keeps librdkafka's wait for them.
            let mut config = ClientConfig::new();
            config.set("fetch.min.bytes", "65536");
            apply(&mut config, &settings);
            assert_eq!(config.get("fetch.wait.max.ms"), None);
        }
    }
}
