//! Property tests of the parsers that read the outside world (issue 11, "Fuzz the parsers"):
//! each must never panic on arbitrary input, and must read back real-shaped input it generated.
//! A checked-in corpus of real inputs (`tests/corpus/`) is replayed first. Case counts are
//! bounded (`CASES`) so the whole file runs in seconds inside `cargo test`; raise
//! `PROPTEST_CASES` for a longer run.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use holdfast::config::{HoldSettings, PodOverrides, ProxyConfig};
use holdfast::effects::envoy_admin::Stats;
use holdfast::effects::hold::nfqueue::{parse_flow, parse_queue_waiting};
use holdfast::effects::procfs::cgroup::parse_pod_cgroup;
use holdfast::pod::PodView;
use proptest::prelude::*;

const CASES: u32 = 256;

fn corpus(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---- corpus replay -------------------------------------------------------------------------

/// `tests/corpus/cgroup.txt`: `uid<TAB>container id or -<TAB>/proc/<pid>/cgroup line`, from the
/// kubelet naming forms (cgroupfs and systemd drivers, v1 and v2, containerd, CRI-O, docker,
/// kind's nesting) that `effects::procfs::cgroup` documents.
#[test]
fn corpus_cgroup_lines() {
    for row in corpus("cgroup.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut f = row.splitn(3, '\t');
        let (uid, cid, line) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let got = parse_pod_cgroup(line).unwrap_or_else(|| panic!("no pod in {line}"));
        assert_eq!(got.pod_uid, uid, "{line}");
        assert_eq!(
            got.container_id.as_deref(),
            (cid != "-").then_some(cid),
            "{line}"
        );
    }
}

/// An Istio-injected pod as the API server returns it (trimmed `kubectl get pod -o json` of
/// istio's httpbin sample): tracked, with its proxy found.
#[test]
fn corpus_istio_pod() {
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_str(&corpus("pod-istio-httpbin.json")).unwrap();
    let view = PodView::from_pod(
        &pod,
        "node-a",
        &ProxyConfig::default(),
        &HoldSettings::default(),
    )
    .unwrap_or_else(|e| panic!("not tracked: {e}"));
    assert_eq!(view.key.uid, "0b4d3c1e-8f7a-4c2b-9d6e-5a1f2e3d4c5b");
}

/// Envoy 1.3x `GET /stats?filter=...` text: counters and gauges read, histograms skipped.
#[test]
fn corpus_envoy_stats() {
    let stats = Stats::parse(&corpus("envoy-stats.txt"));
    assert_eq!(stats.get("server.state"), Some(0));
    assert_eq!(stats.get("listener_manager.workers_started"), Some(1));
    assert_eq!(stats.get("holdfast.inbound.cx_active"), Some(3));
    assert!(stats.skipped >= 1, "{stats:?}");
    assert_eq!(stats.malformed_count, 0, "{stats:?}");
}

/// `/proc/net/netfilter/nfnetlink_queue` with two queues bound.
#[test]
fn corpus_nfnetlink_queue() {
    let text = corpus("nfnetlink_queue.txt");
    assert_eq!(parse_queue_waiting(&text, 15015), Some(3));
    assert_eq!(parse_queue_waiting(&text, 7), Some(0));
    assert_eq!(parse_queue_waiting(&text, 1), None);
}

/// A SYN from 10.244.1.7:43512 to 10.96.0.10:8080 as NFQUEUE delivers it (IPv4 header + TCP).
#[test]
fn corpus_syn_packet() {
    let hex = corpus("syn-ipv4.hex");
    let bytes: Vec<u8> = hex
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let flow = parse_flow(&bytes).unwrap();
    assert_eq!(flow.src, IpAddr::V4(Ipv4Addr::new(10, 244, 1, 7)));
    assert_eq!(flow.src_port, 43512);
    assert_eq!(flow.dst, IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)));
    assert_eq!(flow.dst_port, 8080);
}

// ---- generators ----------------------------------------------------------------------------

fn hex(n: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(b"0123456789abcdef".to_vec()), n)
        .prop_map(|v| String::from_utf8(v).unwrap_or_default())
}

fn pod_uid() -> impl Strategy<Value = String> {
    (hex(8), hex(4), hex(4), hex(4), hex(12))
        .prop_map(|(a, b, c, d, e)| format!("{a}-{b}-{c}-{d}-{e}"))
}

