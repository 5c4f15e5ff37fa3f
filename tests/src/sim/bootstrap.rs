//! The sidecar's Envoy configuration, shaped like an Istio sidecar's.
//!
//! The bootstrap has the admin API on 127.0.0.1:15000 and takes its listeners and clusters from
//! files (LDS/CDS `path_config_source`), so Envoy counts `listener_manager.lds.update_success` and
//! `cluster_manager.cds.update_success` as it does when pilot-agent serves xDS.
//!
//! - OUTBOUND listener on 15001 (`virtualOutbound`): the `original_dst` listener filter restores the
//!   destination the app dialled before the REDIRECT, and `tcp_proxy` forwards to the ORIGINAL_DST
//!   `PassthroughCluster`. With `use_original_dst` (pilot/pkg/networking/core/listener_builder.go)
//!   a connection whose restored destination port has a listener of its own is handed to it:
//! - OUTBOUND HTTP listener `0.0.0.0_8080` for the remote's HTTP service port, as Istio builds one
//!   per `http` service port (pilot/pkg/networking/core/listener.go: `bind_to_port: false`, an
//!   HTTP connection manager with `stat_prefix` `outbound_0.0.0.0_8080;` — the direction, the
//!   listener name and Istio's `;` delimiter, util.DelimitedStatsPrefix), routing to the
//!   `PassthroughCluster` as Istio's `allow_any` virtual host does. HTTP/1.1 and HTTP/2 (h2c)
//!   downstream; HTTP/1.1 to the service. This is where a drain that touches outbound shows:
//!   `Connection: close` and GOAWAY come from an HTTP connection manager, never a `tcp_proxy`.
//! - INBOUND listener on 15006 (`virtualInbound`): `original_dst` again, and `tcp_proxy` to the
//!   ORIGINAL_DST `InboundPassthroughCluster` with the upstream bound to 127.0.0.6, as Istio does.
//!   We chose this over a static cluster to `127.0.0.1:<app port>` because it exercises the real
//!   `-o lo -s 127.0.0.6/32 -j RETURN` rule, needs no per-pod port knowledge, and the app sees the
//!   connection arrive on its pod IP exactly as in a mesh.
//! - IPv6 ([`SidecarConfig::families`]), as Istio's bootstrap and listeners do it: admin on the
//!   first family's loopback (`::1` for IPv6-first, pkg/bootstrap/config.go), capture listeners on
//!   the first family's wildcard with the other as an additional address
//!   (pilot/pkg/networking/core/listener_builder.go, `AdditionalAddresses` under dual stack).
//!   Inbound upstreams still bind 127.0.0.6 only: IPv6 inbound is not simulated.
//! - The holdfast filter (`envoy.filters.network.wasm`, root_id `holdfast`, V8) comes first in
//!   both filter chains, before `tcp_proxy`, when enabled.
//! - Envoy keeps only the stats Istio's bootstrap keeps ([`IstioStatsMatcher`]): Istio's own
//!   patterns (the corpus file the agent's real-Envoy drain test also reads) plus the mesh's
//!   `proxyStatsMatcher`, read from the mesh config holdfast ships
//!   (manifests/mesh-config/istiooperator.yaml), so every test runs with what a real install
//!   keeps and drops.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::istio_init::{ADMIN_PORT, INBOUND_PORT, OUTBOUND_PORT};

