//! Monitoring (issue 33): every metric name the alerting and recording rules and the Grafana
//! dashboard of deploy/components/monitoring select is one the three binaries really expose on
//! their /metrics (or one a rule records, or Prometheus's own `up`), so a renamed metric cannot
//! leave a dead panel or a silent alert.

use std::collections::BTreeSet;

use anyhow::{Context as _, ensure};
use smolvm_tests::{
    env::{self, Env},
    monitoring,
};

use crate::Scenario;

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![every_metric_the_rules_and_the_dashboard_name_is_exposed]
}

/// The three binaries' /metrics against every query of the component.
pub(crate) async fn every_metric_the_rules_and_the_dashboard_name_is_exposed(env: &mut Env) -> anyhow::Result<()> {
    if env.webhook.is_none() {
        env.start_webhook().await?;
    }
    if env.controller.is_none() {
        env.start_controller().await?;
    }
    if env.runtime.is_none() {
        env.start_runtime().await?;
    }
    let mut exposed = BTreeSet::new();
    for (binary, prefix) in [
        ("smolvm-webhook", "smolvm_webhook_"),
        ("smolvm-controller", "smolvm_controller_"),
        ("smolvm-runtime", "smolvm_runtime_"),
    ] {
        let addr = env
            .ops
            .get(binary)
            .with_context(|| format!("{binary}: no ops address"))?;
        let (code, body) = env::http_get(addr, "/metrics").await?;
        ensure!(code == 200, "{binary} /metrics: HTTP {code}");
        let names = monitoring::exposed_names(&body);
        ensure!(
            names.iter().all(|n| n.starts_with(prefix)),
            "{binary} exposes names outside {prefix}: {names:?}"
        );
        println!("    {binary}: {} sample names on /metrics", names.len());
        exposed.extend(names);
    }
    let unknown = monitoring::unknown_names(&exposed)?;
    ensure!(unknown.is_empty(), "names no binary exposes (place, name): {unknown:?}");
    let queries = monitoring::queries()?;
    let used: BTreeSet<String> = queries.iter().flat_map(|(_, q)| monitoring::metric_names(q)).collect();
    println!(
        "    {} queries (rules and panels) select {} names, each exposed, recorded or `up`",
        queries.len(),
        used.len()
    );
    Ok(())
}
