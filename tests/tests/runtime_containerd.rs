//! The simulated node's containerd backend: a private containerd (Debian's 1.6, CRI plugin), runc
//! and the CNI bridge plugin, driven over the CRI. The runtime itself, then a representative
//! subset of the end-to-end scenarios on real containers (every e2e file also runs whole on this
//! backend with `HOLDFAST_SIM_RUNTIME=containerd`): the startup failure without holdfast, the
//! hold with it, calls through shutdown with the drain, a Job that completes.

use std::time::{Duration, Instant};

use holdfast::report::board::{HoldOutcome, Phase as AgentPhase};
use holdfast_tests::agent::AgentProcess;
use holdfast_tests::cri::runtime_for;
use holdfast_tests::sim::pod_object::CState;
use holdfast_tests::sim::{
    AppScript, CallError, NodeOptions, Phase, PodPhase, PodSpec, Runtime, SimNode,
};
use k8s_cri::v1::*;

fn node(test: &str) -> SimNode {
    let opts = NodeOptions {
        sim_app: Some(env!("CARGO_BIN_EXE_sim-app").into()),
        runtime: Runtime::Containerd,
        ..NodeOptions::default()
    };
    SimNode::for_test(test, opts)
}

fn agent(node: &SimNode) -> AgentProcess {
    AgentProcess::for_node(node).expect("start the holdfast agent")
}

