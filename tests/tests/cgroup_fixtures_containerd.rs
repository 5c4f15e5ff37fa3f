//! `/proc/<pid>/cgroup` exactly as the containerd backend's real runtime wrote it on this
//! project's machine (Debian 12, cgroup v1/v2 hybrid, containerd 1.6.20 + runc 1.1.5, cgroupfs
//! driver, `cgroup_parent = /kubepods/besteffort/pod<uid>`), kept as fixtures for the agent's
//! parser. Captured 2026-11-23 by `runtime_containerd.rs` (an app container printing its own
//! `/proc/self/cgroup` into its CRI log) and `agent_container.rs` (the agent's container, read
//! from the host).
//!
//! What they show: one line per v1 hierarchy plus the v2 `0::` line, all with the same path;
//! no cgroup namespace (containerd 1.6 on a v1/v2 hybrid does not give containers one), so a
//! process inside a container sees the same full path as the host — the agent's own container
//! included; the container segment is the bare 64-hex id (no `cri-containerd-` prefix: that
//! comes with the systemd driver).

use holdfast::effects::procfs::parse_pod_cgroup;

/// An app container (uid 0) of a pod, as it printed its own /proc/self/cgroup.
const APP_CONTAINER: &str = "\
9:name=systemd:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
8:pids:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
7:blkio:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
6:freezer:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
5:devices:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
4:memory:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
3:cpuset:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
2:cpuacct:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
1:cpu:/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
0::/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb/4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f
";

/// The holdfast agent's own container (DaemonSet privileges: hostPID, own netns), from the host.
const AGENT_CONTAINER: &str = "\
9:name=systemd:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
8:pids:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
7:blkio:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
6:freezer:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
5:devices:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
4:memory:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
3:cpuset:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
2:cpuacct:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
1:cpu:/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
0::/kubepods/besteffort/podbcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a/eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334
";

#[test]
fn real_containerd_lines_name_the_pod_and_the_container() {
    for (text, uid, cid) in [
        (
            APP_CONTAINER,
            "8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb",
            "4973801dda3af21e5a09f75c903ff648845f91608e391dfd3d35518fff84355f",
        ),
        (
            AGENT_CONTAINER,
            "bcc2bfe5-860d-4fe5-8f3f-f873f9b39e4a",
            "eab2cf78e73907e109d21f91d780242486467e68ebe4ce0a64882508c7217334",
        ),
    ] {
        let parsed = parse_pod_cgroup(text).expect("a pod cgroup");
        assert_eq!(parsed.pod_uid, uid);
        assert_eq!(parsed.container_id.as_deref(), Some(cid));
        // Each line alone (a v2-only host has just the `0::` line; a v1 reader may see one).
        for line in text.lines() {
            let one = parse_pod_cgroup(line).expect("every line names the pod");
            assert_eq!(
                (one.pod_uid.as_str(), one.container_id.as_deref()),
                (uid, Some(cid))
            );
        }
    }
}

/// The pod-level directory itself (`kubepods/besteffort/pod<uid>`, which the kubelet creates and
/// removes): the pod, no container.
#[test]
fn pod_level_line_has_no_container() {
    let parsed =
        parse_pod_cgroup("0::/kubepods/besteffort/pod8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb\n")
            .expect("a pod cgroup");
    assert_eq!(parsed.pod_uid, "8e8e359d-b03d-4b8a-a738-0c4bfb8e4adb");
    assert_eq!(parsed.container_id, None);
}
