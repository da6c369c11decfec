//! Hostile clients (issue 30): slow clients never take the webhook's review capacity. Forty
//! clients open TLS connections to the webhook and send a review body one byte a second,
//! reconnecting whenever they are shed, while real server-side dry-run creates go through
//! kube-apiserver (which calls the webhook over HTTP/2, with its own timeout) once a second for
//! 20 s: every one must succeed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use kube::api::PostParams;
use serde_json::json;
use smolvm_api::SmolVM;
use smolvm_tests::env::Env;
use tokio::io::AsyncWriteExt;

use crate::{Scenario, vm, vms};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![forty_trickling_review_bodies_refuse_no_write]
}

const TRICKLERS: usize = 40;
const WRITES: usize = 20;

/// One slow client: a review body announced at 100 kB and sent a byte a second, again and
/// again; counts the connections it opened.
async fn trickle(port: u16, tls: Arc<rustls::ClientConfig>, stop: Arc<AtomicBool>, opened: Arc<AtomicUsize>) {
    let connector = tokio_rustls::TlsConnector::from(tls);
    let Ok(name) = rustls::pki_types::ServerName::try_from("127.0.0.1") else {
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let Ok(mut stream) = connector.connect(name.clone(), tcp).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        let head = format!(
            "POST /validate/smolvms?timeout=10s HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        );
        if stream.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        while !stop.load(Ordering::Relaxed) {
            if stream.write_all(b" ").await.is_err() || stream.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Issue 30: forty reviews trickling their bodies; real dry-run creates all succeed.
pub(crate) async fn forty_trickling_review_bodies_refuse_no_write(env: &mut Env) -> anyhow::Result<()> {
    let tls = Arc::new(smolvm_certs::client_config(
        env.webhook_tls.ca.cert_pem(),
        None,
        &[b"http/1.1"],
    )?);
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let tricklers: Vec<_> = (0..TRICKLERS)
        .map(|_| tokio::spawn(trickle(env.webhook_port, tls.clone(), stop.clone(), opened.clone())))
        .collect();
    // Let the slow clients take whatever they can first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api = vms(env).await?;
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..WRITES {
        let tick = Instant::now();
        let object: SmolVM = serde_json::from_value(vm(
            &format!("trickle-{i}"),
            json!({"image": "alpine:3.20", "running": false}),
        ))?;
        let params = PostParams {
            dry_run: true,
            ..Default::default()
        };
        if let Err(e) = api.create(&params, &object).await {
            failures.push(format!("write {i}: {e}"));
        }
        slowest = slowest.max(tick.elapsed());
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tricklers {
        t.abort();
    }
    println!(
        "    {WRITES} dry-run creates in {:.1}s beside {TRICKLERS} trickling clients ({} connections opened, shed ones reopened): {} failed, slowest {:.0} ms",
        started.elapsed().as_secs_f64(),
        opened.load(Ordering::Relaxed),
        failures.len(),
        slowest.as_secs_f64() * 1000.0
    );
    ensure!(
        failures.is_empty(),
        "writes refused while slow clients trickled: {failures:#?}"
    );
    Ok(())
}