fn assert_clean(node: SimNode) {
    let left = node.finish();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// Failure 1 on real containers: the app's boot call goes out while Envoy is 2 s away; the
/// istio-init container's REDIRECT sends it to 15001 where nothing listens: refused, exit 1.
#[test]
fn containerd_startup_call_before_proxy_is_refused() {
    if runtime_for("containerd_startup_call_before_proxy_is_refused").is_none() {
        return;
    }
    let mut node = node("crstartup");
    node.add_pod(
        PodSpec::new("fetch-config")
            .app(AppScript::CallAtStart { calls: 1 })
            .proxy_delay(Duration::from_secs(2)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let view = node
        .wait_app_exited("fetch-config", Duration::from_secs(30))
        .expect("app exits");
    let report = node.report("fetch-config").expect("report");
    let startup = report.calls(Phase::Startup);
    assert!(
        startup.errors(CallError::ConnectionRefused) > 0,
        "expected refused startup calls, got {startup:?}"
    );
    assert_eq!(startup.ok, 0, "{startup:?}");
    assert_eq!(view.app().and_then(|c| c.exit_code()), Some(1));
    let init = view.init.as_ref().expect("init container");
    assert_eq!(
        init.exit_code(),
        Some(0),
        "istio-init ran iptables in the pod"
    );
    assert!(view.proxy().is_some_and(|c| c.is_running()));
    // Ids are the runtime's: 64 hex, as `containerd://<id>` in the Pod object.
    let id = view.app().and_then(|c| c.id.clone()).expect("id");
    assert!(id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit()));
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_slice(
        &std::fs::read(node.pods_dir().join("default_fetch-config.json")).expect("pod file"),
    )
    .expect("pod json");
    let statuses = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default();
    assert!(statuses
        .iter()
        .any(|s| s.container_id.as_deref() == Some(&format!("containerd://{id}"))));
    assert_clean(node);
}

/// The hold on real containers: with the agent, the same boot calls are held until Envoy is
/// ready and none is refused.
#[test]
#[ignore = "long form, `just test-all`: the agent's pod runs the `quota` profile's agent"]
fn containerd_startup_hold_proxy_two_seconds_late() {
    if runtime_for("containerd_startup_hold_proxy_two_seconds_late").is_none() {
        return;
    }
    let mut node = node("crhold");
    let agent = agent(&node);
    let late = Duration::from_secs(2);
    node.add_pod(
        PodSpec::new("boot")
            .app(AppScript::CallAtStart { calls: 3 })
            .proxy_delay(late)
            .call_timeout(late + Duration::from_secs(20)),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("boot", Duration::from_secs(40), "3 boot calls", |r| {
            r.calls(Phase::Startup).ok + r.calls(Phase::Startup).failed >= 3
        })
        .expect("the app makes its boot calls");
    let startup = report.calls(Phase::Startup);
    assert_eq!(startup.failed, 0, "boot calls failed: {startup:?}");
    assert_eq!(startup.ok, 3);
    assert_eq!(report.starts(), 1, "no restart needed");
    let row = agent
        .wait_pod(
            "default",
            "boot",
            Duration::from_secs(10),
            "hold released",
            |r| r.hold.as_ref().is_some_and(|h| h.outcome.is_some()),
        )
        .expect("agent status");
    let hold = row.hold.expect("a hold");
    assert_eq!(hold.outcome, Some(HoldOutcome::Ready), "{hold:?}");
    assert!(hold.connections_held >= 1, "{hold:?}");
    assert_eq!(row.phase, AgentPhase::Ready);
    drop(agent);
    assert_clean(node);
}

/// The drain on real containers: `StopContainer` on both containers at once; the app calls out
/// for 4 s after SIGTERM and every call works, because the agent keeps Envoy until the app is
/// done; the pod ends with the app, long before the 20 s drain duration.
#[test]
#[ignore = "long form, `just test-all`: the agent's pod runs the `quota` profile's agent"]
fn containerd_drain_waits_for_an_app_calling_through_shutdown() {
    if runtime_for("containerd_drain_waits_for_an_app_calling_through_shutdown").is_none() {
        return;
    }
    let mut node = node("crdrain");
    let agent = agent(&node);
    let grace = Duration::from_secs(20);
    node.add_pod(
        PodSpec::new("flusher")
            .app(AppScript::CallThroughShutdown {
                every: Duration::from_millis(200),
                pool: 2,
                after_sigterm: Duration::from_secs(4),
            })
            // A held connect() must not time out in the app (containers start slower).
            .call_timeout(Duration::from_secs(20))
            .grace(grace)
            .drain(grace),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    node.wait_report("flusher", Duration::from_secs(30), "calls", |r| {
        r.calls(Phase::Running).ok >= 3
    })
    .expect("the app reaches the remote service through Envoy");
    let t = Instant::now();
    node.delete_pod("flusher").expect("delete");
    node.wait_gone("flusher", Duration::from_secs(30))
        .expect("pod terminates");
    let took = t.elapsed();
    let report = node.report("flusher").expect("report");
    let after = report.calls(Phase::AfterSigterm);
    assert_eq!(after.failed, 0, "calls after SIGTERM failed: {after:?}");
    assert!(after.ok >= 10, "the app called for 4 s: {after:?}");
    assert_eq!(report.exit_codes(), vec![0]);
    eprintln!("containerd drain: pod gone {took:?} after delete");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(12),
        "the pod ends with the app, not after the 20 s drain: {took:?}"
    );
    drop(agent);
    assert_clean(node);
}

/// A Job on real containers: the app exits 0, the agent quits its proxy, the pod Succeeds.
#[test]
#[ignore = "long form, `just test-all`: the agent's pod runs the `quota` profile's agent"]
fn containerd_job_completes_when_its_app_exits() {
    if runtime_for("containerd_job_completes_when_its_app_exits").is_none() {
        return;
    }
    let mut node = node("crjob");
    let agent = agent(&node);
    node.add_pod(
        PodSpec::new("batch")
            .app(AppScript::Batch {
                calls: 3,
                exit_code: 0,
            })
            .call_timeout(Duration::from_secs(20))
            .job(),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let view = node
        .wait_phase("batch", PodPhase::Succeeded, Duration::from_secs(40))
        .expect("the Job's pod completes");
    assert_eq!(view.app().and_then(|c| c.exit_code()), Some(0));
    assert_eq!(view.proxy().and_then(|c| c.exit_code()), Some(0));
    let report = node.report("batch").expect("report");
    assert_eq!(report.all_calls().failed, 0, "{:?}", report.all_calls());
    node.delete_pod("batch").expect("delete");
    node.wait_gone("batch", Duration::from_secs(20))
        .expect("completed pod goes away");
    drop(agent);
    assert_clean(node);
}

/// A pod sandbox named `name` for pod `uid`, placed as kubelet's cgroupfs driver places it
/// (`/kubepods/besteffort/pod<uid>`), logs in `logs`: its config and id.
fn run_sandbox(
    rt: &holdfast_tests::cri::Containerd,
    name: &str,
    uid: &str,
    logs: &std::path::Path,
) -> (PodSandboxConfig, String) {
    let sandbox = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
            ..Default::default()
        }),
        log_directory: logs.to_string_lossy().into_owned(),
        ..Default::default()
    };
    let mut c = rt.client.clone();
    let id = rt
        .call(c.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        }))
        .expect("sandbox")
        .pod_sandbox_id;
    (sandbox, id)
}

