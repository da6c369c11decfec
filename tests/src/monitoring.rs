//! `deploy/components/monitoring` as the tests read it: its PodMonitors, its PrometheusRule's
//! groups, its dashboard's queries, and the metric names those queries use. The cluster tier's
//! plain Prometheus configuration is generated from the same objects ([`prometheus_config`]), so
//! what the real Prometheus there scrapes and evaluates is what the component ships.
//!
//! prometheus-operator's CRDs are in no registry these machines reach, so no operator turns the
//! PodMonitors into scrape configurations here; [`scrape_config`] does what the operator does for
//! the fields the component uses (pod discovery in the named namespaces, `matchLabels`, the
//! container port by name, `jobLabel`, `relabelings`) and refuses any other field.
//!
//! Debian's Prometheus is built without Kubernetes service discovery, so the pods are discovered
//! by the harness instead: [`pod_targets`] writes, for a file of `file_sd_configs`, exactly the
//! targets and `__meta_kubernetes_pod_*` labels Prometheus's pod discovery would produce, and the
//! relabeling the operator generates (selector, port name, job label, relabelings) runs on them
//! unchanged in Prometheus.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail, ensure};
use serde::Deserialize as _;
use serde_json::{Value, json};

/// The component's directory.
pub fn component_dir() -> PathBuf {
    crate::env::repo_root().join("deploy/components/monitoring")
}

/// The promtool unit tests of the rules.
pub fn rules_test_file() -> PathBuf {
    crate::env::repo_root().join("tests/monitoring/alerts.test.yaml")
}

/// Every YAML document of a file of the component, as JSON values.
pub fn documents(file: &str) -> anyhow::Result<Vec<Value>> {
    let path = component_dir().join(file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).with_context(|| format!("{}: not YAML", path.display())))
        .filter(|v| !matches!(v, Ok(Value::Null)))
        .collect()
}

/// The component's PodMonitors.
pub fn pod_monitors() -> anyhow::Result<Vec<Value>> {
    Ok(documents("podmonitors.yaml")?
        .into_iter()
        .filter(|o| o["kind"] == "PodMonitor")
        .collect())
}

/// The component's PrometheusRule.
pub fn prometheus_rule() -> anyhow::Result<Value> {
    documents("prometheusrule.yaml")?
        .into_iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .context("no PrometheusRule in prometheusrule.yaml")
}

/// The PrometheusRule's groups as a Prometheus rule file (`groups:`), as promtool and
/// Prometheus read it.
pub fn rules_file() -> anyhow::Result<String> {
    let rule = prometheus_rule()?;
    let groups = rule
        .pointer("/spec/groups")
        .context("the PrometheusRule has no spec.groups")?;
    Ok(serde_norway::to_string(&json!({ "groups": groups }))?)
}

/// Every rule of the PrometheusRule (recording and alerting).
pub fn rules() -> anyhow::Result<Vec<Value>> {
    let rule = prometheus_rule()?;
    Ok(rule
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect())
}

/// The alerting rules.
pub fn alerts() -> anyhow::Result<Vec<Value>> {
    Ok(rules()?.into_iter().filter(|r| r.get("alert").is_some()).collect())
}

