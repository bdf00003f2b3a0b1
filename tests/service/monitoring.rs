//! The monitoring files dedupd ships (`deploy/prometheus/alerts.yml`,
//! `deploy/grafana/dedupd.json`) against the real `/metrics`: every
//! metric and label value they name is in a scrape, and the dashboard
//! covers every family. Where `promtool` is installed (always under CI),
//! the rules pass `promtool check rules` and their unit tests
//! (`deploy/prometheus/alerts_test.yml`), and every dashboard query parses.

use std::collections::BTreeSet;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use serde_json::json;

use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `expr` of each rule in a Prometheus rule file: inline, or a block
/// scalar (`|`, `>-`, …) on the lines indented below it.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest.is_empty() || rest.starts_with(['|', '>']) {
            let indent = line.len() - line.trim_start().len();
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect();
            exprs.push(block.join(" "));
        } else {
            exprs.push(rest.trim_matches(['"', '\'']).to_owned());
        }
    }
    exprs
}

/// Every query of a Grafana dashboard: the panels' `expr`s and the
/// template variables' queries.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        ("query", Value::Object(q)) => {
                            if let Some(Value::String(s)) = q.get("query") {
                                out.push(s.clone());
                            }
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// A label matcher of a selector: label, operator, value.
type Matcher = (String, String, String);

/// Each `dedupd_*` metric an expression names, with the matchers of its
/// selector (empty when it has none).
fn selectors(expr: &str) -> Vec<(String, Vec<Matcher>)> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while let Some(at) = expr[i..].find("dedupd_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        i = end;
        if start > 0 && ident(bytes[start - 1]) {
            continue;
        }
        let name = expr[start..end].to_owned();
        let mut matchers = Vec::new();
        if expr[end..].starts_with('{') {
            let close = expr[end..].find('}').expect("a selector closes") + end;
            for m in expr[end + 1..close].split(',').map(str::trim) {
                if m.is_empty() {
                    continue;
                }
                let op_at = m.find(['=', '!']).expect("a matcher has an operator");
                let op_len = if m[op_at..].starts_with("=~")
                    || m[op_at..].starts_with("!=")
                    || m[op_at..].starts_with("!~")
                {
                    2
                } else {
                    1
                };
                matchers.push((
                    m[..op_at].trim().to_owned(),
                    m[op_at..op_at + op_len].to_owned(),
                    m[op_at + op_len..].trim().trim_matches('"').to_owned(),
                ));
            }
            i = close;
        }
        out.push((name, matchers));
    }
    out
}

/// The series of a Prometheus text scrape: name and labels.
fn series(scrape: &str) -> Vec<(String, Vec<(String, String)>)> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, _value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.to_owned(), v.trim_matches('"').to_owned()))
                })
                .collect();
            Some((name.to_owned(), labels))
        })
        .collect()
}

/// What the files name that the scrape lacks: metrics without a series,
/// label names no series of that metric has, and label values matched
/// exactly (`label="value"`) that none has. `instance` and `job` are
/// Prometheus's own; values with a `$` are Grafana's variables.
fn missing(exprs: &[String], scrape: &str) -> Vec<String> {
    let have = series(scrape);
    let mut missing = BTreeSet::new();
    for expr in exprs {
        for (name, matchers) in selectors(expr) {
            let of_name: Vec<_> = have.iter().filter(|(n, _)| *n == name).collect();
            if of_name.is_empty() {
                missing.insert(format!("{name} (in `{expr}`)"));
                continue;
            }
            for (label, op, value) in matchers {
                if label == "instance" || label == "job" {
                    continue;
                }
                let with_label = |want: Option<&str>| {
                    of_name.iter().any(|(_, labels)| {
                        labels
                            .iter()
                            .any(|(k, v)| *k == label && want.is_none_or(|w| w == v))
                    })
                };
                if !with_label(None) {
                    missing.insert(format!("{name} has no label {label} (in `{expr}`)"));
                } else if op == "=" && !value.contains('$') && !with_label(Some(&value)) {
                    missing.insert(format!("{name}{{{label}=\"{value}\"}} (in `{expr}`)"));
                }
            }
        }
    }
    missing.into_iter().collect()
}