/// An `app` container of the base image running `command` in sandbox `sb`, started: its id.
fn start_app(
    rt: &holdfast_tests::cri::Containerd,
    sb: &str,
    sandbox: PodSandboxConfig,
    command: Vec<String>,
) -> String {
    let mut c = rt.client.clone();
    let cid = rt
        .call(c.create_container(CreateContainerRequest {
            pod_sandbox_id: sb.into(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: holdfast_tests::cri::runtime::BASE_IMAGE.into(),
                    ..Default::default()
                }),
                command,
                log_path: "app.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox),
        }))
        .expect("create")
        .container_id;
    rt.call(c.start_container(StartContainerRequest {
        container_id: cid.clone(),
    }))
    .expect("start");
    cid
}

/// The runtime itself: a sandbox with a pod IP and a netns, a container placed in the pod's
/// cgroup as a kubelet with the cgroupfs driver places it, stopped with SIGTERM.
#[test]
fn sandbox_and_container_on_the_private_containerd() {
    let Some(rt) = runtime_for("sandbox_and_container_on_the_private_containerd") else {
        return;
    };
    let uid = holdfast_tests::sim::random_uuid();
    let logs = rt.dir.join(format!("smoke-{uid}"));
    std::fs::create_dir_all(&logs).expect("log dir");
    let (sandbox, sb) = run_sandbox(rt, "smoke", &uid, &logs);
    let mut c = rt.client.clone();
    let st = rt
        .call(c.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sb.clone(),
            verbose: true,
        }))
        .expect("status");
    let info = holdfast_tests::cri::status::parse_info(&st.info);
    let netns = holdfast_tests::cri::status::info_netns(&info).expect("netns path");
    let netns_s = netns.to_string_lossy();
    assert!(netns_s.starts_with("/var/run/netns/cni-"), "{netns_s}");
    assert!(netns.exists());
    assert!(holdfast_tests::cri::status::info_pid(&info).is_some());
    let ip = st
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    let ip: std::net::Ipv4Addr = ip.parse().expect("the sandbox has an IPv4 pod IP from CNI");
    assert_eq!(
        ip.octets()[..3],
        rt.gateway.octets()[..3],
        "pod IP on the CNI bridge's /24"
    );
    let cid = start_app(
        rt,
        &sb,
        sandbox,
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "cat /proc/self/cgroup; sleep 100".into(),
        ],
    );
    let log = logs.join("app.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut text = String::new();
    while !text.contains("0::") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        text = std::fs::read_to_string(&log).unwrap_or_default();
    }
    // CRI log format: `<RFC 3339> stdout F <line>`.
    eprintln!("the container's /proc/self/cgroup, as its CRI log has it:\n{text}");
    let want = format!("/kubepods/besteffort/pod{uid}/{cid}");
    assert!(
        text.lines()
            .any(|l| l.contains(" stdout F ") && l.ends_with(&want)),
        "cgroup lines name {want}"
    );
    let t = Instant::now();
    rt.call(c.stop_container(StopContainerRequest {
        container_id: cid.clone(),
        timeout: 2,
    }))
    .expect("stop");
    let st = rt
        .call(c.container_status(ContainerStatusRequest {
            container_id: cid.clone(),
            verbose: true,
        }))
        .expect("status");
    eprintln!("stopped in {:?}", t.elapsed());
    let st = st.status.expect("status");
    // StopContainer: SIGTERM, SIGKILL after the timeout (143 or 137 depending on whether the
    // shell, pid 1 of its own pid namespace, let SIGTERM end it); reason `Error` either way.
    assert_eq!(st.state(), ContainerState::ContainerExited);
    assert!(
        st.exit_code == 143 || st.exit_code == 137,
        "exit code {}",
        st.exit_code
    );
    assert_eq!(st.reason, "Error");
    rt.call(c.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .expect("stop sb");
    rt.call(c.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: sb }))
        .expect("rm sb");
    // The pod-level cgroup is kubelet's to remove, not the runtime's.
    let errors = holdfast_tests::cri::kubelet::remove_pod_cgroups(&uid);
    assert!(errors.is_empty(), "{errors:?}");
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    for root in left {
        let pod = root.join(format!("kubepods/besteffort/pod{uid}"));
        assert!(!pod.exists(), "{} left behind", pod.display());
    }
}

