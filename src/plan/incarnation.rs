//! Which partitions may keep their buffered records when the topic's incarnation cannot be
//! told (`docs/design.md`, "Topic incarnations").
//!
//! A topic deleted and recreated under the same name restarts its offsets with other data, so
//! buffered records are reused only for the incarnation they were fetched from. The topic id
//! tells incarnations apart; where it cannot be read (a failed lookup, a broker older than
//! Kafka 2.8 that has no topic ids), nothing proves the records belong to the topic as it is
//! now, and they are not reused: refetching from the group's offset costs only time.

use std::collections::HashMap;

/// The partitions among `assigning` whose buffered records must be dropped before they are
/// reconciled: those of a topic that was `looked_up` and for which no id came back (`ids`
/// maps topic names to ids). Topics not looked up were checked earlier in this process.
pub fn incarnation_unknown<'a, Id>(
    assigning: &'a [(String, i32)],
    looked_up: &[&str],
    ids: &HashMap<String, Id>,
) -> Vec<&'a (String, i32)> {
    assigning
        .iter()
        .filter(|(topic, _)| looked_up.contains(&topic.as_str()) && !ids.contains_key(topic))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_a_topic_whose_id_cannot_be_read_are_not_reused() {
        let assigning = vec![
            ("orders".to_owned(), 0),
            ("orders".to_owned(), 1),
            ("payments".to_owned(), 0),
            ("audit".to_owned(), 2),
        ];
        let payments_known: HashMap<String, &str> = [("payments".to_owned(), "id-p")].into();
        let none_known = HashMap::new();
        type Case<'a> = (
            &'a [&'a str],
            &'a HashMap<String, &'a str>,
            Vec<(&'a str, i32)>,
        );
        let cases: [Case; 4] = [
            // orders has no id (its lookup failed, or the broker has none): both its
            // partitions, whether they return from a revoke or come back after a restart.
            (
                &["orders", "payments"],
                &payments_known,
                vec![("orders", 0), ("orders", 1)],
            ),
            // audit was checked earlier in this process: not looked up, kept.
            (&["payments"], &payments_known, vec![]),
            // The whole lookup failed: every partition of every topic looked up.
            (
                &["orders", "payments", "audit"],
                &none_known,
                vec![("orders", 0), ("orders", 1), ("payments", 0), ("audit", 2)],
            ),
            (&[], &none_known, vec![]),
        ];
        for (looked_up, ids, expected) in cases {
            let dropped: Vec<(&str, i32)> = incarnation_unknown(&assigning, looked_up, ids)
                .into_iter()
                .map(|(topic, partition)| (topic.as_str(), *partition))
                .collect();
            assert_eq!(dropped, expected, "looked up {looked_up:?}");
        }
    }
}
