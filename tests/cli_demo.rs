//! `catchup demo` against the test broker with a small backlog: it runs the three modes and
//! writes its figures and chart.

mod support;

use std::process::Command;

#[test]
fn demo_compares_the_three_modes() {
    let brokers = support::bootstrap();
    let out = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_catchup"))
        .args([
            "demo",
            "--brokers",
            &brokers,
            "--backlog",
            "20000",
            "--process-us",
            "100",
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A healthy run says nothing at ERROR (every end of partition of the catch-up consumer
    // was once an ERROR line from librdkafka).
    let stderr = String::from_utf8_lossy(&output.stderr);
    let errors: Vec<&str> = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|line| line.contains("ERROR"))
        .collect();
    assert!(
        errors.is_empty(),
        "ERROR lines in a healthy run: {errors:#?}"
    );
    for mode in ["off", "ordered", "concurrent"] {
        assert!(
            stdout.lines().any(|line| line.starts_with(mode)),
            "no row for {mode}:\n{stdout}"
        );
    }
    let figures: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("demo.json")).expect("demo.json"))
            .expect("json");
    let runs = figures["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3);
    for run in runs {
        assert_eq!(run["duplicates"], 0, "{run}");
        assert!(
            run["processed"].as_u64().is_some_and(|n| n >= 20_000),
            "{run}"
        );
    }
    // Concurrent hands out a fresh record while its backlog is still being worked off.
    let concurrent = &runs[2];
    let first_fresh = concurrent["first_fresh_s"]
        .as_f64()
        .expect("a fresh record");
    assert!(
        first_fresh < concurrent["backlog_drained_s"].as_f64().unwrap_or(0.0),
        "{concurrent}"
    );
    // The bar chart names every mode once, under its bars (an earlier chart labelled two of
    // the three); the age chart draws a line per mode from the quarter-second samples.
    let chart = std::fs::read_to_string(out.path().join("demo.svg")).expect("demo.svg");
    let ages = std::fs::read_to_string(out.path().join("demo-age.svg")).expect("demo-age.svg");
    assert!(
        chart.starts_with("<svg") && ages.starts_with("<svg"),
        "not charts"
    );
    // (The SVG writer puts each text on a line of its own.)
    let texts = |svg: &str, text: &str| svg.lines().filter(|line| line.trim() == text).count();
    for mode in ["off", "ordered", "concurrent"] {
        assert_eq!(
            texts(&chart, mode),
            1,
            "{mode} labelled once in the bar chart"
        );
        assert_eq!(texts(&ages, mode), 1, "{mode} in the age chart's legend");
    }
    // Every bar carries its value (0.5 s beside 12 s is invisible as a bar alone).
    for run in runs {
        for figure in ["first_fresh_s", "backlog_drained_s"] {
            let value = run[figure].as_f64().expect("a figure");
            let label = format!("{value:.2} s");
            assert!(
                texts(&chart, &label) >= 1,
                "no label {label} for {figure} in the bar chart"
            );
        }
    }
    for run in runs {
        let samples = run["youngest_age_s_per_quarter_second"]
            .as_array()
            .expect("age samples");
        assert!(!samples.is_empty(), "{run}");
    }
}
