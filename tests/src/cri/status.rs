//! Reading containerd's verbose CRI status: the `info` entry of `PodSandboxStatus` /
//! `ContainerStatus` with `verbose: true` is JSON (containerd `pkg/cri/server/*_status.go`)
//! carrying the process id and the OCI runtime spec, where the sandbox's netns path is.

use std::collections::HashMap;
use std::path::PathBuf;

/// containerd's verbose status `info` entry (JSON; containerd `pkg/cri/server/*_status.go`).
pub fn parse_info(info: &HashMap<String, String>) -> serde_json::Value {
    info.get("info")
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(serde_json::Value::Null)
}

pub fn info_pid(info: &serde_json::Value) -> Option<u32> {
    info.get("pid")
        .and_then(|p| p.as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
}

/// The sandbox's netns path from its OCI runtime spec (`linux.namespaces[type=network].path`).
pub fn info_netns(info: &serde_json::Value) -> Option<PathBuf> {
    info.pointer("/runtimeSpec/linux/namespaces")?
        .as_array()?
        .iter()
        .find(|n| n.get("type").and_then(|t| t.as_str()) == Some("network"))
        .and_then(|n| n.get("path")?.as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pid_and_netns_from_containerds_verbose_info() {
        // The shape of a PodSandboxStatus(verbose) `info` of containerd 1.6.20 (trimmed; the
        // smoke test in tests/runtime_containerd.rs reads a live one).
        let raw = r#"{"pid":13071,"processStatus":"running","runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network","path":"/var/run/netns/cni-5e1c7a0e-8a7f-0c53-7a4e-1b0e0c2f9d11"}]}}}"#;
        let info = parse_info(&[("info".to_string(), raw.to_string())].into());
        assert_eq!(info_pid(&info), Some(13071));
        assert_eq!(
            info_netns(&info),
            Some(PathBuf::from(
                "/var/run/netns/cni-5e1c7a0e-8a7f-0c53-7a4e-1b0e0c2f9d11"
            ))
        );
        let empty = parse_info(&HashMap::new());
        assert_eq!(info_pid(&empty), None);
        assert_eq!(info_netns(&empty), None);
        // A stopped container reports pid 0: no pid.
        let stopped = parse_info(&[("info".to_string(), r#"{"pid":0}"#.to_string())].into());
        assert_eq!(info_pid(&stopped), None);
    }
}
