//! Parsing of `/proc/<pid>/cgroup` into the pod UID and container ID a process belongs to.
//!
//! Owns the knowledge of how kubelet names pod and container cgroups for both cgroup drivers
//! (cgroupfs: `.../kubepods/burstable/pod<uid>/<cid>`; systemd:
//! `...kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<cid>.scope`), for
//! cgroup v1 (one line per controller) and v2 (`0::<path>`), under any nesting prefix (kind runs
//! kubelet inside a docker container, so the path starts with docker's own scope).
//!
//! The parser anchors on the `pod<uid>` segment, never on a prefix: prefixes vary with the QoS
//! class (Guaranteed pods have none), the driver, the runtime and the nesting.

/// The pod (and container, when the process is in one) a process's cgroup names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodCgroup {
    /// Pod UID, canonical form: lowercase hex with dashes (`8-4-4-4-12`), as in `metadata.uid`.
    pub pod_uid: String,
    /// Container ID (lowercase hex, without a runtime prefix such as `containerd://`), or `None` for
    /// a process directly in the pod's cgroup or in a runtime helper scope (CRI-O's `crio-conmon-`).
    /// The pause (sandbox) container has an ID like any other container.
    pub container_id: Option<String>,
    /// The process is CRI-O's container monitor (`crio-conmon-<id>.scope`, or runc's
    /// `...:crio-conmon:<id>`): it sits in the pod's cgroup (`conmon_cgroup = "pod"`, OpenShift's
    /// setting and required with the cgroupfs driver, cri-o/cri-o docs/crio.conf.5.md) but in the
    /// node's network namespace. Never a container's process.
    pub conmon: bool,
}

/// Parses the whole contents of `/proc/<pid>/cgroup` (v1: many lines, v2: `0::<path>`).
///
/// Returns `None` when no line names a pod (host processes, or a process seen through a cgroup
/// namespace that hides the pod segment). When several lines name a pod (v1), the first that also
/// names a container wins, otherwise the first that names the pod.
pub fn parse_pod_cgroup(proc_pid_cgroup_contents: &str) -> Option<PodCgroup> {
    let mut pod_only = None;
    for line in proc_pid_cgroup_contents.lines() {
        let Some(found) = parse_line(line) else {
            continue;
        };
        if found.container_id.is_some() {
            return Some(found);
        }
        if pod_only.is_none() {
            pod_only = Some(found);
        }
    }
    pod_only
}

/// The pod's own cgroup directory, relative to the cgroup v2 mount, from the `0::<path>` line of
/// `/proc/<pid>/cgroup`: the path up to and including the `pod<uid>` segment
/// (`/kubepods/burstable/pod<uid>`, `/kubepods.slice/.../kubepods-burstable-pod<uid_>.slice`).
/// `None` for cgroup v1, for runc's `slice:prefix:name` form, and for a path seen through a
/// cgroup namespace (`/../..`: not under the agent's mount) — the callers then list `/proc`.
pub(crate) fn pod_dir_v2(proc_pid_cgroup_contents: &str) -> Option<String> {
    let path = proc_pid_cgroup_contents
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_end();
    if !path.starts_with('/') || path.split('/').any(|s| s == "..") {
        return None;
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let at = segments
        .iter()
        .position(|s| matches!(pod_segment(s), Some((_, None))))?;
    Some(format!("/{}", segments[..=at].join("/")))
}

/// One line: `<hierarchy-id>:<controllers>:<path>`. The path itself may contain `:` (runc's
/// `slice:prefix:name` form), so only the first two colons separate fields.
fn parse_line(line: &str) -> Option<PodCgroup> {
    let mut fields = line.splitn(3, ':');
    let _hierarchy = fields.next()?;
    let _controllers = fields.next()?;
    let path = fields.next()?;
    parse_path(path.trim_end())
}

/// Finds the pod segment in a cgroup path and the container segment after it.
fn parse_path(path: &str) -> Option<PodCgroup> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    for (i, segment) in segments.iter().enumerate() {
        let Some((pod_uid, rest)) = pod_segment(segment) else {
            continue;
        };
        // runc's systemd form keeps the container in the same segment:
        // `kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>`.
        let container = match rest {
            Some(runc_tail) => runc_container(runc_tail),
            None => segments
                .get(i + 1)
                .map_or(Container::None, |next| container_segment(next)),
        };
        let (container_id, conmon) = match container {
            Container::Id(id) => (Some(id), false),
            Container::Conmon => (None, true),
            Container::None => (None, false),
        };
        return Some(PodCgroup {
            pod_uid,
            container_id,
            conmon,
        });
    }
    None
}