/// Run in a child process by [`a_killed_test_binarys_runtime_is_cleaned_up_by_the_next`]: a
/// runtime of its own with a pod sandbox and a running container, its directory printed, then
/// waits to be SIGKILLed (so no teardown runs).
#[test]
#[ignore = "a child process of a_killed_test_binarys_runtime_is_cleaned_up_by_the_next"]
fn stale_runtime_child() {
    if std::env::var_os("HOLDFAST_STALE_CHILD").is_none() {
        return;
    }
    let rt = holdfast_tests::cri::Containerd::start("stalechild").expect("start a runtime");
    // The registry the agent's image is pulled from, left running like the rest.
    let registry =
        holdfast_image::registry::LocalRegistry::start(&rt.dir.join("registry/storage"), 0)
            .expect("start a registry");
    std::mem::forget(registry);
    let uid = holdfast_tests::sim::random_uuid();
    let logs = rt.dir.join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let (sandbox, sb) = run_sandbox(&rt, "orphan", &uid, &logs);
    let mut c = rt.client.clone();
    start_app(&rt, &sb, sandbox, vec!["/bin/sleep".into(), "1000".into()]);
    let st = rt
        .call(c.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sb,
            verbose: true,
        }))
        .expect("status");
    let info = holdfast_tests::cri::status::parse_info(&st.info);
    let netns = holdfast_tests::cri::status::info_netns(&info).expect("netns");
    println!(
        "STALE {} {} {} {}",
        rt.dir.display(),
        netns.display(),
        rt.bridge,
        uid
    );
    use std::io::Write;
    std::io::stdout().flush().expect("flush");
    // Never torn down: the parent SIGKILLs this process.
    std::mem::forget(rt);
    std::thread::sleep(Duration::from_secs(600));
}