/// Everything that varies between sidecars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarConfig {
    /// Envoy node id (`sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`, as Istio names it).
    pub node_id: String,
    /// Envoy node cluster (`<app>.<ns>`).
    pub node_cluster: String,
    /// The holdfast filter module, or `None` to run without it.
    pub filter: Option<PathBuf>,
    /// The filter's plugin configuration (JSON text; empty means defaults).
    pub filter_config: String,
    /// The pod's IP families.
    pub families: super::spec::IpFamilies,
    /// Which stats Envoy keeps (`None`: all, Envoy's default).
    pub stats_matcher: Option<IstioStatsMatcher>,
    /// Istio's health listener: `0.0.0.0_15021` (a static listener of Istio's bootstrap,
    /// tools/packaging/common/envoy_bootstrap.json) routing `/healthz/ready` to the `agent`
    /// cluster, pilot-agent's status port on the admin loopback. The injected startup and
    /// readiness probes go there, so they pass only once Envoy's workers serve and pilot-agent
    /// says ready. On when the kubelet stand-in probes the proxy.
    pub health_listener: bool,
    /// Where LDS and CDS come from: `None`, files in the config directory (there at once);
    /// `Some`, pilot-agent's xDS stand-in over REST on this unix socket ([`super::xds`]).
    pub xds: Option<XdsRest>,
    /// The mesh whose sidecar this is: Kuma's and Consul's Envoy has its admin on their port
    /// (9901 — kuma-dp moves it to its Unix socket when asked —, 19000) and its inbound
    /// listener on theirs (15006, 20000), named as their control planes name them.
    pub mesh: super::mesh::Mesh,
    /// Envoy's admin address's IP where the mesh does not follow the pod's families (`None`:
    /// Istio's rule, `::1` on IPv6-first pods; Kuma's `adminAddress` 127.0.0.1 whatever the
    /// pod's IPs; Consul's `-envoy-admin-bind-address`: [`super::spec::PodSpec::admin_addr`]).
    pub admin_ip: Option<std::net::IpAddr>,
}

/// Envoy's REST xDS source: pilot-agent's stand-in on a unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsRest {
    pub socket: PathBuf,
    /// How late the first answer may come (Envoy must not give up before).
    pub delay: std::time::Duration,
}

/// File names of the rendered configuration inside the sidecar's config directory.
pub const BOOTSTRAP_FILE: &str = "envoy-bootstrap.json";
pub(crate) const LDS_FILE: &str = "lds.json";
pub(crate) const CDS_FILE: &str = "cds.json";