/// Recognises a pod segment and returns the canonical UID, plus the runc tail (after
/// `.slice:`) if there is one.
///
/// Accepted: `pod<uid-with-dashes>` (cgroupfs) and `...-pod<uid_with_underscores>.slice`
/// (systemd), optionally followed by `:<prefix>:<name>` (runc). `pod` must start the segment or
/// follow a `-`, so a segment that merely contains "pod" (e.g. `mypod...`) does not match.
fn pod_segment(segment: &str) -> Option<(String, Option<&str>)> {
    let bytes = segment.as_bytes();
    let mut search_from = 0;
    while let Some(offset) = segment[search_from..].find("pod") {
        let start = search_from + offset;
        search_from = start + 3;
        if start > 0 && bytes[start - 1] != b'-' {
            continue;
        }
        let after_pod = &segment[start + 3..];
        let Some(uid) = after_pod.get(..36).and_then(canonical_uid) else {
            continue;
        };
        let tail = &after_pod[36..];
        if tail.is_empty() {
            return Some((uid, None));
        }
        if let Some(after_slice) = tail.strip_prefix(".slice") {
            if after_slice.is_empty() {
                return Some((uid, None));
            }
            if let Some(runc_tail) = after_slice.strip_prefix(':') {
                return Some((uid, Some(runc_tail)));
            }
        }
    }
    None
}