/// The dashboard (Grafana JSON).
pub fn dashboard() -> anyhow::Result<Value> {
    let path = component_dir().join("dashboard.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

/// Every query the component ships, with where it is: each rule's `expr` and each dashboard
/// panel's targets.
pub fn queries() -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for rule in rules()? {
        let name = rule
            .get("alert")
            .or_else(|| rule.get("record"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        out.push((
            format!("rule {name}"),
            rule["expr"].as_str().unwrap_or_default().to_string(),
        ));
    }
    let dashboard = dashboard()?;
    let mut panels: Vec<&Value> = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        panels.push(panel);
        panels.extend(panel["panels"].as_array().into_iter().flatten());
    }
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                format!("panel {:?}", panel["title"].as_str().unwrap_or_default()),
                target["expr"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    Ok(out)
}

/// PromQL words that are not metric names: operators, modifiers, and the aggregations (which
/// may be followed by `by (…)` before their parenthesis).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
];
/// Keywords followed by a parenthesized list of label names.
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names a PromQL expression selects (not functions, aggregations, keywords, label
/// names, label values, numbers or durations).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_until = |i: &mut usize, close: char| {
        while *i < chars.len() && chars[*i] != close {
            if chars[*i] == '"' || chars[*i] == '\'' {
                let quote = chars[*i];
                *i += 1;
                while *i < chars.len() && chars[*i] != quote {
                    if chars[*i] == '\\' {
                        *i += 1;
                    }
                    *i += 1;
                }
            }
            *i += 1;
        }
        *i += 1;
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            skip_until(&mut i, '}');
        } else if c == '[' {
            skip_until(&mut i, ']');
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number or a duration (5m, 1e3, 0x1f).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let lower = word.to_ascii_lowercase();
            if LABEL_LISTS.contains(&lower.as_str()) {
                if chars.get(next) == Some(&'(') {
                    i = next + 1;
                    skip_until(&mut i, ')');
                }
            } else if chars.get(next) == Some(&'(') || KEYWORDS.contains(&lower.as_str()) {
                // A function or an aggregation, or an operator.
            } else {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The sample names an OpenMetrics or Prometheus text exposition declares: each family's name
/// with the suffixes its type gives its samples (a counter's `_total`, a histogram's `_bucket`,
/// `_sum` and `_count`), and every sample line's name.
pub fn exposed_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            for suffix in suffixes {
                let full = if name.ends_with(suffix) {
                    name.to_string()
                } else {
                    format!("{name}{suffix}")
                };
                names.insert(full);
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// Series Prometheus itself writes for every target.
pub const SCRAPE_SERIES: &[&str] = &["up"];

/// Every query's metric names that are neither exposed (`exposed`), written by Prometheus for
/// each target, nor recorded by one of the rules: `(where, name)`.
pub fn unknown_names(exposed: &BTreeSet<String>) -> anyhow::Result<Vec<(String, String)>> {
    let recorded: BTreeSet<String> = rules()?
        .iter()
        .filter_map(|r| r["record"].as_str().map(str::to_string))
        .collect();
    let mut unknown = Vec::new();
    for (place, expr) in queries()? {
        for name in metric_names(&expr) {
            if !exposed.contains(&name) && !recorded.contains(&name) && !SCRAPE_SERIES.contains(&name.as_str()) {
                unknown.push((place.clone(), name));
            }
        }
    }
    Ok(unknown)
}

/// A Prometheus label name for a Kubernetes label (what Prometheus's pod discovery writes:
/// every character outside `[a-zA-Z0-9_]` becomes `_`).
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

/// The PodMonitor fields [`scrape_config`] turns into configuration; any other is refused, so a
/// field added to the component cannot silently go untested.
const SPEC_FIELDS: &[&str] = &["jobLabel", "namespaceSelector", "selector", "podMetricsEndpoints"];
const ENDPOINT_FIELDS: &[&str] = &["port", "path", "interval", "relabelings"];
const RELABEL_FIELDS: &[(&str, &str)] = &[
    ("sourceLabels", "source_labels"),
    ("targetLabel", "target_label"),
    ("regex", "regex"),
    ("replacement", "replacement"),
    ("action", "action"),
    ("separator", "separator"),
];

fn only(object: &Value, allowed: &[&str], what: &str) -> anyhow::Result<()> {
    for key in object.as_object().into_iter().flatten().map(|(k, _)| k) {
        ensure!(
            allowed.contains(&key.as_str()),
            "{what}: field {key} is not turned into scrape configuration"
        );
    }
    Ok(())
}

/// The file a scrape configuration of [`scrape_config`] reads its targets from, in `dir`.
pub fn targets_file(dir: &Path, pod_monitor: &Value) -> PathBuf {
    let name = pod_monitor
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    dir.join(format!("{}.json", sanitize(name)))
}

/// The scrape configurations prometheus-operator generates for a PodMonitor (one per endpoint,
/// named and relabeled as the operator does), with the pods discovered into a file in
/// `targets_dir` ([`targets_file`], written from [`pod_targets`]).
pub fn scrape_config(pod_monitor: &Value, targets_dir: &Path) -> anyhow::Result<Vec<Value>> {
    let name = pod_monitor
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let namespace = pod_monitor
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let what = format!("PodMonitor {namespace}/{name}");
    let spec = &pod_monitor["spec"];
    only(spec, SPEC_FIELDS, &what)?;
    only(&spec["selector"], &["matchLabels"], &format!("{what} selector"))?;
    only(
        &spec["namespaceSelector"],
        &["matchNames"],
        &format!("{what} namespaceSelector"),
    )?;
    let match_labels: BTreeMap<String, String> = spec
        .pointer("/selector/matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    ensure!(!match_labels.is_empty(), "{what}: no selector.matchLabels");
    let endpoints = spec["podMetricsEndpoints"].as_array().cloned().unwrap_or_default();
    ensure!(!endpoints.is_empty(), "{what}: no podMetricsEndpoints");
    let mut out = Vec::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        only(endpoint, ENDPOINT_FIELDS, &format!("{what} endpoint {index}"))?;
        let Some(port) = endpoint["port"].as_str() else {
            bail!("{what} endpoint {index}: no port name");
        };
        let mut relabel = vec![
            json!({"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"}),
        ];
        for (label, value) in &match_labels {
            let sanitized = sanitize(label);
            relabel.push(json!({
                "action": "keep",
                "source_labels": [
                    format!("__meta_kubernetes_pod_label_{sanitized}"),
                    format!("__meta_kubernetes_pod_labelpresent_{sanitized}"),
                ],
                "regex": format!("({value});true"),
            }));
        }
        relabel.push(
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port}),
        );
        for (meta, target) in [
            ("__meta_kubernetes_namespace", "namespace"),
            ("__meta_kubernetes_pod_container_name", "container"),
            ("__meta_kubernetes_pod_name", "pod"),
        ] {
            relabel.push(json!({"source_labels": [meta], "target_label": target}));
        }
        relabel.push(json!({"target_label": "job", "replacement": format!("{namespace}/{name}")}));
        if let Some(job_label) = spec["jobLabel"].as_str() {
            relabel.push(json!({
                "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize(job_label))],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }));
        }
        relabel.push(json!({"target_label": "endpoint", "replacement": port}));
        for (n, rule) in endpoint["relabelings"].as_array().into_iter().flatten().enumerate() {
            let allowed: Vec<&str> = RELABEL_FIELDS.iter().map(|(k, _)| *k).collect();
            only(rule, &allowed, &format!("{what} endpoint {index} relabeling {n}"))?;
            let mut converted = serde_json::Map::new();
            for (from, to) in RELABEL_FIELDS {
                if let Some(v) = rule.get(*from) {
                    converted.insert((*to).to_string(), v.clone());
                }
            }
            relabel.push(Value::Object(converted));
        }
        let mut config = json!({
            "job_name": format!("podMonitor/{namespace}/{name}/{index}"),
            "honor_labels": false,
            "file_sd_configs": [{
                "files": [targets_file(targets_dir, pod_monitor).display().to_string()],
                "refresh_interval": "5s",
            }],
            "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
            "relabel_configs": relabel,
        });
        if let Some(interval) = endpoint["interval"].as_str() {
            config["scrape_interval"] = json!(interval);
        }
        out.push(config);
    }
    Ok(out)
}

/// The namespaces a PodMonitor discovers pods in (`namespaceSelector.matchNames`, else its own).
pub fn namespaces(pod_monitor: &Value) -> Vec<String> {
    match pod_monitor.pointer("/spec/namespaceSelector/matchNames") {
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => pod_monitor
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string)
            .into_iter()
            .collect(),
    }
}

/// What Prometheus's Kubernetes pod discovery makes of `pods`, as a `file_sd_configs` file:
/// one target per declared container port of each pod that has an address, with the
/// `__meta_kubernetes_*` labels the relabeling reads.
pub fn pod_targets(pods: &[k8s_openapi::api::core::v1::Pod]) -> Value {
    let mut groups = Vec::new();
    for pod in pods {
        let Some(status) = pod.status.as_ref() else { continue };
        let Some(ip) = status.pod_ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        let mut labels = serde_json::Map::new();
        let mut put = |k: String, v: &str| {
            labels.insert(k, json!(v));
        };
        put(
            "__meta_kubernetes_namespace".into(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        put(
            "__meta_kubernetes_pod_name".into(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
        put("__meta_kubernetes_pod_ip".into(), ip);
        put(
            "__meta_kubernetes_pod_phase".into(),
            status.phase.as_deref().unwrap_or_default(),
        );
        put(
            "__meta_kubernetes_pod_node_name".into(),
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or_default(),
        );
        for (k, v) in pod.metadata.labels.iter().flatten() {
            put(format!("__meta_kubernetes_pod_label_{}", sanitize(k)), v);
            put(format!("__meta_kubernetes_pod_labelpresent_{}", sanitize(k)), "true");
        }
        for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            for port in container.ports.iter().flatten() {
                let mut target = labels.clone();
                target.insert("__meta_kubernetes_pod_container_name".into(), json!(container.name));
                target.insert(
                    "__meta_kubernetes_pod_container_port_name".into(),
                    json!(port.name.as_deref().unwrap_or_default()),
                );
                target.insert(
                    "__meta_kubernetes_pod_container_port_number".into(),
                    json!(port.container_port.to_string()),
                );
                groups.push(json!({
                    "targets": [format!("{ip}:{}", port.container_port)],
                    "labels": target,
                }));
            }
        }
    }
    Value::Array(groups)
}

/// A plain Prometheus configuration: the component's PodMonitors as scrape configurations
/// (targets from files in `targets_dir`), the rule file at `rules`, and rules evaluated every
/// `evaluation_interval`.
pub fn prometheus_config(targets_dir: &Path, rules: &Path, evaluation_interval: &str) -> anyhow::Result<String> {
    let mut scrape_configs = Vec::new();
    for monitor in pod_monitors()? {
        scrape_configs.extend(scrape_config(&monitor, targets_dir)?);
    }
    Ok(serde_norway::to_string(&json!({
        "global": {"evaluation_interval": evaluation_interval},
        "rule_files": [rules.display().to_string()],
        "scrape_configs": scrape_configs,
    }))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_of_expressions() {
        let cases: &[(&str, &[&str])] = &[
            ("up", &["up"]),
            (r#"absent(up{job="smolvm-webhook"} == 1)"#, &["up"]),
            (
                r#"sum by (le, path) (rate(smolvm_webhook_request_duration_seconds_bucket{path=~"/a|b"}[5m])) > 0.25"#,
                &["smolvm_webhook_request_duration_seconds_bucket"],
            ),
            (
                "max(a_timestamp_seconds > 0) - time() < 14 * 86400 or on (x) b:rec:rate5m offset 5m",
                &["a_timestamp_seconds", "b:rec:rate5m"],
            ),
            ("sum without (pod) (x) / ignoring(node) group_left(le) y", &["x", "y"]),
            ("histogram_quantile(0.99, z) * 1e3", &["z"]),
        ];
        for (expr, expected) in cases {
            let got: Vec<String> = metric_names(expr).into_iter().collect();
            assert_eq!(
                got,
                expected.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{expr}"
            );
        }
    }

    #[test]
    fn exposed_names_follow_the_types() {
        let text = "# HELP a_requests A.\n# TYPE a_requests counter\na_requests_total{x=\"1\"} 3\n\
                    # TYPE a_latency_seconds histogram\n# TYPE a_up gauge\n# TYPE b_total counter\n# EOF\n";
        let got = exposed_names(text);
        for name in [
            "a_requests_total",
            "a_latency_seconds_bucket",
            "a_latency_seconds_sum",
            "a_latency_seconds_count",
            "a_up",
            "b_total",
        ] {
            assert!(got.contains(name), "{name}: {got:?}");
        }
        assert!(!got.contains("a_requests"), "{got:?}");
    }
}