/// A `/proc/<pid>/cgroup` line as kubelet + a runtime name a container's cgroup.
fn cgroup_line() -> impl Strategy<Value = (String, String, String)> {
    (
        pod_uid(),
        hex(64),
        prop_oneof![Just(""), Just("burstable"), Just("besteffort")],
        0..3usize, // driver: cgroupfs, systemd, runc's systemd form
        prop_oneof![Just("cri-containerd"), Just("crio"), Just("docker")],
        prop_oneof![Just("0::"), Just("4:memory:"), Just("1:name=systemd:")],
        prop_oneof![Just(""), Just("/system.slice/docker-0123abcd.scope/kubelet.slice")],
    )
        .prop_map(|(uid, cid, qos, driver, runtime, head, nest)| {
            let under = uid.replace('-', "_");
            let path = match driver {
                0 => {
                    let qos = if qos.is_empty() { String::new() } else { format!("/{qos}") };
                    format!("{nest}/kubepods{qos}/pod{uid}/{cid}")
                }
                1 => {
                    let (qslice, qpart) = if qos.is_empty() {
                        (String::new(), String::new())
                    } else {
                        (format!("/kubepods-{qos}.slice"), format!("-{qos}"))
                    };
                    format!("{nest}/kubepods.slice{qslice}/kubepods{qpart}-pod{under}.slice/{runtime}-{cid}.scope")
                }
                _ => format!("{nest}/kubepods-besteffort-pod{under}.slice:{runtime}:{cid}"),
            };
            (uid, cid, format!("{head}{path}"))
        })
}

/// A JSON value of any shape (bounded depth and size).
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A Pod-shaped object: the fields the agent reads, with random presence and values.
fn pod_json() -> impl Strategy<Value = serde_json::Value> {
    let container = (
        prop_oneof![Just("istio-proxy".to_string()), Just("app".to_string()), ".{0,10}"],
        proptest::option::of(json_value()),
    )
        .prop_map(|(name, ports)| serde_json::json!({"name": name, "ports": ports.map(|_| Vec::<u8>::new())}));
    (
        proptest::option::of(prop_oneof![pod_uid(), ".{0,40}"]),
        proptest::option::of(".{0,20}"),
        proptest::collection::btree_map(
            prop_oneof![
                Just("holdfast.io/enabled".to_string()),
                Just("holdfast.io/hold-timeout".to_string()),
                Just("sidecar.istio.io/status".to_string()),
                ".{0,20}"
            ],
            ".{0,30}",
            0..4,
        ),
        proptest::option::of(prop_oneof![Just("node-a".to_string()), ".{0,10}"]),
        proptest::option::of(any::<bool>()),
        proptest::collection::vec(container, 0..4),
        proptest::option::of(json_value()),
        proptest::option::of(".{0,30}"),
    )
        .prop_map(
            |(uid, name, annotations, node, host_net, containers, status, deletion)| {
                serde_json::json!({
                    "metadata": {"uid": uid, "name": name, "namespace": "ns",
                                 "annotations": annotations, "deletionTimestamp": deletion},
                    "spec": {"nodeName": node, "hostNetwork": host_net, "containers": containers},
                    "status": status,
                })
            },
        )
}

