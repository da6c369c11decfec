//! Monitoring (issue 33): a real Prometheus (Debian's `prometheus` package) runs beside the node,
//! inside the sandbox, on a port of its own (the agent's ops listener holds 9090 on the host
//! network), configured from deploy/components/monitoring: its PodMonitors turned into scrape
//! configurations as prometheus-operator would (the harness discovers the pods, since Debian's
//! Prometheus has no Kubernetes discovery), its PrometheusRule's groups loaded as they ship.
//! Prometheus scrapes the three binaries' pods; the webhook is then scaled to zero and
//! SmolVMWebhookDown goes pending, then firing. The scenario prints how long each step took.

use std::collections::BTreeMap;

use smolvm_tests::{
    env::http_get,
    monitoring,
    process::{Proc, free_port},
};

use super::*;

/// How often the harness rewrites the discovered targets and asks Prometheus for its alerts.
const POLL: Duration = Duration::from_secs(1);
/// Rules are evaluated this often (prometheus-operator's default is 30s).
const EVALUATION_INTERVAL: &str = "15s";

/// Prometheus and what it was configured from.
struct Prometheus {
    _proc: Proc,
    addr: String,
    dir: PathBuf,
    monitors: Vec<Value>,
}

impl Prometheus {
    /// Writes the configuration and rules from the component and starts Prometheus.
    async fn start(ctx: &Ctx) -> anyhow::Result<Self> {
        let program = assets::on_path("prometheus").context(
            "no prometheus on PATH (Debian's prometheus package; tests/scripts/cluster-deps.sh installs it)",
        )?;
        let dir = ctx.node.dir.join("prometheus");
        std::fs::create_dir_all(dir.join("data"))?;
        let monitors = monitoring::pod_monitors()?;
        let rules = dir.join("rules.yaml");
        std::fs::write(&rules, monitoring::rules_file()?)?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            monitoring::prometheus_config(&dir, &rules, EVALUATION_INTERVAL)?,
        )?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        let prometheus = Self {
            _proc: Proc::spawn(
                "prometheus",
                &program,
                [
                    format!("--config.file={}", config.display()),
                    format!("--storage.tsdb.path={}", dir.join("data").display()),
                    format!("--web.listen-address={addr}"),
                ],
                &[],
                &dir.join("prometheus.log"),
            )?,
            addr,
            dir,
            monitors,
        };
        prometheus.discover(ctx).await?;
        eventually("Prometheus ready", Duration::from_secs(60), || async {
            Ok(http_get(&prometheus.addr, "/-/ready")
                .await
                .is_ok_and(|(code, _)| code == 200)
                .then_some(()))
        })
        .await?;
        Ok(prometheus)
    }

    /// What Prometheus's pod discovery would see now, written to each PodMonitor's targets file
    /// (replaced whole, so Prometheus never reads half a file).
    async fn discover(&self, ctx: &Ctx) -> anyhow::Result<()> {
        for monitor in &self.monitors {
            let mut pods = Vec::new();
            for namespace in monitoring::namespaces(monitor) {
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
                pods.extend(api.list(&ListParams::default()).await?.items);
            }
            let file = monitoring::targets_file(&self.dir, monitor);
            let partial = file.with_extension("json.new");
            std::fs::write(&partial, serde_json::to_vec(&monitoring::pod_targets(&pods))?)?;
            std::fs::rename(&partial, &file)?;
        }
        Ok(())
    }

    /// `GET /api/v1/{path}` as JSON (its `data`). Asked in HTTP/1.0, so that Prometheus answers
    /// with the whole body and closes instead of chunking it.
    async fn api(&self, path: &str) -> anyhow::Result<Value> {
        let (code, body) = http10_get(&self.addr, &format!("/api/v1/{path}")).await?;
        ensure!(code == 200, "Prometheus /api/v1/{path}: HTTP {code}: {body}");
        let value: Value = serde_json::from_str(&body).context("Prometheus's answer is not JSON")?;
        Ok(value["data"].clone())
    }

    /// The state of an alert (`pending`, `firing`), if it is active.
    async fn alert_state(&self, name: &str) -> anyhow::Result<Option<String>> {
        let alerts = self.api("alerts").await?;
        Ok(alerts["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["labels"]["alertname"] == name)
            .and_then(|a| a["state"].as_str())
            .map(str::to_string))
    }
}