impl SidecarConfig {
    /// The bootstrap, pointing LDS and CDS at files in `dir`.
    pub fn bootstrap(&self, dir: &Path) -> Value {
        let path_source = |file: &str| {
            json!({
                "resource_api_version": "V3",
                "path_config_source": { "path": dir.join(file).to_string_lossy() }
            })
        };
        let loopback = if self.families.ipv6_first() {
            "::1"
        } else {
            "127.0.0.1"
        };
        let admin_ip = self.admin_ip.map(|ip| ip.to_string());
        let mut b = json!({
            "node": { "id": self.node_id, "cluster": self.node_cluster },
            "admin": {
                "address": socket(admin_ip.as_deref().unwrap_or(loopback), self.admin_port()),
            },
            "dynamic_resources": {
                "lds_config": path_source(LDS_FILE),
                "cds_config": path_source(CDS_FILE),
            }
        });
        let mut clusters = Vec::new();
        if let Some(x) = &self.xds {
            let rest_source = json!({
                "resource_api_version": "V3",
                // Wait for the first answer however late it is, as Istio's bootstrap does for
                // its ADS stream.
                "initial_fetch_timeout": "0s",
                "api_config_source": {
                    "api_type": "REST",
                    "transport_api_version": "V3",
                    "cluster_names": [XDS_CLUSTER],
                    "refresh_delay": "3600s",
                    "request_timeout": format!("{}s", super::xds::request_timeout(x.delay).as_secs()),
                }
            });
            b["dynamic_resources"] =
                json!({ "lds_config": rest_source, "cds_config": rest_source });
            clusters.push(json!({
                "name": XDS_CLUSTER,
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {
                    "cluster_name": XDS_CLUSTER,
                    "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": {
                        "pipe": { "path": x.socket.to_string_lossy() }
                    }}}]}]
                }
            }));
        }
        if self.health_listener {
            clusters.push(json!({
                "name": "agent",
                "alt_stat_name": "agent;",
                "type": "STATIC",
                "connect_timeout": "0.250s",
                "lb_policy": "ROUND_ROBIN",
                "load_assignment": {
                    "cluster_name": "agent",
                    "endpoints": [{ "lb_endpoints": [{ "endpoint": {
                        "address": socket(loopback, super::istio_init::STATUS_PORT)
                    }}]}]
                }
            }));
        }
        let mut static_resources = serde_json::Map::new();
        if !clusters.is_empty() {
            static_resources.insert("clusters".into(), Value::Array(clusters));
        }
        if self.health_listener {
            static_resources.insert("listeners".into(), json!([self.health_listener()]));
        }
        if let (false, Some(obj)) = (static_resources.is_empty(), b.as_object_mut()) {
            obj.insert("static_resources".into(), Value::Object(static_resources));
        }
        if let (Some(m), Some(obj)) = (&self.stats_matcher, b.as_object_mut()) {
            obj.insert("stats_config".into(), m.stats_config());
        }
        b
    }

    /// Envoy's admin TCP port (Kuma's socket admin is set by kuma-dp over this).
    fn admin_port(&self) -> u16 {
        match self.mesh {
            super::mesh::Mesh::Istio => ADMIN_PORT,
            super::mesh::Mesh::Kuma(_) => super::mesh::KUMA_ADMIN_PORT,
            super::mesh::Mesh::Consul => super::mesh::CONSUL_ADMIN_PORT,
        }
    }

    /// The capture listeners' names: Istio's `virtualOutbound`/`virtualInbound`, Kuma's
    /// `outbound:passthrough:ipv4`/`inbound:passthrough:ipv4` (pkg/xds/generator, transparent
    /// proxy), Consul's `outbound_listener:127.0.0.1:15001`/`public_listener:0.0.0.0:20000`
    /// (agent/xds/listeners.go).
    fn listener_names(&self) -> (&'static str, &'static str) {
        match self.mesh {
            super::mesh::Mesh::Istio => ("virtualOutbound", "virtualInbound"),
            super::mesh::Mesh::Kuma(_) => ("outbound:passthrough:ipv4", "inbound:passthrough:ipv4"),
            super::mesh::Mesh::Consul => (
                "outbound_listener:127.0.0.1:15001",
                "public_listener:0.0.0.0:20000",
            ),
        }
    }

    /// Istio's `0.0.0.0_15021` health listener (see [`SidecarConfig::health_listener`]).
    fn health_listener(&self) -> Value {
        let wildcard = if self.families.ipv6_first() {
            "::"
        } else {
            "0.0.0.0"
        };
        let port = super::istio_init::HEALTH_PORT;
        json!({
            "name": format!("{wildcard}_{port}"),
            "address": socket(wildcard, port),
            "filter_chains": [{ "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "codec_type": "AUTO",
                    "stat_prefix": "agent",
                    "route_config": { "virtual_hosts": [{
                        "name": "backend",
                        "domains": ["*"],
                        "routes": [{ "match": { "prefix": "/healthz/ready" }, "route": { "cluster": "agent" } }]
                    }]},
                    "http_filters": [{
                        "name": "envoy.filters.http.router",
                        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
                    }]
                }
            }]}]
        })
    }

    /// The LDS response: the outbound and inbound capture listeners, and the outbound HTTP
    /// listener of the remote's HTTP port.
    pub fn listeners(&self) -> Value {
        let (outbound, inbound) = self.listener_names();
        let inbound_port = if self.mesh == super::mesh::Mesh::Istio {
            INBOUND_PORT
        } else {
            self.mesh.inbound_port()
        };
        json!({
            "version_info": "1",
            "resources": [
                self.listener(outbound, OUTBOUND_PORT, "OUTBOUND", "PassthroughCluster"),
                self.listener(inbound, inbound_port, "INBOUND", "InboundPassthroughCluster"),
                self.http_listener(super::http_calls::REMOTE_HTTP_PORT),
            ]
        })
    }

    /// The CDS response: the two ORIGINAL_DST clusters.
    pub fn clusters(&self) -> Value {
        json!({
            "version_info": "1",
            "resources": [
                original_dst_cluster("PassthroughCluster", None),
                original_dst_cluster("InboundPassthroughCluster", Some("127.0.0.6")),
            ]
        })
    }

    fn listener(&self, name: &str, port: u16, direction: &str, cluster: &str) -> Value {
        let mut filters = Vec::new();
        if let Some(module) = &self.filter {
            filters.push(wasm_filter(module, &self.filter_config));
        }
        filters.push(json!({
            "name": "envoy.filters.network.tcp_proxy",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": cluster,
                "cluster": cluster,
            }
        }));
        let mut wildcards = Vec::new();
        if self.families.ipv6_first() {
            wildcards.push("::");
        }
        if self.families.has_ipv4() {
            wildcards.push("0.0.0.0");
        }
        let additional: Vec<Value> = wildcards
            .iter()
            .skip(1)
            .map(|w| json!({ "address": socket(w, port) }))
            .collect();
        json!({
            "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
            "name": name,
            "address": socket(wildcards.first().copied().unwrap_or("0.0.0.0"), port),
            "additional_addresses": additional,
            "traffic_direction": direction,
            // Istio sets it on virtualOutbound (listener_builder.go); on virtualInbound it has no
            // listener to hand connections to.
            "use_original_dst": direction == "OUTBOUND",
            "listener_filters": [{
                "name": "envoy.filters.listener.original_dst",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"
                }
            }],
            "filter_chains": [{ "filters": filters }],
        })
    }

    /// The outbound HTTP listener of one service port (see the module docs), the holdfast
    /// filter first when enabled, as a WasmPlugin of type NETWORK puts it.
    fn http_listener(&self, port: u16) -> Value {
        let wildcard = if self.families.ipv6_first() {
            "::"
        } else {
            "0.0.0.0"
        };
        let name = format!("{wildcard}_{port}");
        let mut filters = Vec::new();
        if let Some(module) = &self.filter {
            filters.push(wasm_filter(module, &self.filter_config));
        }
        filters.push(json!({
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("outbound_{name};"),
                "codec_type": "AUTO",
                "route_config": {
                    "name": port.to_string(),
                    "virtual_hosts": [{
                        "name": "allow_any",
                        "domains": ["*"],
                        "routes": [{
                            "match": { "prefix": "/" },
                            "route": { "cluster": "PassthroughCluster", "timeout": "0s" }
                        }]
                    }]
                },
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                    }
                }]
            }
        }));
        json!({
            "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
            "name": name,
            "address": socket(wildcard, port),
            "bind_to_port": false,
            "traffic_direction": "OUTBOUND",
            "filter_chains": [{ "filters": filters }],
        })
    }

    /// Writes bootstrap, LDS and CDS into `dir` (which must be readable by the proxy uid) and
    /// returns the bootstrap's path.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let write = |file: &str, v: Value| -> std::io::Result<PathBuf> {
            let p = dir.join(file);
            let text = serde_json::to_string_pretty(&v).map_err(std::io::Error::other)?;
            std::fs::write(&p, text)?;
            Ok(p)
        };
        write(CDS_FILE, self.clusters())?;
        write(LDS_FILE, self.listeners())?;
        write(BOOTSTRAP_FILE, self.bootstrap(dir))
    }
}

