//! `ReadinessProbe` against real Envoy in a test netns: ports read through sock_diag, then one
//! `/stats` request on a kept-alive admin connection; the filter's stat under the configured
//! prefix; the DNS port's TCP + UDP sockets; and no admin error counted on the way.

mod support;

use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use holdfast::config::{HoldSettings, ProxyConfig};
use holdfast::effects::envoy_admin::DEFAULT_ADMIN_ADDR;
use holdfast::lifecycle::readiness::{
    ProbeOptions, Readiness, ReadinessProbe, DEFAULT_STAT_PREFIX,
};
use support::{privileged, TestNetns};

fn workspace_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

/// Envoy in the netns: admin on 15000, listeners on 15001 and 15006 (with the holdfast filter
/// when `filter`), `--concurrency 2`. Killed on drop.
struct Envoy(Child, PathBuf);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn listener(name: &str, port: u16, filter: Option<&PathBuf>) -> String {
    let wasm = filter.map_or(String::new(), |path| {
        format!(
            r#"
        - name: envoy.filters.network.wasm
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm
            config:
              name: holdfast
              root_id: holdfast
              vm_config:
                runtime: envoy.wasm.runtime.v8
                code: {{ local: {{ filename: "{}" }} }}"#,
            path.display()
        )
    });
    format!(
        r#"
  - name: {name}
    address: {{ socket_address: {{ address: 0.0.0.0, port_value: {port} }} }}
    filter_chains:
    - filters:{wasm}
        - name: envoy.filters.network.direct_response
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.network.direct_response.v3.Config
            response: {{ inline_string: "hi" }}"#
    )
}