/// A test binary killed with SIGKILL leaves its runtime (containerd, shim, containers, netns,
/// mounts, bridge, directory); the next runtime to start finds it by its dead owner and
/// removes it all, and leaves a live test binary's runtime (this one's) alone.
#[test]
fn a_killed_test_binarys_runtime_is_cleaned_up_by_the_next() {
    let Some(live) = runtime_for("a_killed_test_binarys_runtime_is_cleaned_up_by_the_next") else {
        return;
    };
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().expect("own path"))
        .args([
            "stale_runtime_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("HOLDFAST_STALE_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the child test binary");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            // libtest's "test stale_runtime_child ... " precedes it on the same line.
            if let Some((_, rest)) = line.split_once("STALE ") {
                let _ = tx.send(rest.to_string());
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(90));
    // Our child, not reaped yet: its pid cannot have been reused.
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("the child started its runtime");
    let parts: Vec<&str> = line.split(' ').collect();
    let (dir, netns, bridge, uid) = (
        std::path::PathBuf::from(parts[0]),
        std::path::PathBuf::from(parts[1]),
        parts[2].to_string(),
        parts[3].to_string(),
    );
    let net = std::path::Path::new("/sys/class/net").join(&bridge);
    // What the killed binary left.
    assert!(dir.is_dir() && netns.exists() && net.exists(), "{line}");
    let owner = holdfast_tests::cri::stale::owner(&dir).expect("owner file");
    assert!(!owner.alive(), "the owner was killed");
    let in_dir = |d: &std::path::Path| processes_naming(&d.to_string_lossy());
    assert!(
        !in_dir(&dir).is_empty(),
        "containerd and its shim still run"
    );
    let registry = format!(
        "{} serve {}/registry/",
        holdfast_image::registry::REGISTRY_BINARY,
        dir.display()
    );
    assert!(
        !processes_naming(&registry).is_empty(),
        "the dead binary's registry still runs"
    );

    let report = holdfast_tests::cri::stale::clean_stale_runtimes();
    eprintln!("cleanup: {report:#?}");
    // Another runtime starting on this machine may have claimed it first: wait for it to go.
    let deadline = Instant::now() + Duration::from_secs(60);
    while dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(
        !netns.exists(),
        "the sandbox's netns {} is left",
        netns.display()
    );
    assert!(!net.exists(), "the bridge {bridge} is left");
    assert!(
        in_dir(&dir).is_empty(),
        "processes of the dead runtime: {:?}",
        in_dir(&dir)
    );
    for root in [
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        let pod = std::path::Path::new(root).join(format!("kubepods/besteffort/pod{uid}"));
        assert!(!pod.exists(), "{} is left", pod.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(
        !mounts.contains(&*dir.to_string_lossy()),
        "mounts under {} are left",
        dir.display()
    );
    // The live runtime (this binary's) is untouched.
    assert!(live.dir.join("containerd.sock").exists());
    let mut c = live.client.clone();
    live.call(c.list_pod_sandbox(ListPodSandboxRequest::default()))
        .expect("the live runtime still answers");
}

/// Pids whose command line contains `needle`.
fn processes_naming(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
                && holdfast_tests::sim::process::alive(*pid)
        })
        .collect()
}

/// The boot call's latency, from the app's report.
fn boot_call(report: &holdfast_tests::sim::AppReport) -> Option<(bool, u64)> {
    report.events.iter().find_map(|e| match e {
        holdfast_tests::sim::report::AppEvent::Call {
            phase: Phase::Startup,
            ok,
            latency_ms,
            ..
        } => Some((*ok, *latency_ms)),
        _ => None,
    })
}

/// The `serial_start` baseline (Istio's `holdApplicationUntilProxyStarts`) on real containers:
/// the app container is created only after the proxy's postStart hook saw Envoy ready, so its
/// boot call works without the agent, and the app starts after Envoy's 1 s delay.
#[test]
fn containerd_serial_start_baseline_starts_the_app_after_envoy() {
    if runtime_for("containerd_serial_start_baseline_starts_the_app_after_envoy").is_none() {
        return;
    }
    let mut node = node("crserial");
    let late = Duration::from_secs(1);
    node.add_pod(
        PodSpec::new("serial")
            .app(AppScript::CallAtStart { calls: 1 })
            .proxy_delay(late)
            .serial_start(true),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("serial", Duration::from_secs(40), "the boot call", |r| {
            boot_call(r).is_some()
        })
        .expect("the app makes its boot call");
    assert_eq!(boot_call(&report).map(|c| c.0), Some(true), "{report:?}");
    let view = node.pod("serial").expect("pod");
    let proxy_started = match view.proxy().map(|c| &c.state) {
        Some(CState::Running { started_at }) => started_at.as_millisecond(),
        other => panic!("proxy not running: {other:?}"),
    };
    let app_started = report.started_at_ms().expect("app start") as i64;
    assert!(
        app_started - proxy_started >= late.as_millis() as i64,
        "the app started {} ms after the proxy container, before Envoy could be ready",
        app_started - proxy_started
    );
    assert_clean(node);
}

/// The `drop_until_ready` baseline on real containers: the app's SYN to Envoy is dropped until
/// Envoy is ready, and TCP retransmits it (after 1 s, then 2 s...), so the boot call works
/// without the agent but takes at least a second.
#[test]
fn containerd_drop_until_ready_baseline_retransmits_the_syn() {
    if runtime_for("containerd_drop_until_ready_baseline_retransmits_the_syn").is_none() {
        return;
    }
    let mut node = node("crdrop");
    node.add_pod(
        PodSpec::new("dropped")
            .app(AppScript::CallAtStart { calls: 1 })
            .proxy_delay(Duration::from_millis(500))
            .call_timeout(Duration::from_secs(20))
            .drop_until_ready(true),
    )
    .expect("add pod");
    node.start_pods().expect("start");
    let report = node
        .wait_report("dropped", Duration::from_secs(40), "the boot call", |r| {
            boot_call(r).is_some()
        })
        .expect("the app makes its boot call");
    let (ok, latency_ms) = boot_call(&report).expect("checked");
    assert!(ok, "{report:?}");
    assert!(
        latency_ms >= 900,
        "the first SYN was dropped and retransmitted after ~1 s: {latency_ms} ms"
    );
    assert_clean(node);
}

/// Pod shapes this backend does not build are refused by name when added, so a test written
/// for them fails on this backend instead of passing without them.
#[test]
fn containerd_refuses_pod_shapes_it_does_not_build() {
    if runtime_for("containerd_refuses_pod_shapes_it_does_not_build").is_none() {
        return;
    }
    let mut node = node("crrefuse");
    for (spec, named) in [
        (
            PodSpec::new("v6").ip_families(holdfast_tests::sim::IpFamilies::DualV6First),
            "IPv6",
        ),
        (
            PodSpec::new("dns").dns_capture(Duration::from_millis(100)),
            "DNS capture",
        ),
        (PodSpec::new("cni").cni(true), "Istio CNI mode"),
    ] {
        let err = node.add_pod(spec).expect_err("refused").to_string();
        assert!(
            err.contains(named) && err.contains("containerd backend"),
            "{err}"
        );
    }
    node.add_pod(PodSpec::new("plain"))
        .expect("a plain pod is fine");
    assert_clean(node);
}