/// The bootstrap cluster of Envoy's xDS source (Istio's name for pilot-agent's XDS proxy).
const XDS_CLUSTER: &str = "xds-grpc";

/// Envoy's `stats_matcher` as pilot-agent writes it into an Istio sidecar's bootstrap: Istio's
/// own patterns (node-agent/tests/corpus/istio-stats-matcher.json, which names its sources in
/// istio/istio) and the mesh's `proxyStatsMatcher` inclusions, as Envoy `StringMatcher`s.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IstioStatsMatcher {
    pub patterns: Vec<Value>,
}

/// The mesh config holdfast ships, relative to the workspace root.
pub const SHIPPED_MESH_CONFIG: &str = "manifests/mesh-config/istiooperator.yaml";
/// Istio's own patterns, relative to the workspace root.
pub const ISTIO_STATS_MATCHER: &str = "node-agent/tests/corpus/istio-stats-matcher.json";

impl IstioStatsMatcher {
    /// Istio's matcher (`istio`: the corpus file's JSON) with the mesh's `proxyStatsMatcher`
    /// (`mesh`: its `inclusionPrefixes` / `inclusionSuffixes` / `inclusionRegexps`, if any).
    pub fn new(
        istio: &Value,
        mesh: Option<&Value>,
        exit_on_zero_active: bool,
    ) -> IstioStatsMatcher {
        let list = |v: &Value, key: &str| -> Vec<Value> {
            v.get(key)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let mut patterns = list(istio, "patterns");
        if exit_on_zero_active {
            patterns.extend(list(istio, "exit_on_zero_active_patterns"));
        }
        if let Some(mesh) = mesh {
            for (key, make) in [
                (
                    "inclusionPrefixes",
                    (|x: Value| json!({ "prefix": x })) as fn(Value) -> Value,
                ),
                ("inclusionSuffixes", |x| json!({ "suffix": x })),
                (
                    "inclusionRegexps",
                    |x| json!({ "safe_regex": { "regex": x } }),
                ),
            ] {
                patterns.extend(list(mesh, key).into_iter().map(make));
            }
        }
        IstioStatsMatcher { patterns }
    }

    /// Istio's matcher with the mesh config holdfast ships (both read from the workspace).
    pub fn shipped(exit_on_zero_active: bool) -> std::io::Result<IstioStatsMatcher> {
        let root = crate::envoy::workspace_root();
        let read = |rel: &str| -> std::io::Result<Value> {
            let path = root.join(rel);
            let text = std::fs::read_to_string(&path)?;
            serde_saphyr::from_str(&text)
                .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))
        };
        let istio = read(ISTIO_STATS_MATCHER)?;
        let mesh = read(SHIPPED_MESH_CONFIG)?;
        Ok(IstioStatsMatcher::new(
            &istio,
            mesh.pointer("/spec/meshConfig/defaultConfig/proxyStatsMatcher"),
            exit_on_zero_active,
        ))
    }

    /// Whether Envoy keeps `stat` by a prefix or suffix pattern (regexes are not evaluated).
    pub fn keeps(&self, stat: &str) -> bool {
        self.patterns.iter().any(|p| {
            p["prefix"].as_str().is_some_and(|x| stat.starts_with(x))
                || p["suffix"].as_str().is_some_and(|x| stat.ends_with(x))
        })
    }

    fn stats_config(&self) -> Value {
        json!({ "stats_matcher": { "inclusion_list": { "patterns": self.patterns } } })
    }
}

