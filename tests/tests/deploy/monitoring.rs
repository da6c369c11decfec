//! deploy/components/monitoring (issue 33): the PodMonitors, the PrometheusRule and the
//! dashboard render with deploy/default and select what it runs; every alert carries a
//! severity, a summary, a description and a runbook that exists in docs/operations.md; promtool
//! checks the rules and runs their unit tests (tests/monitoring/alerts.test.yaml), and checks
//! the plain Prometheus configuration the cluster tier generates from the same objects.
//!
//! promtool comes with Debian's `prometheus` package (.ci/run installs it). Without it the
//! promtool tests print `skipped: …`, unless SMOLVM_REQUIRE_PROMTOOL is set (CI), where its
//! absence fails them.

use smolvm_tests::monitoring;

use super::*;

const RUNBOOKS: &str = "https://github.com/smolvm-operator/smolvm-operator/blob/main/docs/operations.md#";

/// promtool, or `None` after printing why the test skips (a failure where it is required).
fn promtool() -> Option<PathBuf> {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("SMOLVM_REQUIRE_PROMTOOL").is_none(),
            "SMOLVM_REQUIRE_PROMTOOL is set and promtool is not on PATH (Debian: apt-get install prometheus)"
        );
        println!("skipped: no promtool on PATH (Debian's prometheus package carries it)");
    }
    found
}

/// A directory holding the PrometheusRule's groups as `rules.yaml` and a copy of the rules'
/// unit tests beside it.
fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("rules.yaml"),
        monitoring::rules_file().expect("the rule file"),
    )
    .expect("write rules.yaml");
    std::fs::copy(monitoring::rules_test_file(), dir.path().join("alerts.test.yaml")).expect("copy the tests");
    dir
}

fn promtool_ok(promtool: &Path, dir: &Path, args: &[&str]) -> String {
    let output = run(Command::new(promtool).current_dir(dir).args(args));
    let all = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "promtool {}:\n{all}", args.join(" "));
    all
}

