//! Istio's sidecar, as its injection template writes it (istio/istio
//! manifests/charts/istio-control/istio-discovery/files/injection-template.yaml) and as
//! pilot-agent runs it. The values the agent's `--proxy-*` flags may change come from
//! [`ProxyConfig`]; the rest are Istio's.
//!
//! - marker: the `sidecar.istio.io/status` annotation naming `istio-init` or `istio-validation`
//!   (pkg/kube/inject/webhook.go `getInjectionStatus`);
//! - proxy `istio-proxy`, uid 1337, capture 15001/15006, DNS capture to pilot-agent's 15053
//!   (`DefaultDNSProxyAddr`, pkg/config/constants/constants.go);
//! - admin 127.0.0.1:15000 (`::1` on IPv6 pods: [`super::MeshProfile::admin_tcp_for`], decided in
//!   `PodView::admin_addr`);
//! - readiness: the kubelet probes pilot-agent on 15021 (`/healthz/ready`);
//! - drain: pilot-agent sends `drain_listeners?inboundonly&graceful` on SIGTERM (or at the
//!   native sidecar's preStop, [`prestop_drain`]);
//! - end: `POST /quitquitquit`; pilot-agent exits with code 0 when Envoy does (pkg/envoy/agent.go
//!   `Run`: Envoy's exit ends the agent), so a Job pod ends Succeeded.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Container;

use super::istio_config::proxy_metadata_from_annotation;
use super::pod_reads::{env_switch, env_value, EnvValue, PodReads, PodSwitches};
use super::{AdminAt, Markers, Mesh, MeshProfile, MeshTexts, ProxyName};
use crate::config::{ProxyConfig, DEFAULT_SANDBOXED_RUNTIME_CLASSES};

pub use super::istio_config::{
    ANNOTATION_ISTIO_INTERCEPTION_MODE as ANNOTATION_INTERCEPTION_MODE,
    ANNOTATION_ISTIO_PROXY_CONFIG as ANNOTATION_PROXY_CONFIG,
    ANNOTATION_ISTIO_SIDECAR_STATUS as ANNOTATION_SIDECAR_STATUS,
};

/// The init steps Istio's sidecar template injects: `istio-init` writes the iptables rules;
/// with the Istio CNI plugin `istio-validation` checks them (injection-template.yaml). They
/// send nothing through the capture ports.
pub const INIT_STEPS: [&str; 2] = ["istio-init", "istio-validation"];

/// pilot-agent's DNS proxy port, the target of Istio's DNS capture (localhost:15053,
/// `DefaultDNSProxyAddr` in istio/istio pkg/config/constants/constants.go).
pub const DNS_PORT: u16 = 15053;

/// `http.<stat_prefix>` scopes whose bytes are not the pod's traffic. `admin` is Envoy's admin
/// API (its HCM's fixed stat prefix): the agent polls it through the drain, and pilot-agent
/// scrapes it for its merged metrics. The others are Istio's bootstrap listeners, by their HCM
/// `stat_prefix` in istio/istio `tools/packaging/common/envoy_bootstrap.json` (checked at
/// 86c9f01fd73, master 2026-08): `agent` (the 15021 status port, routed to pilot-agent: the
/// istio-proxy container's own readiness probe, `/healthz/ready` every 15 s by default per the
/// injection template, and on gateways the cloud load balancers' health checks, which can come
/// from many sources at once), `stats` (15090: Prometheus scrapes, routed to the admin API),
/// `secure_stats` and `secure_merged_stats` (the TLS metrics ports, when enabled). (The app
/// containers' own probes, rewritten by the injector, go to pilot-agent on 15020 without
/// passing through Envoy.)
pub const OWN_HTTP_PREFIXES: [&str; 5] = [
    "admin",
    "agent",
    "stats",
    "secure_stats",
    "secure_merged_stats",
];