fn start_envoy(t: &TestNetns, filter: Option<&PathBuf>) -> Result<Envoy> {
    let binary = support::envoy_binary();
    ensure!(binary.exists(), "no Envoy at {}", binary.display());
    let dir = std::env::temp_dir().join(format!("hf-readiness-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("envoy.yaml");
    std::fs::write(
        &config,
        format!(
            "admin:\n  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 15000 }} }}\nstatic_resources:\n  listeners:{}{}\n",
            listener("outbound", 15001, filter),
            listener("inbound", 15006, filter)
        ),
    )?;
    let child = t
        .command(&binary)
        .arg("-c")
        .arg(&config)
        .args([
            "--disable-hot-restart",
            "-l",
            "warning",
            "--concurrency",
            "2",
        ])
        .arg("--base-id")
        .arg((std::process::id() % 60000 + 1000).to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting envoy")?;
    Ok(Envoy(child, dir))
}

fn options(prefix: &str, dns_port: Option<u16>, errors: &Arc<AtomicUsize>) -> ProbeOptions {
    let errors = errors.clone();
    ProbeOptions {
        stat_prefix: prefix.to_string(),
        dns_port,
        on_admin_error: Some(Arc::new(move |kind| {
            eprintln!("admin error counted: {kind}");
            errors.fetch_add(1, Ordering::Relaxed);
        })),
    }
}

async fn wait_for(probe: &ReadinessProbe, want: Readiness, within: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let seen = probe.check().await;
        if seen == want {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < within,
            "still {seen:?} after {within:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn real_envoy_with_the_filter_in_a_netns() -> Result<()> {
    if !privileged("real_envoy_with_the_filter_in_a_netns") {
        return Ok(());
    }
    let wasm = workspace_file("target/holdfast_filter.wasm");
    ensure!(
        wasm.exists(),
        "no filter at {}: build it (see COMMON.md)",
        wasm.display()
    );
    let t = TestNetns::new("hf-ready")?;
    let errors = Arc::new(AtomicUsize::new(0));
    let proxy = holdfast::mesh::istio::profile(&ProxyConfig::default());
    let strict = HoldSettings {
        require_filter: true,
        ..HoldSettings::default()
    };
    let lax = HoldSettings::default();
    let probe = ReadinessProbe::new(
        &t.ns,
        DEFAULT_ADMIN_ADDR,
        &proxy,
        &strict,
        options(DEFAULT_STAT_PREFIX, None, &errors),
    )?;
    // Nothing listens: the admin API is not even asked (so no refused connection is counted).
    ensure!(probe.check().await == Readiness::PortsClosed);
    // Only the admin port listens: Envoy runs, its capture ports are not open yet.
    let admin_only =
        t.ns.run(|| std::net::TcpListener::bind(DEFAULT_ADMIN_ADDR))??;
    ensure!(probe.check().await == Readiness::Starting);
    // ... and the admin connection is opened ahead, without a request.
    admin_only.set_nonblocking(true)?;
    ensure!(
        admin_only.accept().is_ok(),
        "no admin connection opened ahead while Envoy starts"
    );
    drop(admin_only);
    // Once seen, the admin port is not looked up again (an Envoy that exits and comes back is
    // starting): the check stays one lookup.
    ensure!(probe.check().await == Readiness::Starting);

    let _envoy = start_envoy(&t, Some(&wasm))?;
    let took = wait_for(&probe, Readiness::Ready, Duration::from_secs(30)).await?;
    println!("ready {took:?} after Envoy was started");

    // The one request's answer: Envoy's own gauges and the filter's, under the prefix.
    let stats = probe
        .admin()
        .stats(Some(&holdfast::lifecycle::readiness::stats_filter(
            DEFAULT_STAT_PREFIX,
        )))
        .await?;
    println!("{stats:?}");
    ensure!(stats.get("server.state") == Some(0), "{stats:?}");
    ensure!(stats.get("server.concurrency") == Some(2), "{stats:?}");
    ensure!(
        stats.get(&format!("{DEFAULT_STAT_PREFIX}.loaded")) == Some(1)
            || stats.get(&format!("{DEFAULT_STAT_PREFIX}.workers_ready")) >= Some(2),
        "{stats:?}"
    );

    // Kept alive: many checks, (almost) no new admin connections.
    let cx = |s: &holdfast::effects::envoy_admin::Stats| s.get("http.admin.downstream_cx_total");
    let before = cx(&probe
        .admin()
        .stats(Some("^http\\.admin\\.downstream_cx_total$"))
        .await?);
    let started = Instant::now();
    for _ in 0..50 {
        ensure!(probe.check().await == Readiness::Ready);
    }
    println!(
        "one ready check (sock_diag + one /stats on the kept-alive connection): {:?} on average",
        started.elapsed() / 50
    );
    let started = Instant::now();
    for _ in 0..50 {
        probe.admin().ready().await?;
    }
    println!(
        "GET /ready on the kept-alive connection: {:?} on average",
        started.elapsed() / 50
    );
    let filter = holdfast::lifecycle::readiness::stats_filter(DEFAULT_STAT_PREFIX);
    let started = Instant::now();
    for _ in 0..50 {
        probe.admin().stats(Some(&filter)).await?;
    }
    println!(
        "GET /stats?filter= on the kept-alive connection: {:?} on average",
        started.elapsed() / 50
    );
    let diag = holdfast::effects::procfs::sock_diag::SockDiag::open_in(&t.ns)?;
    let started = Instant::now();
    for _ in 0..50 {
        diag.tcp_listening_ports()?;
    }
    println!(
        "sock_diag TCP LISTEN: {:?} on average",
        started.elapsed() / 50
    );
    let started = Instant::now();
    for _ in 0..50 {
        ensure!(probe.check().await == Readiness::Ready);
    }
    println!("ready check again: {:?} on average", started.elapsed() / 50);
    let after = cx(&probe
        .admin()
        .stats(Some("^http\\.admin\\.downstream_cx_total$"))
        .await?);
    ensure!(
        before.is_some() && after.is_some_and(|a| a <= before.unwrap_or(0) + 1),
        "50 checks opened {before:?} -> {after:?} admin connections"
    );

    // Another prefix: no filter stat there. Strict: not ready; lax: ready.
    let other = ReadinessProbe::new(
        &t.ns,
        DEFAULT_ADMIN_ADDR,
        &proxy,
        &strict,
        options("wasmcustom.elsewhere", None, &errors),
    )?;
    ensure!(other.check().await == Readiness::FilterNotLoaded);
    let other_lax = ReadinessProbe::new(
        &t.ns,
        DEFAULT_ADMIN_ADDR,
        &proxy,
        &lax,
        options("wasmcustom.elsewhere", None, &errors),
    )?;
    ensure!(other_lax.check().await == Readiness::Ready);

    // DNS capture: a TCP listener alone is not enough, TCP + UDP is (Envoy runs meanwhile:
    // `Starting` until pilot-agent's DNS port is open too).
    let dns = ReadinessProbe::new(
        &t.ns,
        DEFAULT_ADMIN_ADDR,
        &proxy,
        &strict,
        options(DEFAULT_STAT_PREFIX, Some(15053), &errors),
    )?;
    ensure!(dns.check().await == Readiness::Starting);
    let tcp = t.ns.run(|| TcpListener::bind("127.0.0.1:15053"))??;
    ensure!(dns.check().await == Readiness::Starting);
    let udp = t.ns.run(|| UdpSocket::bind("127.0.0.1:15053"))??;
    ensure!(dns.check().await == Readiness::Ready);
    drop(tcp);
    ensure!(dns.check().await == Readiness::Starting);
    drop(udp);

    // Kuma's builtin DNS (on by default): kuma-dp's DNS proxy serves UDP only (kumahq/kuma
    // app/kuma-dp/pkg/dataplane/dnsproxy/component.go `Net: "udp"`, v2.14.3), so its bound UDP
    // socket alone makes the pod ready; no TCP listener is ever there to wait for.
    let kuma = holdfast::mesh::kuma::profile();
    ensure!((kuma.outbound_port, kuma.inbound_port) == (proxy.outbound_port, proxy.inbound_port));
    let kuma_dns = ReadinessProbe::new(
        &t.ns,
        DEFAULT_ADMIN_ADDR,
        &kuma,
        &strict,
        options(DEFAULT_STAT_PREFIX, Some(15054), &errors),
    )?;
    ensure!(kuma_dns.check().await == Readiness::Starting);
    let udp = t.ns.run(|| UdpSocket::bind("127.0.0.1:15054"))??;
    ensure!(
        kuma_dns.check().await == Readiness::Ready,
        "a Kuma pod's UDP-only DNS proxy is not judged ready"
    );
    drop(udp);
    ensure!(kuma_dns.check().await == Readiness::Starting);

    ensure!(
        errors.load(Ordering::Relaxed) == 0,
        "admin errors counted on a normal start"
    );
    Ok(())
}
