//! What a subscription may name: checked before it reaches the group member, so that a
//! malformed name is an error of `subscribe` itself rather than a later `recv`.

/// The longest topic name Kafka accepts.
const MAX_TOPIC_LEN: usize = 249;

/// Checks `topics` as a subscription: at least one entry, each a valid Kafka topic name
/// (1 to 249 of `a-z A-Z 0-9 . _ -`, not `.` or `..`) or a pattern starting with `^`
/// (librdkafka compiles patterns; one it refuses is reported through `recv`), none twice.
pub fn check_subscription(topics: &[&str]) -> Result<(), String> {
    if topics.is_empty() {
        return Err("subscribe needs at least one topic".into());
    }
    for (index, topic) in topics.iter().enumerate() {
        if topics[..index].contains(topic) {
            return Err(format!("{topic:?} is named twice in the subscription"));
        }
        if let Some(pattern) = topic.strip_prefix('^') {
            if pattern.is_empty() {
                return Err(
                    "the pattern \"^\" matches nothing in particular: name topics after it".into(),
                );
            }
            continue;
        }
        let valid_chars = topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if topic.is_empty()
            || topic.len() > MAX_TOPIC_LEN
            || !valid_chars
            || *topic == "."
            || *topic == ".."
        {
            return Err(format!(
                "{topic:?} is not a Kafka topic name (1 to {MAX_TOPIC_LEN} of a-z, A-Z, 0-9, '.', '_', '-'; a pattern starts with '^')"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_table() {
        let long = "t".repeat(MAX_TOPIC_LEN);
        let too_long = "t".repeat(MAX_TOPIC_LEN + 1);
        for (topics, accepted) in [
            (vec!["orders"], true),
            (vec!["orders", "payments.v2", "a_b-c"], true),
            (vec!["^orders-.*"], true),
            (vec![long.as_str()], true),
            (vec![], false),
            (vec![""], false),
            (vec!["^"], false),
            (vec!["."], false),
            (vec![".."], false),
            (vec!["has space"], false),
            (vec!["slash/topic"], false),
            (vec!["orders", "bad,comma"], false),
            (vec!["orders", "orders"], false),
            (vec!["^o.*", "^o.*"], false),
            (vec![too_long.as_str()], false),
        ] {
            assert_eq!(check_subscription(&topics).is_ok(), accepted, "{topics:?}");
        }
    }
}