/// The proxy container's name in Istio's injection template (`istio-proxy`).
pub const CONTAINER: &str = "istio-proxy";
/// The uid the template runs the proxy as (`runAsUser: 1337`, `ProxyUID` in
/// tools/istio-iptables), excluded by its iptables rules.
pub const PROXY_UID: u32 = 1337;
/// Envoy's admin address in Istio's bootstrap (`localhost:15000`, IPv4 first: pkg/bootstrap's
/// `proxyAdminPort`; `::1` on IPv6 pods, [`super::MeshProfile::admin_tcp_for`]).
pub const ADMIN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 15000);
/// istio-iptables' outbound capture port (`ProxyPort`, 15001).
pub const OUTBOUND_PORT: u16 = 15001;
/// istio-iptables' inbound capture port (`InboundCapturePort`, 15006).
pub const INBOUND_PORT: u16 = 15006;

/// The `--proxy-*` flags' defaults: Istio's values above (the flags change Istio's profile
/// only), and every known sandboxed runtime class.
impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            container: CONTAINER.into(),
            uid: PROXY_UID,
            admin: ADMIN,
            outbound_port: OUTBOUND_PORT,
            inbound_port: INBOUND_PORT,
            sandboxed_runtime_classes: DEFAULT_SANDBOXED_RUNTIME_CLASSES
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

/// Istio's profile with the agent's `--proxy-*` flags.
pub fn profile(flags: &ProxyConfig) -> MeshProfile {
    MeshProfile {
        mesh: Mesh::Istio,
        proxy: ProxyName {
            exact: flags.container.clone(),
            prefix: None,
        },
        init_steps: &INIT_STEPS,
        proxy_uid: flags.uid,
        outbound_port: flags.outbound_port,
        inbound_port: flags.inbound_port,
        dns_port: Some(DNS_PORT),
        // pilot-agent's DNS proxy serves UDP and TCP, and istio-iptables redirects both
        // (`SetupDNSRedir`, tools/istio-iptables/pkg/capture/run.go).
        dns_tcp: true,
        admin: AdminAt::Tcp(flags.admin),
        admin_follows_pod_ips: true,
        own_http_prefixes: &OWN_HTTP_PREFIXES,
        listener_counts: false,
        sigterm_after_quit: false,
        fails_health_check_on_sigterm: false,
        readiness: "pilot-agent's /healthz/ready on 15021",
    }
}

/// Istio injected the pod: its status annotation names one of its init steps (a pod with
/// interception mode NONE, or another template, has none: no rules to hold by).
pub(super) fn injected(markers: &Markers<'_>) -> Result<(), String> {
    let Some(status) = (markers.annotation)(ANNOTATION_SIDECAR_STATUS) else {
        return Err(format!("no {ANNOTATION_SIDECAR_STATUS} annotation"));
    };
    let inits = injected_init_containers(status)?;
    if !inits.iter().any(|i| INIT_STEPS.contains(&i.as_str())) {
        return Err(format!(
            "{ANNOTATION_SIDECAR_STATUS} names neither istio-init nor istio-validation \
             (interception mode NONE, or another template)"
        ));
    }
    Ok(())
}

/// Istio's status annotation's `initContainers` names.
fn injected_init_containers(value: &str) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct SidecarInjectionStatus {
        #[serde(default, rename = "initContainers")]
        init_containers: Option<Vec<String>>,
    }
    // Istio writes a few hundred bytes; a larger value is not its template's.
    const MAX: usize = 16 * 1024;
    if value.len() > MAX {
        return Err(format!(
            "{ANNOTATION_SIDECAR_STATUS} is {} bytes, above the {MAX} holdfast reads",
            value.len()
        ));
    }
    serde_json::from_str::<SidecarInjectionStatus>(value)
        .map(|s| s.init_containers.unwrap_or_default())
        .map_err(|e| format!("{ANNOTATION_SIDECAR_STATUS} is not Istio's JSON ({e})"))
}