// ---- properties ----------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn cgroup_parser_never_panics(text in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_pod_cgroup(&String::from_utf8_lossy(&text));
    }

    #[test]
    fn cgroup_parser_never_panics_on_near_misses(line in "[0-9]:[a-z=]{0,8}:(/[a-z_.:-]{0,12}(pod)?[0-9a-f_-]{0,40}){0,5}") {
        let _ = parse_pod_cgroup(&line);
    }

    #[test]
    fn cgroup_parser_reads_generated_lines((uid, cid, line) in cgroup_line()) {
        let got = parse_pod_cgroup(&line);
        prop_assert!(got.is_some(), "{}", line);
        let got = got.unwrap_or_else(|| unreachable!());
        prop_assert_eq!(got.pod_uid, uid, "{}", line);
        prop_assert_eq!(got.container_id, Some(cid), "{}", line);
    }

    #[test]
    fn pod_view_never_panics(value in prop_oneof![pod_json(), json_value()]) {
        // Whatever deserializes as a Pod must be read without a panic (tracked or not).
        if let Ok(pod) = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(value) {
            let _ = PodView::from_pod(&pod, "node-a", &ProxyConfig::default(), &HoldSettings::default());
        }
    }

    #[test]
    fn annotations_never_panic(pairs in proptest::collection::vec((
        prop_oneof![Just("holdfast.io/enabled".to_string()), Just("holdfast.io/hold-timeout".to_string()), ".{0,20}"],
        ".{0,30}"), 0..6)) {
        let defaults = HoldSettings::default();
        let o = PodOverrides::from_annotations(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())), &defaults);
        prop_assert!(o.hold_timeout > Duration::ZERO);
        prop_assert!(o.hold_timeout <= defaults.max_timeout);
    }

    #[test]
    fn hold_timeout_annotation_round_trips(h in 0u64..24, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
        let text = format!("{h}h{m}m{s}s{ms}ms");
        let want = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
        let defaults = HoldSettings::default();
        let o = PodOverrides::from_annotations([("holdfast.io/hold-timeout", text.as_str())], &defaults);
        if want.is_zero() {
            prop_assert_eq!(o.problems.len(), 1);
        } else if want > defaults.max_timeout {
            // Above the node's ceiling: clamped, and said (issue 25).
            prop_assert_eq!(o.hold_timeout, defaults.max_timeout);
            prop_assert_eq!(o.problems.len(), 1);
        } else {
            prop_assert_eq!(o.hold_timeout, want, "{}: {:?}", text, o.problems);
        }
    }

    #[test]
    fn duration_parser_never_panics(text in prop_oneof![".{0,24}", "[0-9hms ]{0,24}", "[0-9]{15,30}(h|m|s|ms)?"]) {
        let _ = holdfast::config::parse_duration(&text);
    }

    #[test]
    fn flow_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        let _ = parse_flow(&bytes);
    }

    #[test]
    fn flow_parser_reads_generated_ipv4_syns(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
                                             sport in any::<u16>(), dport in any::<u16>(), opts in 0usize..11) {
        let ihl = 5 + opts;
        let mut p = vec![0u8; ihl * 4 + 20];
        p[0] = 0x40 | ihl as u8;
        p[9] = 6;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p[ihl * 4..ihl * 4 + 2].copy_from_slice(&sport.to_be_bytes());
        p[ihl * 4 + 2..ihl * 4 + 4].copy_from_slice(&dport.to_be_bytes());
        let flow = parse_flow(&p);
        prop_assert!(flow.is_some());
        let flow = flow.unwrap_or_else(|| unreachable!());
        prop_assert_eq!(flow.src, IpAddr::V4(Ipv4Addr::from(src)));
        prop_assert_eq!(flow.dst, IpAddr::V4(Ipv4Addr::from(dst)));
        prop_assert_eq!((flow.src_port, flow.dst_port), (sport, dport));
    }

    #[test]
    fn queue_waiting_parser_never_panics(text in ".{0,200}", num in any::<u16>()) {
        let _ = parse_queue_waiting(&text, num);
    }

    #[test]
    fn queue_waiting_reads_generated_lines(rows in proptest::collection::btree_map(any::<u16>(), any::<u64>(), 1..5)) {
        // Columns as in net/netfilter/nfnetlink_queue.c seq_show: queue_num peer_portid
        // queue_total copy_mode copy_range queue_dropped queue_user_dropped id_sequence 1.
        let text: String = rows.iter()
            .map(|(n, t)| format!("{n:>5} {:>6} {t:>5} 2 65531 0 0 12 1\n", 4242))
            .collect();
        for (n, t) in &rows {
            prop_assert_eq!(parse_queue_waiting(&text, *n), Some(*t));
        }
    }

    #[test]
    fn envoy_stats_parser_never_panics(text in ".{0,300}") {
        let stats = Stats::parse(&text);
        prop_assert!(stats.malformed.len() <= Stats::MAX_MALFORMED_KEPT);
    }

    #[test]
    fn envoy_stats_read_generated_lines(values in proptest::collection::btree_map("[a-z_]{1,8}(\\.[a-z_0-9]{1,8}){0,3}", any::<u64>(), 0..8)) {
        let text: String = values.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
        let stats = Stats::parse(&text);
        for (k, v) in &values {
            prop_assert_eq!(stats.get(k), Some(*v));
        }
        prop_assert_eq!(stats.malformed_count, 0);
    }

    #[test]
    fn pods_dir_file_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), yaml in any::<bool>()) {
        let name = if yaml { "p.yaml" } else { "p.json" };
        let _ = holdfast::source::dir::parse_pod(Path::new(name), &bytes);
    }

    #[test]
    fn pods_dir_yaml_never_panics(text in "([a-z{}\\[\\]:,&*!|>'\" -]|\n){0,120}") {
        let _ = holdfast::source::dir::parse_pod(Path::new("p.yaml"), text.as_bytes());
    }
}
