//! The filter's module surface and its per-worker readiness, in real Envoy 1.40:
//! - the module exports only the callbacks the counting needs (Envoy skips the others);
//! - `holdfast.workers_ready` equals the number of worker threads (`--concurrency` 1, 2, 4, and
//!   Envoy's own `server.concurrency`), stays exact when a listener update brings a new plugin
//!   configuration (a new canary on the main thread), and falls to 0 when the filter goes;
//! - `direction` in the plugin configuration decides the direction whatever the listener says.
//!
//! Listeners come from a file (LDS `path_config_source`), replaced atomically to update them.
//! Loopback only; no root needed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use holdfast_tests::echo::EchoServer;
use holdfast_tests::envoy::{
    self, holdfast_filter, static_cluster, tcp_proxy_listener, Envoy, EnvoyOptions,
    TrafficDirection,
};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(10);

/// What the module exports: these and nothing else (each export Envoy finds, it calls).
const EXPORTS: [&str; 7] = [
    "_initialize",
    "proxy_abi_version_0_2_1",
    "proxy_on_configure",
    "proxy_on_context_create",
    "proxy_on_done",
    "proxy_on_memory_allocate",
    "proxy_on_tick",
];

#[test]
fn module_exports_only_the_callbacks_the_counting_needs() -> Result<()> {
    let wasm = envoy::filter_wasm()?;
    let exports = envoy::wasm_function_exports(&wasm)?;
    assert_eq!(exports, EXPORTS, "exports of {}", wasm.display());
    // Per connection Envoy enters the VM twice (context create, done), however many data
    // chunks pass: no data callback.
    for not_exported in [
        "proxy_on_downstream_data",
        "proxy_on_upstream_data",
        "proxy_on_new_connection",
        "proxy_on_log",
        "proxy_on_delete",
        "proxy_on_downstream_connection_close",
        "proxy_on_upstream_connection_close",
    ] {
        assert!(!exports.iter().any(|e| e == not_exported), "{not_exported}");
    }
    Ok(())
}

/// An LDS file Envoy watches; [`Lds::set`] replaces it atomically (write, then rename).
struct Lds<'a> {
    dir: &'a Path,
    version: u32,
}

impl Lds<'_> {
    fn path(dir: &Path) -> std::path::PathBuf {
        dir.join("lds.json")
    }

    fn set(&mut self, listeners: &[Value]) -> Result<()> {
        self.version += 1;
        let resources: Vec<Value> = listeners
            .iter()
            .map(|l| {
                let mut l = l.clone();
                l["@type"] = json!("type.googleapis.com/envoy.config.listener.v3.Listener");
                l
            })
            .collect();
        let doc = json!({ "version_info": self.version.to_string(), "resources": resources });
        let tmp = self.dir.join("lds.json.tmp");
        std::fs::write(&tmp, doc.to_string())?;
        std::fs::rename(&tmp, Lds::path(self.dir))?;
        Ok(())
    }
}

/// Envoy with `concurrency` workers, one echo cluster, and listeners from an LDS file.
fn start(dir: &Path, concurrency: u32, first: &[Value], echo: SocketAddr) -> Result<Envoy> {
    let mut lds = Lds { dir, version: 0 };
    lds.set(first)?;
    let bs = json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
        "node": { "id": "filter-workers", "cluster": "test" },
        "static_resources": { "clusters": [static_cluster("echo", echo)] },
        "dynamic_resources": { "lds_config": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": Lds::path(dir).display().to_string(),
                "watched_directory": { "path": dir.display().to_string() }
            }
        } }
    });
    let opts = EnvoyOptions {
        concurrency,
        label: format!("filter-workers-{concurrency}"),
        // A removed listener drains for this long before its filter (and root contexts) go.
        extra_args: ["--drain-time-s", "1"].map(Into::into).to_vec(),
        ..EnvoyOptions::default()
    };
    Envoy::start_value(&bs, &opts)
}

fn listener(name: &str, dir: Option<TrafficDirection>, filter: Value) -> Value {
    tcp_proxy_listener(
        name,
        dir,
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "echo",
        Some(filter),
    )
}

