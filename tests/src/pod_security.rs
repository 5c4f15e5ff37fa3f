//! Pod Security Admission's **baseline** level, as the API server evaluates it on a pod (or a
//! workload's pod template): the checks of kubernetes/pod-security-admission `policy/`
//! (read at tag v0.36.2, Kubernetes 1.36; each check below names its file), at the "latest"
//! version. The restricted level is not implemented: nothing holdfast ships claims it.
//!
//! A namespace's level is its `pod-security.kubernetes.io/enforce` label; a namespace without
//! one gets the cluster's default (AdmissionConfiguration `defaults.enforce`), which the tests
//! take to be `baseline` — the cluster the install docs promise to work on.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The namespace label that sets the enforced level.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// One baseline check a pod fails: the check's id (as PSA names it) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub check: &'static str,
    pub detail: String,
}

fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

/// policy/check_capabilities_baseline.go `capabilities_allowed_1_0`.
pub const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];
/// policy/check_seLinuxOptions.go `selinuxAllowedTypes1_31`.
const SELINUX_TYPES: [&str; 5] = [
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];
/// policy/check_sysctls.go `sysctlsAllowedV1Dot32`.
const SAFE_SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];
const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Every baseline check `spec` (with its pod's `meta`) fails.
pub fn baseline(meta: &ObjectMeta, spec: &PodSpec) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut fail = |check: &'static str, detail: String| out.push(Violation { check, detail });

    // check_hostNamespaces.go
    for (on, field) in [
        (spec.host_network, "hostNetwork"),
        (spec.host_pid, "hostPID"),
        (spec.host_ipc, "hostIPC"),
    ] {
        if on == Some(true) {
            fail("hostNamespaces", format!("{field}=true"));
        }
    }
    // check_privileged.go
    for c in containers(spec) {
        if c.security_context.as_ref().and_then(|s| s.privileged) == Some(true) {
            fail(
                "privileged",
                format!("container {:?}: privileged=true", c.name),
            );
        }
    }
    // check_capabilities_baseline.go
    for c in containers(spec) {
        let added = c
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.clone())
            .unwrap_or_default();
        let bad: Vec<String> = added
            .into_iter()
            .filter(|a| !BASELINE_CAPABILITIES.contains(&a.as_str()))
            .collect();
        if !bad.is_empty() {
            fail(
                "capabilities",
                format!("container {:?} adds {}", c.name, bad.join(", ")),
            );
        }
    }
    // check_hostPathVolumes.go
    for v in spec.volumes.iter().flatten() {
        if v.host_path.is_some() {
            fail(
                "hostPathVolumes",
                format!("volume {:?} is a hostPath", v.name),
            );
        }
    }
    // check_hostPorts.go
    for c in containers(spec) {
        for p in c.ports.iter().flatten() {
            if p.host_port.is_some_and(|h| h != 0) {
                fail(
                    "hostPorts",
                    format!("container {:?}: hostPort {:?}", c.name, p.host_port),
                );
            }
        }
    }
    // check_appArmorProfile.go: fields RuntimeDefault/Localhost; annotations runtime/default,
    // localhost/*.
    let allowed_type = |t: &str| matches!(t, "RuntimeDefault" | "Localhost");
    if let Some(p) = spec
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
    {
        if !allowed_type(&p.type_) {
            fail(
                "appArmorProfile",
                format!("pod: appArmorProfile.type {}", p.type_),
            );
        }
    }
    for c in containers(spec) {
        if let Some(p) = c
            .security_context
            .as_ref()
            .and_then(|s| s.app_armor_profile.as_ref())
        {
            if !allowed_type(&p.type_) {
                fail(
                    "appArmorProfile",
                    format!("container {:?}: appArmorProfile.type {}", c.name, p.type_),
                );
            }
        }
    }
    for (k, v) in meta.annotations.iter().flatten() {
        if k.starts_with(APPARMOR_ANNOTATION)
            && !(v.is_empty() || v == "runtime/default" || v.starts_with("localhost/"))
        {
            fail("appArmorProfile", format!("annotation {k}={v:?}"));
        }
    }
    // check_seLinuxOptions.go
    let selinux = std::iter::once((
        "pod".to_string(),
        spec.security_context
            .as_ref()
            .and_then(|s| s.se_linux_options.clone()),
    ))
    .chain(containers(spec).map(|c| {
        (
            format!("container {:?}", c.name),
            c.security_context
                .as_ref()
                .and_then(|s| s.se_linux_options.clone()),
        )
    }));
    for (who, o) in selinux {
        let Some(o) = o else { continue };
        let t = o.type_.unwrap_or_default();
        if !SELINUX_TYPES.contains(&t.as_str()) {
            fail("seLinuxOptions", format!("{who}: type {t:?}"));
        }
        if o.user.is_some_and(|u| !u.is_empty()) || o.role.is_some_and(|r| !r.is_empty()) {
            fail("seLinuxOptions", format!("{who}: user or role set"));
        }
    }
    // check_procMount_baseline.go (any value in a user namespace from 1.35)
    if spec.host_users != Some(false) {
        for c in containers(spec) {
            if let Some(pm) = c
                .security_context
                .as_ref()
                .and_then(|s| s.proc_mount.as_ref())
            {
                if pm != "Default" {
                    fail(
                        "procMount",
                        format!("container {:?}: procMount {pm}", c.name),
                    );
                }
            }
        }
    }
    // check_seccompProfile_baseline.go
    if spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .is_some_and(|p| p.type_ == "Unconfined")
    {
        fail(
            "seccompProfile",
            "pod: seccompProfile.type Unconfined".into(),
        );
    }
    for c in containers(spec) {
        if c.security_context
            .as_ref()
            .and_then(|s| s.seccomp_profile.as_ref())
            .is_some_and(|p| p.type_ == "Unconfined")
        {
            fail(
                "seccompProfile",
                format!("container {:?}: seccompProfile.type Unconfined", c.name),
            );
        }
    }
    // check_sysctls.go
    for s in spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.clone())
        .into_iter()
        .flatten()
    {
        if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
            fail("sysctls", format!("sysctl {}", s.name));
        }
    }
    // check_windowsHostProcess.go
    let host_process = |o: Option<&k8s_openapi::api::core::v1::WindowsSecurityContextOptions>| {
        o.and_then(|o| o.host_process) == Some(true)
    };
    if host_process(
        spec.security_context
            .as_ref()
            .and_then(|s| s.windows_options.as_ref()),
    ) || containers(spec).any(|c| {
        host_process(
            c.security_context
                .as_ref()
                .and_then(|s| s.windows_options.as_ref()),
        )
    }) {
        fail("windowsHostProcess", "hostProcess=true".into());
    }
    // check_hostProbesAndhostLifecycle.go (1.34+): no `host` in probe or lifecycle handlers.
    for c in containers(spec) {
        let probes = [&c.liveness_probe, &c.readiness_probe, &c.startup_probe];
        let mut hosts: Vec<Option<String>> = Vec::new();
        for p in probes.into_iter().flatten() {
            hosts.push(p.http_get.as_ref().and_then(|h| h.host.clone()));
            hosts.push(p.tcp_socket.as_ref().and_then(|t| t.host.clone()));
        }
        if let Some(l) = &c.lifecycle {
            for h in [&l.post_start, &l.pre_stop].into_iter().flatten() {
                hosts.push(h.http_get.as_ref().and_then(|g| g.host.clone()));
                hosts.push(h.tcp_socket.as_ref().and_then(|t| t.host.clone()));
            }
        }
        if hosts.into_iter().flatten().any(|h| !h.is_empty()) {
            fail(
                "hostProbesAndHostLifecycle",
                format!("container {:?} probes or hooks another host", c.name),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> (ObjectMeta, PodSpec) {
        let meta: ObjectMeta = serde_json::from_value(v["metadata"].clone()).unwrap_or_default();
        let spec: PodSpec = serde_json::from_value(v["spec"].clone()).expect("a pod spec");
        (meta, spec)
    }

    #[test]
    fn a_plain_pod_passes_and_each_privilege_fails_its_check() {
        let (m, s) = pod(serde_json::json!({"spec": {"containers": [{"name": "app",
            "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}}]}}));
        assert_eq!(baseline(&m, &s), vec![]);
        for (patch, check) in [
            (
                serde_json::json!({"spec": {"hostPID": true, "containers": [{"name": "a"}]}}),
                "hostNamespaces",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "securityContext": {"privileged": true}}]}}),
                "privileged",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}}),
                "capabilities",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a"}], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}),
                "hostPathVolumes",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 1, "hostPort": 80}]}]}}),
                "hostPorts",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]}}),
                "appArmorProfile",
            ),
            (
                serde_json::json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "unconfined"}}, "spec": {"containers": [{"name": "a"}]}}),
                "appArmorProfile",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "securityContext": {"seLinuxOptions": {"type": "spc_t"}}}]}}),
                "seLinuxOptions",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]}}),
                "seccompProfile",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "securityContext": {"procMount": "Unmasked"}}]}}),
                "procMount",
            ),
            (
                serde_json::json!({"spec": {"securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1"}]}, "containers": [{"name": "a"}]}}),
                "sysctls",
            ),
            (
                serde_json::json!({"spec": {"containers": [{"name": "a", "readinessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}]}}),
                "hostProbesAndHostLifecycle",
            ),
        ] {
            let (m, s) = pod(patch.clone());
            let v = baseline(&m, &s);
            assert!(v.iter().any(|x| x.check == check), "{patch}: {v:?}");
        }
        // Allowed values pass.
        let (m, s) = pod(
            serde_json::json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "runtime/default"}},
            "spec": {"containers": [{"name": "a", "securityContext": {"seLinuxOptions": {"type": "container_t"}, "seccompProfile": {"type": "RuntimeDefault"}}}]}}),
        );
        assert_eq!(baseline(&m, &s), vec![]);
    }
}