/// `GET http://{addr}{path}` in HTTP/1.0: the status code and the body.
pub(super) async fn http10_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut buf))
        .await
        .with_context(|| format!("{addr} did not answer in 30 s"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no HTTP status from {addr}{path}"))?;
    Ok((code, body.to_string()))
}

/// Each rule group's last evaluation time, as Prometheus's rules API reports it.
fn last_evaluations(rules: &Value) -> BTreeMap<String, String> {
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| {
            Some((
                g["name"].as_str()?.to_string(),
                g["lastEvaluation"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Healthy targets per job.
fn healthy_by_job(targets: &Value) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for target in targets["activeTargets"].as_array().into_iter().flatten() {
        if target["health"] == "up" {
            let job = target["labels"]["job"].as_str().unwrap_or_default().to_string();
            *out.entry(job).or_default() += 1;
        }
    }
    out
}

/// A real Prometheus scrapes the three binaries with the component's rules; the webhook scaled to
/// zero makes SmolVMWebhookDown go pending, then firing.
pub(super) async fn prometheus_scrapes_the_pods_and_fires_webhook_down_when_the_webhook_stops(
    ctx: &mut Ctx,
) -> anyhow::Result<()> {
    all_pods_ready(ctx).await?;
    let started = Instant::now();
    let prometheus = Prometheus::start(ctx).await?;
    let log = prometheus.dir.join("prometheus.log");
    let expected: BTreeMap<String, usize> = [("smolvm-controller", 2), ("smolvm-runtime", 1), ("smolvm-webhook", 2)]
        .into_iter()
        .map(|(job, n)| (job.to_string(), n))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        prometheus.discover(ctx).await?;
        let (healthy, seen) = match prometheus.api("targets").await {
            Ok(targets) => (healthy_by_job(&targets), targets.to_string()),
            Err(e) => (BTreeMap::new(), format!("{e:#}")),
        };
        if healthy == expected {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "healthy targets by job {healthy:?}, not {expected:?} after 180 s; targets: {}\n{}",
                seen.chars().take(2000).collect::<String>(),
                indent(&smolvm_tests::process::tail(&log, 20))
            );
        }
        tokio::time::sleep(POLL).await;
    }
    // An alert read now would be the rules' judgement of the scrapes before the targets turned
    // healthy (SmolVMWebhookDown is `absent(up == 1)`, true until the first scrape): wait until
    // every rule group was evaluated again since.
    let evaluated_before = last_evaluations(&prometheus.api("rules").await?);
    eventually(
        "every rule group evaluated after the targets turned healthy",
        Duration::from_secs(90),
        || async {
            let now = last_evaluations(&prometheus.api("rules").await?);
            let all_newer = !now.is_empty()
                && now
                    .iter()
                    .all(|(group, at)| evaluated_before.get(group).is_none_or(|before| at != before));
            Ok(all_newer.then_some(()))
        },
    )
    .await?;
    // One of the two controller replicas leads, as the Lease says, and the gauge shows it.
    eventually(
        "sum(smolvm_controller_leader) == 1 in Prometheus",
        Duration::from_secs(90),
        || async {
            let result = prometheus.api("query?query=sum(smolvm_controller_leader)").await?;
            let value = result["result"][0]["value"][1].as_str().unwrap_or_default().to_string();
            Ok((value == "1").then_some(()))
        },
    )
    .await?;
    let rules = prometheus.api("rules").await?;
    let loaded: Vec<&str> = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter(|r| r["type"] == "alerting")
        .filter_map(|r| r["name"].as_str())
        .collect();
    ensure!(
        loaded.len() == monitoring::alerts()?.len(),
        "{} alerting rules loaded, the component has {}",
        loaded.len(),
        monitoring::alerts()?.len()
    );
    ensure!(
        prometheus.alert_state("SmolVMWebhookDown").await?.is_none(),
        "SmolVMWebhookDown is active while both webhook pods are scraped"
    );
    let active: Vec<String> = prometheus.api("alerts").await?["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "{} ({})",
                a["labels"]["alertname"].as_str().unwrap_or_default(),
                a["state"].as_str().unwrap_or_default()
            )
        })
        .collect();
    println!(
        "    Prometheus {} scrapes {expected:?} (healthy after {:.1}s), {} alerting rules loaded; active now: {active:?}",
        prometheus.addr,
        started.elapsed().as_secs_f64(),
        loaded.len()
    );

    kubectl_ok(
        ctx,
        &["-n", NS, "scale", "deployment/smolvm-webhook", "--replicas=0"],
        None,
    )?;
    let stopped = Instant::now();
    let (mut gone, mut pending, mut firing) = (None, None, None);
    let deadline = stopped + Duration::from_secs(360);
    while firing.is_none() {
        prometheus.discover(ctx).await?;
        if gone.is_none() && pods(ctx, "smolvm-webhook").await?.is_empty() {
            gone = Some(stopped.elapsed());
        }
        match prometheus.alert_state("SmolVMWebhookDown").await?.as_deref() {
            Some("pending") if pending.is_none() => pending = Some(stopped.elapsed()),
            Some("firing") => firing = Some(stopped.elapsed()),
            _ => {}
        }
        if Instant::now() > deadline {
            bail!("SmolVMWebhookDown not firing 360 s after the webhook was scaled to 0 (pending after {pending:?})");
        }
        tokio::time::sleep(POLL).await;
    }
    let secs = |d: Option<Duration>| d.map_or("never seen".to_string(), |d| format!("{:.1}s", d.as_secs_f64()));
    println!(
        "    webhook scaled to 0: its pods gone after {}; SmolVMWebhookDown pending after {}, firing after {} (for: 2m, rules evaluated every {EVALUATION_INTERVAL})",
        secs(gone),
        secs(pending),
        secs(firing)
    );
    ensure!(
        pending.is_some(),
        "SmolVMWebhookDown was never seen pending before it fired"
    );

    kubectl_ok(
        ctx,
        &["-n", NS, "scale", "deployment/smolvm-webhook", "--replicas=2"],
        None,
    )?;
    let restored = Instant::now();
    all_pods_ready(ctx).await?;
    let mut resolved = None;
    while restored.elapsed() < Duration::from_secs(120) {
        prometheus.discover(ctx).await?;
        if prometheus.alert_state("SmolVMWebhookDown").await?.is_none() {
            resolved = Some(restored.elapsed());
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    println!(
        "    webhook scaled back to 2: SmolVMWebhookDown resolved after {}",
        secs(resolved)
    );
    Ok(())
}