/// Polls until `holdfast.workers_ready == want`, then checks it stays there (never above).
fn expect_workers_ready(envoy: &Envoy, want: u64, what: &str) -> Result<()> {
    let admin = envoy.admin();
    admin
        .wait_holdfast_stat("workers_ready", want, SETTLE)
        .with_context(|| format!("{what}; log tail:\n{}", envoy.log_tail(20)))?;
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let now = admin.holdfast_stat("workers_ready")?;
        ensure!(now == Some(want), "{what}: workers_ready moved to {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn ping(addr: SocketAddr) -> Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"ping")?;
    let mut back = [0u8; 4];
    s.read_exact(&mut back)?;
    ensure!(&back == b"ping", "echo mismatch");
    Ok(s)
}

/// One run at `concurrency` workers; see the file's docs.
fn workers_ready_at(concurrency: u32) -> Result<()> {
    let wasm = envoy::filter_wasm()?;
    let echo = EchoServer::start()?;
    let scratch = envoy::ScratchDir::new(&format!("filter-lds-{concurrency}"))?;
    let dir = scratch.path();
    let plain = || holdfast_filter(&wasm, None);
    let first = [listener("in", Some(TrafficDirection::Inbound), plain())];
    let envoy = start(dir, concurrency, &first, echo.addr())?;
    let admin = envoy.admin();
    ensure!(
        admin.stat("server.concurrency")? == Some(u64::from(concurrency)),
        "server.concurrency = {:?}",
        admin.stat("server.concurrency")?
    );
    let want = u64::from(concurrency);
    expect_workers_ready(&envoy, want, "after startup")?;
    assert_eq!(admin.holdfast_stat("loaded")?, Some(1));

    // A listener update adding two listeners: one with the same plugin configuration, one with
    // another (`direction`: a new plugin, so a new canary runs on the main thread and every
    // thread configures one more root context). Still one ready VM per worker.
    let configured = holdfast_filter(&wasm, Some(r#"{"direction":"outbound"}"#));
    let mut lds = Lds { dir, version: 1 };
    lds.set(&[
        first[0].clone(),
        listener("out", Some(TrafficDirection::Outbound), plain()),
        listener(
            "cfg_in",
            Some(TrafficDirection::Inbound),
            configured.clone(),
        ),
        listener("cfg_none", None, configured),
    ])?;
    admin.wait_stat("listener_manager.total_listeners_active", 4, SETTLE)?;
    expect_workers_ready(&envoy, want, "after the listener update")?;

    // Counting still works per listener; the configured direction wins over the listener's.
    let _a = ping(envoy.listener_addr("in")?)?;
    let _b = ping(envoy.listener_addr("out")?)?;
    let _c = ping(envoy.listener_addr("cfg_in")?)?;
    let _d = ping(envoy.listener_addr("cfg_none")?)?;
    admin.wait_holdfast_stat("inbound.cx_active", 1, SETTLE)?;
    admin.wait_holdfast_stat("outbound.cx_active", 3, SETTLE)?;
    assert_eq!(admin.holdfast_stat("unknown.cx_total")?, Some(0));
    drop((_a, _b, _c, _d));
    admin.wait_holdfast_stat("outbound.cx_active", 0, SETTLE)?;

    // No listener left: every root context ends (after the 1 s drain) and the gauge falls to 0,
    // or is gone altogether once Envoy drops the last VM and with it the plugin's stats scope
    // (seen with Envoy 1.40): readers treat an absent gauge as 0.
    lds.set(&[])?;
    admin.wait_stat("listener_manager.total_listeners_active", 0, SETTLE)?;
    let mut last = None;
    envoy::poll_until(SETTLE, "workers_ready 0 or gone", || {
        last = admin.holdfast_stat("workers_ready")?;
        Ok(matches!(last, None | Some(0)).then_some(()))
    })
    .with_context(|| format!("after every listener was removed: last seen {last:?}"))?;
    println!(
        "--concurrency {concurrency}: with no listener left, workers_ready = {last:?}, loaded = {:?}",
        admin.holdfast_stat("loaded")?
    );
    Ok(())
}

#[test]
fn workers_ready_is_the_number_of_worker_threads() -> Result<()> {
    for concurrency in [1, 2, 4] {
        workers_ready_at(concurrency).with_context(|| format!("--concurrency {concurrency}"))?;
    }
    Ok(())
}

/// How long after `/ready` says LIVE the workers have the filter configured, from the outside:
/// one `/stats` request per poll reads `server.state` (0 = LIVE) and the gauge together.
/// Printed, not asserted as a bound (timing on a shared machine); asserts only that it happens.
#[test]
fn workers_ready_relative_to_live() -> Result<()> {
    let wasm = envoy::filter_wasm()?;
    let echo = EchoServer::start()?;
    for concurrency in [1, 2, 4] {
        let bs = envoy::bootstrap(
            vec![listener(
                "in",
                Some(TrafficDirection::Inbound),
                holdfast_filter(&wasm, None),
            )],
            vec![static_cluster("echo", echo.addr())],
        );
        let opts = EnvoyOptions {
            concurrency,
            label: format!("filter-live-{concurrency}"),
            ..EnvoyOptions::default()
        };
        let envoy = Envoy::spawn(&bs.to_string(), &opts)?;
        let re = r"^(server\.state|wasmcustom\.holdfast\.workers_ready)$";
        let start = Instant::now();
        let (mut live_at, mut ready_at) = (None, None);
        while (live_at.is_none() || ready_at.is_none()) && start.elapsed() < SETTLE {
            if let Ok(stats) = envoy.admin().stats_filtered(Some(re)) {
                let now = start.elapsed();
                let get = |k: &str| stats.get(k).and_then(|v| v.parse::<u64>().ok());
                if live_at.is_none() && get("server.state") == Some(0) {
                    live_at = Some(now);
                }
                if ready_at.is_none()
                    && get("wasmcustom.holdfast.workers_ready") == Some(u64::from(concurrency))
                {
                    ready_at = Some(now);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let (live, ready) = (
            live_at.context("never LIVE")?,
            ready_at.context("workers_ready never reached the concurrency")?,
        );
        println!(
            "--concurrency {concurrency}: LIVE seen at {live:?}, workers_ready == {concurrency} \
             seen at {ready:?} (ready - LIVE = {:+.1} ms)",
            (ready.as_secs_f64() - live.as_secs_f64()) * 1000.0
        );
    }
    Ok(())
}