/// Whether a native proxy's preStop is Istio's drain: `pilot-agent request --debug-port=15020
/// POST drain` (injection-template.yaml, and the golden file
/// pkg/kube/inject/testdata/inject/native-sidecar.yaml.injected, istio/istio 1.28). A mesh's
/// `global.proxy.lifecycle` replaces it; then pilot-agent drains only after its SIGTERM, which
/// the kubelet sends once the app has exited.
pub fn prestop_drain(proxy: &Container) -> bool {
    let Some(words) = prestop_command(proxy) else {
        return false;
    };
    matches!(words.first(), Some(w) if w.ends_with("pilot-agent"))
        && words.contains(&"request")
        && words.ends_with(&["POST", "drain"])
}

/// The proxy's preStop exec command, word by word.
pub(super) fn prestop_command(proxy: &Container) -> Option<Vec<&str>> {
    let cmd = proxy
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.as_ref())?;
    Some(cmd.iter().map(String::as_str).collect())
}

/// Istio's operator texts.
pub static TEXTS: MeshTexts = MeshTexts {
    injector: "Istio's sidecar template",
    agent: "pilot-agent",
    prestop_drain: "Istio's preStop (`pilot-agent request ... POST drain`) drained inbound",
    own_end: "pilot-agent's own drain (terminationDrainDuration)",
    keep_byte_counters: Some(
        "Add inclusionSuffixes [downstream_cx_rx_bytes_total, downstream_cx_tx_bytes_total, \
         downstream_cx_tx_bytes_buffered] to meshConfig.defaultConfig.proxyStatsMatcher \
         (manifests/mesh-config)",
    ),
    install_filter: Some("Install the filter (manifests/wasmplugin.yaml)"),
    envoy_1_34: "Istio 1.26 or later (Envoy 1.34+)",
};

/// pilot-agent's "end Envoy on zero active connections" switch
/// (pilot/cmd/pilot-agent/options/options.go, used in pkg/envoy/agent.go `terminate`).
pub const ENV_EXIT_ON_ZERO: &str = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS";

/// The advice when Envoy exited before the app was done. Without
/// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` pilot-agent ended Envoy after `terminationDrainDuration`;
/// with it, pilot-agent ignores that duration and ends Envoy once its listeners count no active
/// connection after `MINIMUM_DRAIN_DURATION` (5 s), polling every second (pkg/envoy/agent.go
/// `terminate`) — an app between two calls has none.
pub fn proxy_gone_early_advice(exit_on_zero: bool) -> String {
    if exit_on_zero {
        format!(
            "Envoy exited while the app still ran: this pod's proxy sets {ENV_EXIT_ON_ZERO}, so \
             pilot-agent ends Envoy as soon as no connection is active (after \
             MINIMUM_DRAIN_DURATION, 5s) and terminationDrainDuration has no effect. Remove \
             {ENV_EXIT_ON_ZERO} from this pod's proxyMetadata (mesh defaultConfig or the \
             {ANNOTATION_PROXY_CONFIG} annotation) and set terminationDrainDuration to the \
             pod's grace period, so holdfast ends Envoy when the app is done"
        )
    } else {
        "Envoy exited while the app still ran: set meshConfig.defaultConfig.\
         terminationDrainDuration (or this pod's proxy.istio.io/config) to the pod's grace period, \
         so Envoy outlives the app and holdfast ends it when the app is done"
            .to_string()
    }
}

/// The proxy's environment variable that turns on Istio's DNS capture (redirect of port 53 to
/// pilot-agent's 15053): pilot/cmd/pilot-agent/options/options.go `DNSCaptureByAgent`, and
/// tools/istio-iptables/pkg/cmd/root.go for the redirect rule.
pub const ENV_DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
/// Istio's dual-stack switch (pilot/pkg/features/experimental.go `EnableDualStack`).
pub const ENV_DUAL_STACK: &str = "ISTIO_DUAL_STACK";
/// How Istio tells the proxy its interception mode (injection-template.yaml).
pub const ENV_INTERCEPTION_MODE: &str = "ISTIO_META_INTERCEPTION_MODE";