#[test]
fn the_selector_parser_finds_names_matchers_and_histogram_series() {
    let found = selectors(
        "histogram_quantile(0.9, sum by (le) (rate(dedupd_a_seconds_bucket{source=~\"$source\", \
         outcome=\"dead\"}[5m]))) / dedupd_b_total and not_dedupd_c",
    );
    assert_eq!(
        found,
        [
            (
                "dedupd_a_seconds_bucket".to_owned(),
                vec![
                    ("source".to_owned(), "=~".to_owned(), "$source".to_owned()),
                    ("outcome".to_owned(), "=".to_owned(), "dead".to_owned()),
                ]
            ),
            ("dedupd_b_total".to_owned(), vec![]),
        ]
    );
    assert_eq!(
        rule_exprs("  - alert: A\n    expr: |\n      up\n        == 0\n    for: 1m\n"),
        ["up == 0"]
    );
}

#[tokio::test]
async fn every_metric_and_label_value_the_alerts_and_the_dashboard_name_is_in_a_real_scrape() {
    let receiver = Receiver::start(Behaviour::Accept).await;
    let app = gateway_app(&receiver.url, |_| {}).await;
    // Traffic, so the scrape is one of a working instance.
    app.claim_ok("k1", json!({})).await;
    app.ingest_ok(&body("req_1", "run_1", "2026-11-29T10:00:00Z"))
        .await;
    app.retrying_until("delivered", || async {
        app.event_ids("delivered").await.len() == 1
    })
    .await;
    let scrape = app.scrape().await;

    let rules = rule_exprs(&read("prometheus/alerts.yml"));
    let dashboard: Value = serde_json::from_str(&read("grafana/dedupd.json")).unwrap();
    let queries = dashboard_exprs(&dashboard);
    // The readers found what is there (seven rules; a query per panel
    // target and per variable), not nothing.
    assert!(rules.len() >= 7, "{rules:?}");
    assert!(queries.len() >= 25, "{queries:?}");

    let in_rules = missing(&rules, &scrape);
    assert!(
        in_rules.is_empty(),
        "deploy/prometheus/alerts.yml names what /metrics lacks:\n{}\n\nscrape:\n{scrape}",
        in_rules.join("\n")
    );
    let in_dashboard = missing(&queries, &scrape);
    assert!(
        in_dashboard.is_empty(),
        "deploy/grafana/dedupd.json names what /metrics lacks:\n{}\n\nscrape:\n{scrape}",
        in_dashboard.join("\n")
    );

    // A family added to /metrics gets a panel.
    let named: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| selectors(q))
        .map(|(name, _)| name)
        .collect();
    let families: Vec<&str> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    assert!(families.len() >= 20, "{scrape}");
    let unshown: Vec<&&str> = families
        .iter()
        .filter(|f| {
            !named
                .iter()
                .any(|n| n == *f || n.strip_prefix(**f).is_some_and(|s| s.starts_with('_')))
        })
        .collect();
    assert!(
        unshown.is_empty(),
        "families no panel of deploy/grafana/dedupd.json shows: {unshown:?}"
    );
}

/// `promtool`, if installed; under CI (`CI` set) it must be.
fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing (Debian: apt-get install prometheus)"
        );
        eprintln!("promtool is not installed: skipped (Debian: apt-get install prometheus)");
    }
    found.then_some("promtool")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run promtool");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alert_rules_pass_promtool_and_each_fires_in_its_unit_test() {
    let Some(promtool) = promtool() else {
        return;
    };
    run(Command::new(promtool)
        .args(["check", "rules"])
        .arg(deploy("prometheus/alerts.yml")));
    run(Command::new(promtool)
        .args(["test", "rules"])
        .arg(deploy("prometheus/alerts_test.yml")));
    // Every alert has a unit test that expects it to fire.
    let tests = read("prometheus/alerts_test.yml");
    for line in read("prometheus/alerts.yml").lines() {
        if let Some(name) = line.trim().strip_prefix("- alert:") {
            let name = name.trim();
            assert!(
                tests.contains(&format!(
                    "alertname: {name}\n        exp_alerts:\n          - "
                )),
                "no unit test of {name} expects it to fire"
            );
        }
    }
}

/// Each dashboard query, with Grafana's variables given values, as a
/// recording rule: `promtool check rules` parses them all.
#[test]
fn every_dashboard_query_parses_as_promql() {
    let Some(promtool) = promtool() else {
        return;
    };
    let dashboard: Value = serde_json::from_str(&read("grafana/dedupd.json")).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in dashboard_exprs(&dashboard).iter().enumerate() {
        // label_values() is Grafana's, not PromQL: its first argument is.
        let q = match q.strip_prefix("label_values(") {
            Some(rest) => rest.rsplit_once(',').expect("label_values(m, label)").0,
            None => q,
        };
        let q = q
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*")
            .replace("$source", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&q).unwrap()
        ));
    }
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("dashboard.yml");
    std::fs::write(&file, rules).unwrap();
    run(Command::new(promtool).args(["check", "rules"]).arg(&file));
}