#[test]
pub(super) fn promtool_checks_the_rules_and_every_alert_fires_and_stays_silent_in_its_tests() {
    let Some(promtool) = promtool() else { return };
    let dir = rules_dir();
    promtool_ok(&promtool, dir.path(), &["check", "rules", "rules.yaml"]);
    promtool_ok(&promtool, dir.path(), &["test", "rules", "alerts.test.yaml"]);
    // promtool compares the firing alerts with the expected list exactly: an alert expected to
    // fire fires, and every other series of the same case is shown not to fire it. Every alert
    // must have such a case.
    let tests: Value = serde_norway::from_str(&read("tests/monitoring/alerts.test.yaml")).expect("the tests' YAML");
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_array().into_iter().flatten() {
        for check in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = check["alertname"].as_str().unwrap_or_default().to_string();
            if check["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                firing.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    for alert in monitoring::alerts().expect("the alerts") {
        let name = alert["alert"].as_str().unwrap_or_default();
        assert!(firing.contains(name), "{name}: no promtool case where it fires");
    }
    assert!(
        silent.len() >= 5,
        "cases where alerts must stay silent at all: {silent:?}"
    );
}

#[test]
pub(super) fn promtool_accepts_the_cluster_tiers_prometheus_configuration() {
    let Some(promtool) = promtool() else { return };
    let dir = rules_dir();
    let config = monitoring::prometheus_config(dir.path(), &dir.path().join("rules.yaml"), "15s").expect("config");
    std::fs::write(dir.path().join("prometheus.yml"), &config).expect("write config");
    promtool_ok(&promtool, dir.path(), &["check", "config", "prometheus.yml"]);
    // One job per binary, each keeping the pods of its workload on its `ops` port.
    let parsed: Value = serde_norway::from_str(&config).expect("config YAML");
    let jobs: Vec<&str> = parsed["scrape_configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["job_name"].as_str())
        .collect();
    assert_eq!(
        jobs,
        [
            "podMonitor/smolvm-system/smolvm-webhook/0",
            "podMonitor/smolvm-system/smolvm-controller/0",
            "podMonitor/smolvm-system/smolvm-runtime/0",
        ]
    );
    for config in parsed["scrape_configs"].as_array().into_iter().flatten() {
        let keeps: Vec<&str> = config["relabel_configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["action"] == "keep")
            .filter_map(|r| r["regex"].as_str())
            .collect();
        assert!(keeps.contains(&"ops"), "{config}");
        assert!(keeps.iter().any(|k| k.starts_with("(smolvm-")), "{config}");
    }
}

#[test]
pub(super) fn every_alert_has_a_severity_a_summary_a_description_and_a_runbook_in_the_docs() {
    let docs = read("docs/operations.md");
    let alerts = monitoring::alerts().expect("the alerts");
    assert!(alerts.len() >= 12, "{} alerts", alerts.len());
    for alert in alerts {
        let name = alert["alert"].as_str().unwrap_or_default();
        let severity = alert
            .pointer("/labels/severity")
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            let value = alert["annotations"][annotation].as_str().unwrap_or_default();
            assert!(value.len() > 20, "{name}: {annotation} {value:?}");
        }
        let runbook = alert
            .pointer("/annotations/runbook_url")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let anchor = name.to_ascii_lowercase();
        assert_eq!(runbook, format!("{RUNBOOKS}{anchor}"), "{name}: runbook_url");
        // GitHub's anchor of a heading that is the alert's name is its name in lower case.
        assert!(
            docs.lines()
                .any(|l| l.starts_with('#') && l.trim_start_matches('#').trim() == name),
            "{name}: docs/operations.md has no section headed {name} (its runbook)"
        );
    }
}

/// Every name a rule or a panel selects is the binaries' (`smolvm_…`), recorded by a rule, or
/// Prometheus's own `up`. Whether the binaries really export each one is checked against their
/// /metrics in the e2e tier (tests/tests/e2e/monitoring.rs).
#[test]
pub(super) fn every_query_selects_the_operators_metrics() {
    let recorded: BTreeSet<String> = monitoring::rules()
        .expect("rules")
        .iter()
        .filter_map(|r| r["record"].as_str().map(str::to_string))
        .collect();
    let queries = monitoring::queries().expect("queries");
    assert!(queries.len() > 30, "{} queries", queries.len());
    for (place, expr) in queries {
        let names = monitoring::metric_names(&expr);
        assert!(!names.is_empty(), "{place}: selects nothing: {expr}");
        for name in names {
            assert!(
                name.starts_with("smolvm_") || name == "up" || recorded.contains(&name),
                "{place}: {name} is neither the operator's metric nor recorded"
            );
        }
    }
}

/// With deploy/default the component adds three PodMonitors selecting the three workloads' pods
/// on their `ops` port, the PrometheusRule and the dashboard's ConfigMap, all in smolvm-system;
/// deploy/default alone has none of them.
#[test]
pub(super) fn the_monitoring_component_renders_with_the_default_install_and_is_off_by_default() {
    require_kubectl!();
    for kind in ["PodMonitor", "PrometheusRule"] {
        assert_eq!(
            objects(rendered("default"), kind).count(),
            0,
            "{kind} in deploy/default"
        );
    }
    let all = with_component("default", "monitoring");
    let workloads = workloads(&all);
    let mut monitored = BTreeSet::new();
    for monitor in objects(&all, "PodMonitor") {
        let what = describe(monitor);
        assert_eq!(str_at(monitor, "/apiVersion"), "monitoring.coreos.com/v1", "{what}");
        assert_eq!(str_at(monitor, "/metadata/namespace"), NAMESPACE, "{what}");
        let selector: LabelSelector = typed(&monitor["spec"]["selector"]);
        let matches: Vec<&(String, PodTemplateSpec)> = workloads
            .iter()
            .filter(|(name, _)| selects(&selector, &pod_labels(&all, name)))
            .collect();
        assert_eq!(matches.len(), 1, "{what}: selects {} workloads", matches.len());
        let (workload, template) = matches[0];
        let port = str_at(monitor, "/spec/podMetricsEndpoints/0/port");
        let ports: Vec<String> = pod_spec(template, workload)
            .containers
            .iter()
            .flat_map(|c| c.ports.clone().unwrap_or_default())
            .filter_map(|p| p.name)
            .collect();
        assert!(
            ports.contains(&port.to_string()),
            "{what}: {workload} has no port {port}"
        );
        assert_eq!(
            str_at(monitor, "/spec/podMetricsEndpoints/0/path"),
            "/metrics",
            "{what}"
        );
        let job_label = str_at(monitor, "/spec/jobLabel");
        assert_eq!(
            pod_labels(&all, workload).get(job_label).map(String::as_str),
            Some(workload.as_str()),
            "{what}: the job label is the workload's name, as the alerts expect"
        );
        monitored.insert(workload.clone());
    }
    assert_eq!(
        monitored,
        [WEBHOOK, CONTROLLER, RUNTIME]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
    let rule = find(&all, "PrometheusRule", "smolvm-operator");
    assert_eq!(str_at(rule, "/metadata/namespace"), NAMESPACE);
    assert_eq!(
        rule["spec"],
        monitoring::prometheus_rule().expect("the rule")["spec"],
        "rendered as written"
    );
    let dashboard: ConfigMap = typed(find(&all, "ConfigMap", "smolvm-grafana-dashboard"));
    assert_eq!(dashboard.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(
        dashboard
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("grafana_dashboard"))
            .map(String::as_str),
        Some("1")
    );
    let json = dashboard
        .data
        .as_ref()
        .and_then(|d| d.get("smolvm-operator.json"))
        .expect("the dashboard's JSON");
    let parsed: Value = serde_json::from_str(json).expect("dashboard JSON");
    assert_eq!(parsed, monitoring::dashboard().expect("dashboard"));
}