fn socket(address: &str, port: u16) -> Value {
    json!({ "socket_address": { "address": address, "port_value": port } })
}

fn original_dst_cluster(name: &str, bind: Option<&str>) -> Value {
    let mut c = json!({
        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
    });
    if let (Some(addr), Some(obj)) = (bind, c.as_object_mut()) {
        obj.insert(
            "upstream_bind_config".into(),
            json!({ "source_address": { "address": addr, "port_value": 0 } }),
        );
    }
    c
}

fn wasm_filter(module: &Path, config: &str) -> Value {
    json!({
        "name": "envoy.filters.network.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
            "config": {
                "name": "holdfast",
                "root_id": "holdfast",
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": config,
                },
                "vm_config": {
                    "vm_id": "holdfast",
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": { "local": { "filename": module.to_string_lossy() } },
                },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(filter: bool) -> SidecarConfig {
        SidecarConfig {
            node_id: "sidecar~198.18.1.2~p.default~default.svc.cluster.local".into(),
            node_cluster: "p.default".into(),
            filter: filter.then(|| PathBuf::from("/w/holdfast_filter.wasm")),
            filter_config: String::new(),
            families: Default::default(),
            stats_matcher: None,
            health_listener: false,
            xds: None,
            mesh: crate::sim::Mesh::Istio,
            admin_ip: None,
        }
    }

    #[test]
    fn kuma_and_consul_sidecars_listen_where_theirs_do() {
        let kuma = SidecarConfig {
            mesh: crate::sim::Mesh::Kuma(crate::sim::KumaAdmin::Tcp),
            ..cfg(false)
        };
        let b = kuma.bootstrap(Path::new("/tmp/x"));
        assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 9901);
        let l = kuma.listeners();
        assert_eq!(
            l["resources"][0]["address"]["socket_address"]["port_value"],
            15001
        );
        assert_eq!(
            l["resources"][1]["address"]["socket_address"]["port_value"],
            15006
        );
        assert_eq!(l["resources"][1]["name"], "inbound:passthrough:ipv4");
        let consul = SidecarConfig {
            mesh: crate::sim::Mesh::Consul,
            ..cfg(false)
        };
        let b = consul.bootstrap(Path::new("/tmp/x"));
        assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 19000);
        let l = consul.listeners();
        assert_eq!(
            l["resources"][1]["address"]["socket_address"]["port_value"],
            20000
        );
    }

    #[test]
    fn the_shipped_mesh_config_keeps_what_holdfast_reads() {
        let m = IstioStatsMatcher::shipped(false).expect("the shipped mesh config");
        for stat in [
            "server.state",
            "listener_manager.workers_started",
            "wasmcustom.holdfast.outbound.cx_active",
            "tcp.PassthroughCluster.downstream_cx_rx_bytes_total",
            "http.admin.downstream_cx_tx_bytes_total",
            "tcp.InboundPassthroughCluster.downstream_cx_tx_bytes_buffered",
        ] {
            assert!(m.keeps(stat), "{stat} dropped by {m:?}");
        }
        assert!(!m.keeps("listener.0.0.0.0_15001.downstream_cx_active"));
        assert!(IstioStatsMatcher::shipped(true)
            .expect("shipped")
            .keeps("listener.0.0.0.0_15001.downstream_cx_active"));
        let c = SidecarConfig {
            stats_matcher: Some(m),
            ..cfg(false)
        };
        let b = c.bootstrap(Path::new("/tmp/x"));
        let patterns = &b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"];
        assert_eq!(patterns[0]["prefix"], "reporter=");
        assert!(patterns.as_array().is_some_and(|p| p
            .iter()
            .any(|x| x["safe_regex"]["regex"] == "vhost\\..*\\.route\\..*")));
    }

    #[test]
    fn ipv6_first_binds_admin_on_v6_loopback_and_listens_on_both() {
        let c = SidecarConfig {
            families: crate::sim::spec::IpFamilies::DualV6First,
            ..cfg(false)
        };
        let b = c.bootstrap(Path::new("/tmp/x"));
        assert_eq!(b["admin"]["address"]["socket_address"]["address"], "::1");
        let l = c.listeners();
        let out = &l["resources"][0];
        assert_eq!(out["address"]["socket_address"]["address"], "::");
        assert_eq!(
            out["additional_addresses"][0]["address"]["socket_address"]["address"],
            "0.0.0.0"
        );
        let v4 = cfg(false).listeners();
        assert_eq!(
            v4["resources"][0]["additional_addresses"]
                .as_array()
                .map(Vec::len),
            Some(0)
        );
    }

    #[test]
    fn listeners_are_shaped_like_istio_sidecars() {
        let l = cfg(true).listeners();
        let out = &l["resources"][0];
        assert_eq!(out["address"]["socket_address"]["port_value"], 15001);
        assert_eq!(out["traffic_direction"], "OUTBOUND");
        assert_eq!(
            out["listener_filters"][0]["name"],
            "envoy.filters.listener.original_dst"
        );
        let filters = out["filter_chains"][0]["filters"]
            .as_array()
            .expect("array");
        assert_eq!(filters[0]["name"], "envoy.filters.network.wasm");
        assert_eq!(filters[0]["typed_config"]["config"]["root_id"], "holdfast");
        assert_eq!(
            filters[0]["typed_config"]["config"]["vm_config"]["runtime"],
            "envoy.wasm.runtime.v8"
        );
        assert_eq!(filters[1]["name"], "envoy.filters.network.tcp_proxy");
        let inb = &l["resources"][1];
        assert_eq!(inb["address"]["socket_address"]["port_value"], 15006);
        assert_eq!(inb["traffic_direction"], "INBOUND");
        assert_eq!(
            inb["filter_chains"][0]["filters"][1]["typed_config"]["cluster"],
            "InboundPassthroughCluster"
        );
    }

    #[test]
    fn http_service_port_has_an_istio_shaped_outbound_listener() {
        let l = cfg(true).listeners();
        assert_eq!(l["resources"][0]["use_original_dst"], true);
        assert_eq!(l["resources"][1]["use_original_dst"], false);
        let http = &l["resources"][2];
        assert_eq!(http["name"], "0.0.0.0_8080");
        assert_eq!(http["bind_to_port"], false);
        assert_eq!(http["traffic_direction"], "OUTBOUND");
        let filters = http["filter_chains"][0]["filters"]
            .as_array()
            .expect("array");
        assert_eq!(filters[0]["name"], "envoy.filters.network.wasm");
        assert_eq!(
            filters[1]["typed_config"]["stat_prefix"],
            "outbound_0.0.0.0_8080;"
        );
    }

    #[test]
    fn filter_is_optional_and_inbound_binds_127_0_0_6() {
        let l = cfg(false).listeners();
        let filters = l["resources"][0]["filter_chains"][0]["filters"]
            .as_array()
            .expect("array");
        assert_eq!(filters.len(), 1);
        let c = cfg(false).clusters();
        assert_eq!(c["resources"][0]["type"], "ORIGINAL_DST");
        assert!(c["resources"][0].get("upstream_bind_config").is_none());
        assert_eq!(
            c["resources"][1]["upstream_bind_config"]["source_address"]["address"],
            "127.0.0.6"
        );
    }

    #[test]
    fn health_listener_and_rest_xds_are_istio_shaped() {
        let c = SidecarConfig {
            health_listener: true,
            xds: Some(XdsRest {
                socket: PathBuf::from("/w/p/xds.sock"),
                delay: std::time::Duration::from_secs(2),
            }),
            ..cfg(false)
        };
        let b = c.bootstrap(Path::new("/w/p"));
        let l = &b["static_resources"]["listeners"][0];
        assert_eq!(l["name"], "0.0.0.0_15021");
        let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(
            hcm["route_config"]["virtual_hosts"][0]["routes"][0]["match"]["prefix"],
            "/healthz/ready"
        );
        let clusters = b["static_resources"]["clusters"]
            .as_array()
            .expect("clusters");
        let agent = clusters
            .iter()
            .find(|c| c["name"] == "agent")
            .expect("agent");
        assert_eq!(
            agent["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["socket_address"]["port_value"],
            15020
        );
        let xds = clusters
            .iter()
            .find(|c| c["name"] == "xds-grpc")
            .expect("xds");
        assert_eq!(
            xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["pipe"]["path"],
            "/w/p/xds.sock"
        );
        let lds = &b["dynamic_resources"]["lds_config"];
        assert_eq!(lds["initial_fetch_timeout"], "0s");
        assert_eq!(lds["api_config_source"]["api_type"], "REST");
        assert_eq!(lds["api_config_source"]["request_timeout"], "62s");
        // Without either, the bootstrap has no static resources, as before.
        assert!(cfg(false)
            .bootstrap(Path::new("/w/p"))
            .get("static_resources")
            .is_none());
    }

    #[test]
    fn bootstrap_has_admin_and_file_xds() {
        let b = cfg(true).bootstrap(Path::new("/tmp/x"));
        assert_eq!(
            b["admin"]["address"]["socket_address"]["address"],
            "127.0.0.1"
        );
        assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 15000);
        assert_eq!(
            b["dynamic_resources"]["lds_config"]["path_config_source"]["path"],
            "/tmp/x/lds.json"
        );
    }
}