/// Istio's per-pod switches: each from the proxy's env first (what pilot-agent reads; Istio
/// renders mesh-wide and per-pod `proxyMetadata` into it at injection), then the
/// `proxy.istio.io/config` annotation's `proxyMetadata`. Malformed: false (Istio's default).
pub(super) fn read_pod(reads: &PodReads<'_>, problems: &mut Vec<String>) -> PodSwitches {
    let metadata = match (reads.annotation)(ANNOTATION_PROXY_CONFIG) {
        Some(v) => proxy_metadata_from_annotation(v).unwrap_or_else(|problem| {
            problems.push(format!("{problem}; ignored"));
            Default::default()
        }),
        None => Default::default(),
    };
    let mut switch = |var: &str| {
        let fallback = metadata
            .get(var)
            .map(|v| (v.as_str(), ANNOTATION_PROXY_CONFIG));
        env_switch(TEXTS.agent, reads.proxy, var, fallback, problems)
    };
    PodSwitches {
        dns_capture: switch(ENV_DNS_CAPTURE),
        exit_on_zero: switch(ENV_EXIT_ON_ZERO),
        dual_stack: switch(ENV_DUAL_STACK),
    }
}

/// Istio's gateways, waypoints and ztunnel: a proxy in another role than `sidecar`.
pub(super) fn not_a_sidecar(reads: &PodReads<'_>) -> Option<String> {
    // pilot-agent's role is its second argument: `proxy sidecar` in the sidecar template,
    // `proxy router` for gateways (gateway-injection-template.yaml), `proxy waypoint`
    // (waypoint.yaml), `proxy ztunnel` (charts/ztunnel/templates/daemonset.yaml).
    let args: Vec<&str> = reads
        .proxy
        .args
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    let ["proxy", role, ..] = args.as_slice() else {
        return None;
    };
    let kind = match *role {
        "sidecar" => return None,
        "router" => "a gateway",
        "waypoint" => "a waypoint",
        "ztunnel" => "ztunnel",
        _ => "not a sidecar",
    };
    Some(format!("{} runs `proxy {role}`: {kind}", reads.proxy.name))
}

/// An interception mode other than REDIRECT, from any place Istio writes it.
pub(super) fn other_interception(reads: &PodReads<'_>) -> Option<String> {
    interception_modes(reads)
        .into_iter()
        .map(str::trim)
        .find(|m| !m.is_empty() && !m.eq_ignore_ascii_case("REDIRECT"))
        .map(str::to_ascii_uppercase)
}

/// The interception mode from every place Istio writes it: the annotation (written by the
/// injector with the CNI plugin), the proxy's `ISTIO_META_INTERCEPTION_MODE`, and istio-init's
/// `-m` argument (injection-template.yaml). Empty when none says: Istio's default, REDIRECT.
fn interception_modes<'a>(reads: &PodReads<'a>) -> Vec<&'a str> {
    let mut modes = Vec::new();
    if let Some(m) = (reads.annotation)(ANNOTATION_INTERCEPTION_MODE) {
        modes.push(m);
    }
    if let EnvValue::Literal(m) = env_value(reads.proxy, ENV_INTERCEPTION_MODE) {
        modes.push(m);
    }
    let inits = reads
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref());
    for init in inits.into_iter().flatten() {
        let mut args = init.args.iter().flatten().map(String::as_str).peekable();
        if args.peek() != Some(&"istio-iptables") {
            continue;
        }
        let args: Vec<&str> = args.collect();
        for pair in args.windows(2) {
            if pair[0] == "-m" || pair[0] == "--istio-inbound-interception-mode" {
                modes.push(pair[1]);
            }
        }
    }
    modes
}
