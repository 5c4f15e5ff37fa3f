//! The simulated node's containerd backend: a private containerd (Debian's 1.6, CRI plugin), runc
//! and the CNI bridge plugin, driven over the CRI.

use std::time::{Duration, Instant};

use holdfast_tests::cri::runtime_for;
use k8s_cri::v1::*;

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
    let sandbox = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "smoke".into(),
            uid: uid.clone(),
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
    let sb = rt
        .call(c.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        }))
        .expect("sandbox")
        .pod_sandbox_id;
    let st = rt
        .call(c.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sb.clone(),
            verbose: true,
        }))
        .expect("status");
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
    let cid = rt
        .call(c.create_container(CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: holdfast_tests::cri::runtime::BASE_IMAGE.into(),
                    ..Default::default()
                }),
                command: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "cat /proc/self/cgroup; sleep 100".into(),
                ],
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
}
