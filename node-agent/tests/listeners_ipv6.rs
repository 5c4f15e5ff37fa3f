//! The agent's pod on an IPv6-only cluster (issue 30): the kubelet probes the pod's IPv6
//! address, so the DaemonSet's health and metrics listeners must take IPv6 — and IPv4 where the
//! pod has it (dual-stack). The real agent binary runs in a network namespace of its own with
//! the listen addresses of `manifests/agent/daemonset.yaml` as written there, an IPv6-only veth
//! to the host (the node), and is probed from the host the way the kubelet's HTTP prober does
//! (a new connection to `http://<pod IP>:<port><path>`, success on 200–399;
//! kubernetes/kubernetes pkg/probe/http/http.go `DoHTTPProbe`). The control beside it: an agent
//! with today's `0.0.0.0` health listener in the same pod is refused on the pod's IPv6 address,
//! which is why the agent restarted forever there.

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{privileged, run, TestNetns};

/// The value after `flag` in the DaemonSet's container args.
fn daemonset_arg(flag: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/agent/daemonset.yaml");
    let text = std::fs::read_to_string(&path).expect("manifests/agent/daemonset.yaml");
    let mut lines = text.lines().map(str::trim);
    while let Some(l) = lines.next() {
        if l == format!("- {flag}") {
            let v = lines.next().expect("a value after the flag");
            return v.trim_start_matches("- ").trim_matches('"').to_string();
        }
    }
    panic!("{flag} is not in the DaemonSet's args")
}

/// The agent process, killed on drop (also on panic).
struct Agent(Child, PathBuf);
impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn start_agent(ns: &TestNetns, name: &str, listen: &[(&str, String)]) -> Agent {
    let dir = std::env::temp_dir().join(format!("hf-v6probe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pods = dir.join("pods");
    std::fs::create_dir_all(&pods).unwrap();
    let mut cmd = ns.command(Path::new(env!("CARGO_BIN_EXE_holdfast")));
    cmd.args(["agent", "--node-name", "node-a", "--pods-dir"])
        .arg(&pods)
        // An empty proc root: nothing on the node is touched.
        .arg("--proc-root")
        .arg(&dir)
        .env("HOLDFAST_LOG", "holdfast=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (flag, value) in listen {
        cmd.args([*flag, value.as_str()]);
    }
    Agent(cmd.spawn().expect("starting the agent"), dir)
}

/// One kubelet-style HTTP probe: a new connection, `GET path`, the status code.
fn probe(addr: SocketAddr, path: &str) -> Result<u16, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.35\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {out:?}"))
}

/// Probes until a 2xx/3xx answer or `within` passes; the last outcome.
fn probe_until_ok(addr: SocketAddr, path: &str, within: Duration) -> Result<u16, String> {
    let deadline = Instant::now() + within;
    loop {
        let r = probe(addr, path);
        if matches!(r, Ok(200..=399)) || Instant::now() >= deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The host's end of the pod's veth, deleted on drop (the netns' end goes with the netns).
struct HostLink(String);
impl Drop for HostLink {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

#[test]
fn an_ipv6_only_agent_pod_answers_the_kubelets_probes() {
    if !privileged("an_ipv6_only_agent_pod_answers_the_kubelets_probes") {
        return;
    }
    let health: SocketAddr = daemonset_arg("--health-listen").parse().unwrap();
    let metrics: SocketAddr = daemonset_arg("--metrics-listen").parse().unwrap();
    let status = daemonset_arg("--status-listen");

    let ns = TestNetns::new("hf-v6probe").expect("netns");
    // Per process, so concurrent checkouts never share an address or a link name.
    let tag = std::process::id() & 0xffff;
    let host_if = format!("hf6h{tag:x}");
    run(
        "ip",
        &[
            "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ],
    )
    .expect("veth");
    let _link = HostLink(host_if.clone());
    let node_ip = format!("fd68:6f6c:{tag:x}::1");
    let pod_ip: IpAddr = format!("fd68:6f6c:{tag:x}::2").parse().unwrap();
    run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{node_ip}/64"),
            "dev",
            &host_if,
            "nodad",
        ],
    )
    .unwrap();
    run("ip", &["link", "set", &host_if, "up"]).unwrap();
    // The pod's interface: IPv6 only (its loopback has 127.0.0.1, as every pod's).
    ns.ip(&[
        "addr",
        "add",
        &format!("{pod_ip}/64"),
        "dev",
        "eth0",
        "nodad",
    ])
    .unwrap();
    ns.ip(&["link", "set", "eth0", "up"]).unwrap();
    let v4 = ns.ip(&["-4", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(!v4.contains("inet "), "the pod has no IPv4 address: {v4}");

    let _agent = start_agent(
        &ns,
        "manifest",
        &[
            ("--status-listen", status),
            ("--health-listen", health.to_string()),
            ("--metrics-listen", metrics.to_string()),
        ],
    );
    // The DaemonSet's probes: liveness /healthz and readiness /readyz on port `health`.
    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            probe_until_ok(
                SocketAddr::new(pod_ip, health.port()),
                path,
                Duration::from_secs(15)
            ),
            Ok(200),
            "{path} on the pod's IPv6 address"
        );
    }
    assert_eq!(
        probe(SocketAddr::new(pod_ip, metrics.port()), "/metrics"),
        Ok(200),
        "Prometheus on the pod's IPv6 address"
    );

    // The control: today's `0.0.0.0` listener, in the same pod, is refused on that address.
    let control_port = health.port() + 100;
    let _control = start_agent(
        &ns,
        "control",
        &[
            ("--status-listen", format!("127.0.0.1:{}", control_port + 1)),
            ("--health-listen", format!("0.0.0.0:{control_port}")),
        ],
    );
    // It is up: it answers on its loopback listener inside the pod.
    let control_up = ns
        .ns
        .run(move || {
            probe_until_ok(
                SocketAddr::new([127, 0, 0, 1].into(), control_port),
                "/healthz",
                Duration::from_secs(15),
            )
        })
        .unwrap();
    assert_eq!(control_up, Ok(200), "the control agent runs");
    let refused = probe(SocketAddr::new(pod_ip, control_port), "/healthz");
    assert!(
        refused.is_err(),
        "0.0.0.0 must not answer on the pod's IPv6 address: {refused:?}"
    );

    // Dual-stack: once the pod has an IPv4 address too, the same listener answers on it.
    let (node_v4, pod_v4) = (
        format!("10.253.{}.1", tag % 250),
        format!("10.253.{}.2", tag % 250),
    );
    run(
        "ip",
        &["addr", "add", &format!("{node_v4}/30"), "dev", &host_if],
    )
    .unwrap();
    ns.ip(&["addr", "add", &format!("{pod_v4}/30"), "dev", "eth0"])
        .unwrap();
    let pod_v4: IpAddr = pod_v4.parse().unwrap();
    assert_eq!(
        probe_until_ok(
            SocketAddr::new(pod_v4, health.port()),
            "/healthz",
            Duration::from_secs(5)
        ),
        Ok(200),
        "the same listener on the pod's IPv4 address"
    );
    assert_eq!(
        probe(SocketAddr::new(pod_v4, metrics.port()), "/metrics"),
        Ok(200)
    );
}