/// `8-4-4-4-12` hex with one consistent separator (`-` or `_`), returned lowercase with dashes.
fn canonical_uid(candidate: &str) -> Option<String> {
    let bytes = candidate.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let separator = bytes[8];
    if separator != b'-' && separator != b'_' {
        return None;
    }
    for (i, &b) in bytes.iter().enumerate() {
        let is_separator_position = matches!(i, 8 | 13 | 18 | 23);
        if is_separator_position {
            if b != separator {
                return None;
            }
        } else if !b.is_ascii_hexdigit() {
            return None;
        }
    }
    Some(
        candidate
            .chars()
            .map(|c| {
                if c == '_' {
                    '-'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect(),
    )
}

/// What the segment after the pod segment names.
enum Container {
    Id(String),
    /// CRI-O's monitor process (see [`PodCgroup::conmon`]).
    Conmon,
    /// Nothing recognisable: a process directly in the pod's cgroup, or a truncated segment.
    None,
}

/// The segment after the pod segment: `<id>`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `docker-<id>.scope` (cri-dockerd with the systemd driver), `cri-dockerd-<id>.scope`, or
/// CRI-O's cgroupfs form `crio-<id>`. CRI-O's `crio-conmon-<id>[.scope]` holds the runtime's
/// monitor (cri-o/cri-o internal/config/cgmgr/systemd_linux.go `MoveConmonToCgroup`:
/// `crio-conmon-<id>.scope`), not the container's processes.
fn container_segment(segment: &str) -> Container {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    if name.starts_with("crio-conmon-") {
        return Container::Conmon;
    }
    let id = container_id(name).or_else(|| {
        let (_, id) = name.rsplit_once('-')?;
        container_id(id)
    });
    id.map_or(Container::None, Container::Id)
}

/// runc's systemd form after `.slice:`: `<prefix>:<id>` (e.g. `cri-containerd:<id>`).
fn runc_container(tail: &str) -> Container {
    let Some((prefix, id)) = tail.rsplit_once(':') else {
        return Container::None;
    };
    if prefix.ends_with("conmon") {
        return Container::Conmon;
    }
    container_id(id).map_or(Container::None, Container::Id)
}

/// Container IDs are hex (64 characters for containerd, CRI-O and docker). Shorter hex strings of
/// at least 12 characters are accepted because some runtimes and test setups use short IDs.
fn container_id(candidate: &str) -> Option<String> {
    let valid =
        (12..=128).contains(&candidate.len()) && candidate.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| candidate.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID_A: &str = "8c046cb0b72cd4c99f51b5591cd5b095967f58ee003710a45280c28ee1a9c7fa";
    const CID_B: &str = "75c7fe7ad0df679971e755bd97b84dd68a32e1eba8e8f99b01ab3c07196a3e4a";
    // Full-length made-up hex where the reference elides the sources' ids with `…`.
    const CID_C: &str = "9bca8d63a5e1c2f4b6d8e0a1c3e5f7092b4d6f8a0c2e4f6a8b0d2f4a6c8e0b2d";
    const CID_D: &str = "45490e76a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9d0d814";
    const CID_E: &str = "9b9ccc15f0e1d2c3b4a5968778695a4b3c2d1e0f9a8b7c6d5e4f3a2b1cc6a889";
    const CID_F: &str = "01aa0bfe1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d0c1a";
    const CID_G: &str = "8618d354aa11bb22cc33dd44ee55ff6600112233445566778899aabbccdd04f5";

    fn parsed(pod_uid: &str, container_id: Option<&str>) -> Option<PodCgroup> {
        Some(PodCgroup {
            pod_uid: pod_uid.to_string(),
            container_id: container_id.map(str::to_string),
            conmon: false,
        })
    }

    fn conmon(pod_uid: &str) -> Option<PodCgroup> {
        Some(PodCgroup {
            pod_uid: pod_uid.to_string(),
            container_id: None,
            conmon: true,
        })
    }

    #[test]
    fn cgroupfs_v1_datadog() {
        let line = format!(
            "10:hugetlb:/kubepods/burstable/podfd52ef25-a87d-11e9-9423-0800271a638e/{CID_A}"
        );
        assert_eq!(
            parse_pod_cgroup(&line),
            parsed("fd52ef25-a87d-11e9-9423-0800271a638e", Some(CID_A))
        );
    }

    #[test]
    fn systemd_containerd_v2_kind_in_docker() {
        let line = format!(
            "0::/system.slice/docker-8445c3ca0f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0b777.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod863b91d4_4b68_4efa_917f_4b560e3e86aa.slice/cri-containerd-{CID_B}.scope"
        );
        assert_eq!(
            parse_pod_cgroup(&line),
            parsed("863b91d4-4b68-4efa-917f-4b560e3e86aa", Some(CID_B))
        );
    }

    #[test]
    fn istio_parser_shapes() {
        let uid = "2c48913c-b29f-11e7-9350-020968147796";
        let uid_ = "2c48913c_b29f_11e7_9350_020968147796";
        let cgroupfs = format!("0::/kubepods/burstable/pod{uid}/{CID_C}");
        assert_eq!(parse_pod_cgroup(&cgroupfs), parsed(uid, Some(CID_C)));

        let systemd_docker = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/docker-{CID_C}.scope"
        );
        assert_eq!(parse_pod_cgroup(&systemd_docker), parsed(uid, Some(CID_C)));

        let runc = format!(
            "0::/kubepods-besteffort-pod72f7f152_440c_66ac_9084_e0fc1d8a910c.slice:cri-containerd:{CID_C}"
        );
        assert_eq!(
            parse_pod_cgroup(&runc),
            parsed("72f7f152-440c-66ac-9084-e0fc1d8a910c", Some(CID_C))
        );

        // CRI-O seen through a cgroup namespace: no pod segment, so no pod.
        let namespaced = format!("0::/../crio-{CID_D}.scope");
        assert_eq!(parse_pod_cgroup(&namespaced), None);
    }

    #[test]
    fn pixie_controller_paths() {
        let openshift = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9b7969b2_aad0_47d4_b11c_4acfd1ce018e.slice/crio-{CID_E}.scope"
        );
        assert_eq!(
            parse_pod_cgroup(&openshift),
            parsed("9b7969b2-aad0-47d4-b11c-4acfd1ce018e", Some(CID_E))
        );

        let gke_trailing_slash =
            format!("0::/kubepods/burstable/podc458de04-9784-4f7a-990e-cefe26b511f0/{CID_F}/");
        assert_eq!(
            parse_pod_cgroup(&gke_trailing_slash),
            parsed("c458de04-9784-4f7a-990e-cefe26b511f0", Some(CID_F))
        );

        let bare_metal = format!(
            "0::/system.slice/containerd.service/kubepods-besteffort-pod1544eb37_e4f7_49eb_8cc4_3d01c41be77b.slice:cri-containerd:{CID_G}/"
        );
        assert_eq!(
            parse_pod_cgroup(&bare_metal),
            parsed("1544eb37-e4f7-49eb-8cc4-3d01c41be77b", Some(CID_G))
        );

        let guaranteed = format!(
            "0::/kubepods.slice/kubepods-pod1544eb37_e4f7_49eb_8cc4_3d01c41be77b.slice/cri-containerd-{CID_G}.scope"
        );
        assert_eq!(
            parse_pod_cgroup(&guaranteed),
            parsed("1544eb37-e4f7-49eb-8cc4-3d01c41be77b", Some(CID_G))
        );
        let guaranteed_cgroupfs =
            format!("0::/kubepods/pod1544eb37-e4f7-49eb-8cc4-3d01c41be77b/{CID_G}");
        assert_eq!(
            parse_pod_cgroup(&guaranteed_cgroupfs),
            parsed("1544eb37-e4f7-49eb-8cc4-3d01c41be77b", Some(CID_G))
        );
    }

    #[test]
    fn v1_many_lines_prefers_a_line_with_the_container() {
        let contents = format!(
            "12:pids:/kubepods/burstable/podfd52ef25-a87d-11e9-9423-0800271a638e\n\
             11:cpuset:/\n\
             10:hugetlb:/kubepods/burstable/podfd52ef25-a87d-11e9-9423-0800271a638e/{CID_A}\n\
             1:name=systemd:/kubepods/burstable/podfd52ef25-a87d-11e9-9423-0800271a638e/{CID_A}\n\
             0::/\n"
        );
        assert_eq!(
            parse_pod_cgroup(&contents),
            parsed("fd52ef25-a87d-11e9-9423-0800271a638e", Some(CID_A))
        );
    }

    #[test]
    fn pod_level_process_and_uppercase_uid() {
        let line = "0::/kubepods/besteffort/podFD52EF25-A87D-11E9-9423-0800271A638E\n";
        assert_eq!(
            parse_pod_cgroup(line),
            parsed("fd52ef25-a87d-11e9-9423-0800271a638e", None)
        );
        let pause_like =
            format!("0::/kubepods/besteffort/podfd52ef25-a87d-11e9-9423-0800271a638e/{CID_B}/");
        assert_eq!(
            parse_pod_cgroup(&pause_like),
            parsed("fd52ef25-a87d-11e9-9423-0800271a638e", Some(CID_B))
        );
    }

    #[test]
    fn crio_with_cgroupfs_driver() {
        let line =
            format!("0::/kubepods/burstable/pod9b7969b2-aad0-47d4-b11c-4acfd1ce018e/crio-{CID_E}");
        assert_eq!(
            parse_pod_cgroup(&line),
            parsed("9b7969b2-aad0-47d4-b11c-4acfd1ce018e", Some(CID_E))
        );
        let conmon_line = format!(
            "0::/kubepods/burstable/pod9b7969b2-aad0-47d4-b11c-4acfd1ce018e/crio-conmon-{CID_E}"
        );
        assert_eq!(
            parse_pod_cgroup(&conmon_line),
            conmon("9b7969b2-aad0-47d4-b11c-4acfd1ce018e")
        );
    }

    #[test]
    fn crio_conmon_is_not_a_container() {
        let line = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9b7969b2_aad0_47d4_b11c_4acfd1ce018e.slice/crio-conmon-{CID_E}.scope"
        );
        assert_eq!(
            parse_pod_cgroup(&line),
            conmon("9b7969b2-aad0-47d4-b11c-4acfd1ce018e")
        );
        // runc's slice:prefix:name form of the same.
        let runc = format!(
            "0::/kubepods-burstable-pod9b7969b2_aad0_47d4_b11c_4acfd1ce018e.slice:crio-conmon:{CID_E}"
        );
        assert_eq!(
            parse_pod_cgroup(&runc),
            conmon("9b7969b2-aad0-47d4-b11c-4acfd1ce018e")
        );
    }

    /// A containerized agent on cgroup v2 with its own cgroup namespace reads other processes'
    /// paths relative to its own cgroup (kernel Documentation/admin-guide/cgroup-v2.rst,
    /// "Namespace"): `0::/../../kubepods-…-pod<uid>.slice/…`. The pod segment is still there.
    #[test]
    fn cgroup_namespace_relative_paths() {
        let uid = "863b91d4-4b68-4efa-917f-4b560e3e86aa";
        let containerd = format!(
            "0::/../../kubepods-besteffort-pod863b91d4_4b68_4efa_917f_4b560e3e86aa.slice/cri-containerd-{CID_B}.scope"
        );
        assert_eq!(parse_pod_cgroup(&containerd), parsed(uid, Some(CID_B)));
        let crio = format!(
            "0::/../../../kubepods-burstable-pod863b91d4_4b68_4efa_917f_4b560e3e86aa.slice/crio-{CID_E}.scope"
        );
        assert_eq!(parse_pod_cgroup(&crio), parsed(uid, Some(CID_E)));
        let crio_conmon = format!(
            "0::/../../kubepods-burstable-pod863b91d4_4b68_4efa_917f_4b560e3e86aa.slice/crio-conmon-{CID_E}.scope"
        );
        assert_eq!(parse_pod_cgroup(&crio_conmon), conmon(uid));
        let cgroupfs = format!("0::/../../pod{uid}/{CID_A}");
        assert_eq!(parse_pod_cgroup(&cgroupfs), parsed(uid, Some(CID_A)));
    }

    /// cri-dockerd with the systemd driver names scopes `docker-<id>.scope` (as dockershim did;
    /// istio/istio cni/pkg/nodeagent/podcgroupns_linux.go lists the shape).
    #[test]
    fn cri_dockerd_scopes() {
        let line = format!(
            "0::/kubepods.slice/kubepods-pod1544eb37_e4f7_49eb_8cc4_3d01c41be77b.slice/docker-{CID_G}.scope"
        );
        assert_eq!(
            parse_pod_cgroup(&line),
            parsed("1544eb37-e4f7-49eb-8cc4-3d01c41be77b", Some(CID_G))
        );
        let v1 = format!(
            "4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1544eb37_e4f7_49eb_8cc4_3d01c41be77b.slice/docker-{CID_G}.scope\n0::/\n"
        );
        assert_eq!(
            parse_pod_cgroup(&v1),
            parsed("1544eb37-e4f7-49eb-8cc4-3d01c41be77b", Some(CID_G))
        );
    }

    #[test]
    fn pod_dirs_of_v2_paths() {
        let uid = "2c48913c-b29f-4a8e-9c4b-0123456789ab";
        let cid = "a".repeat(64);
        assert_eq!(
            pod_dir_v2(&format!("0::/kubepods/burstable/pod{uid}/{cid}\n")),
            Some(format!("/kubepods/burstable/pod{uid}"))
        );
        let u = uid.replace('-', "_");
        assert_eq!(
            pod_dir_v2(&format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{cid}.scope\n"
            )),
            Some(format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"
            ))
        );
        // Through a cgroup namespace, v1, not a pod: no directory (the caller lists /proc).
        assert_eq!(
            pod_dir_v2(&format!("0::/../../kubepods/pod{uid}/{cid}\n")),
            None
        );
        assert_eq!(
            pod_dir_v2(&format!("4:pids:/kubepods/pod{uid}/{cid}\n")),
            None
        );
        assert_eq!(pod_dir_v2("0::/system.slice/sshd.service\n"), None);
    }

    #[test]
    fn hostile_input() {
        assert_eq!(parse_pod_cgroup(""), None);
        assert_eq!(parse_pod_cgroup("\n\n\n"), None);
        assert_eq!(parse_pod_cgroup("garbage"), None);
        assert_eq!(parse_pod_cgroup("0::"), None);
        assert_eq!(parse_pod_cgroup("0::/"), None);
        assert_eq!(parse_pod_cgroup("::::::"), None);
        assert_eq!(parse_pod_cgroup("0::/system.slice/sshd.service"), None);
        // Truncated UID.
        assert_eq!(
            parse_pod_cgroup("0::/kubepods/burstable/podfd52ef25-a87d-11e9"),
            None
        );
        // Mixed separators are not a UID.
        assert_eq!(
            parse_pod_cgroup("0::/kubepods/podfd52ef25-a87d_11e9-9423-0800271a638e/abc"),
            None
        );
        // "pod" not at a segment or word start.
        assert_eq!(
            parse_pod_cgroup("0::/kubepods/mypodfd52ef25-a87d-11e9-9423-0800271a638e"),
            None
        );
        // Non-hex characters in the UID.
        assert_eq!(
            parse_pod_cgroup("0::/kubepods/podzz52ef25-a87d-11e9-9423-0800271a638e"),
            None
        );
        // Trailing junk after the UID.
        assert_eq!(
            parse_pod_cgroup("0::/kubepods/podfd52ef25-a87d-11e9-9423-0800271a638eXYZ"),
            None
        );
        // Truncated container segment: the pod is known, the container is not.
        assert_eq!(
            parse_pod_cgroup(
                "0::/kubepods/podfd52ef25-a87d-11e9-9423-0800271a638e/cri-containerd-8c04"
            ),
            parsed("fd52ef25-a87d-11e9-9423-0800271a638e", None)
        );
        // Multi-byte characters must not panic on slicing.
        assert_eq!(parse_pod_cgroup("0::/pod\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}"), None);
        assert_eq!(
            parse_pod_cgroup("0::/pod€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€"),
            None
        );
        assert_eq!(parse_pod_cgroup("0::/-pod"), None);
        // Huge input stays linear and finds nothing.
        let huge = "0::/".to_string() + &"podpodpod-".repeat(200_000);
        assert_eq!(parse_pod_cgroup(&huge), None);
        let huge_lines =
            "1:cpu:/x\n".repeat(100_000) + "0::/kubepods/podfd52ef25-a87d-11e9-9423-0800271a638e\n";
        assert_eq!(
            parse_pod_cgroup(&huge_lines),
            parsed("fd52ef25-a87d-11e9-9423-0800271a638e", None)
        );
    }
}
