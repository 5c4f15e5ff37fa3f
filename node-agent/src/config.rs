//! The agent's configuration: the flags' typed values, per-pod overrides read from annotations,
//! and the duration syntax both use. The `--proxy-*` flags change Istio's profile only, so their
//! defaults are Istio's and live with its other facts (`ProxyConfig`'s `Default`, in
//! `mesh/istio.rs`).
//!
//! Flags are parsed by the binary (clap); this module holds the typed result and the pure
//! validating constructors, so every rule here is unit-tested without a process environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

/// Annotation that opts a pod out of holdfast entirely (`"false"`); `"true"` is the default.
pub const ANNOTATION_ENABLED: &str = "holdfast.io/enabled";
/// Annotation that overrides the hold deadline for one pod (e.g. `"30s"`, `"2m"`).
pub const ANNOTATION_HOLD_TIMEOUT: &str = "holdfast.io/hold-timeout";

/// holdfast's own annotations, which [`crate::pod::PodView::from_pod`] reads.
pub const READ_ANNOTATIONS: [&str; 2] = [ANNOTATION_ENABLED, ANNOTATION_HOLD_TIMEOUT];

/// Go's `strconv.ParseBool`, which Istio's `env.Register(..., false, ...)` uses for
/// `ISTIO_META_DNS_CAPTURE` and `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` (istio/istio pkg/env): anything
/// else is an error, and Istio then uses the default (false).
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The effective configuration, logged at start and served on the status API.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The node this agent serves; only pods scheduled here are tracked.
    pub node_name: String,
    /// Where Pod objects come from.
    pub source: SourceConfig,
    /// The full read-only status API (`/status`, `/config`, `/metrics`, `/healthz`, `/readyz`):
    /// a loopback address only (see [`check_status_listen`]).
    pub status_listen: SocketAddr,
    /// The kubelet's probes (`/healthz`, `/readyz`) on a listener of their own, which the status
    /// API's and the metrics' clients cannot exhaust; `None`: only on `status_listen`.
    pub health_listen: Option<SocketAddr>,
    /// Prometheus' `/metrics` for clients outside the agent's pod; `None`: only on
    /// `status_listen`.
    pub metrics_listen: Option<SocketAddr>,
    /// Root of the proc filesystem (injectable for tests).
    pub proc_root: PathBuf,
    /// How the sidecar looks in every meshed pod.
    pub proxy: ProxyConfig,
    /// Startup hold settings.
    pub hold: HoldSettings,
    /// Drain and Job-completion settings.
    pub drain: DrainSettings,
}

/// Where Pod objects come from.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceConfig {
    /// A directory of Pod JSON/YAML files, one per pod (the simulated node, static-pod style).
    PodsDir(PathBuf),
    /// The Kubernetes API server, watching pods with `spec.nodeName=<node>`.
    Kube,
}

/// What the `--proxy-*` flags set: the values of Istio's profile an operator may change (Kuma's
/// and Consul's come from their injectors' pod specs, read per pod), and the sandboxed runtime
/// classes. Its `Default` (Istio's injection template's values) is in `mesh/istio.rs`.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyConfig {
    /// Name of the proxy container in the pod spec.
    pub container: String,
    /// uid the proxy runs as; its own connections are never held.
    pub uid: u32,
    /// Envoy admin address inside the pod's network namespace.
    pub admin: SocketAddr,
    /// Envoy's outbound capture port (iptables REDIRECT target for the app's outbound traffic).
    pub outbound_port: u16,
    /// Envoy's inbound capture port.
    pub inbound_port: u16,
    /// `runtimeClassName`s of sandboxed runtimes, whose pods are left alone (a trailing `*`
    /// matches any rest): see [`DEFAULT_SANDBOXED_RUNTIME_CLASSES`].
    pub sandboxed_runtime_classes: Vec<String>,
}

/// The RuntimeClass names the sandboxed runtimes are installed under: GKE Sandbox's `gvisor`
/// (its docs: `runtimeClassName: gvisor`), gVisor's own docs' `gvisor` (handler `runsc`, which
/// some installs name the class after), and Kata's `kata*`: kata-deploy's `kata`, `kata-qemu`,
/// `kata-clh`, `kata-fc`, …, AKS Pod Sandboxing's `kata-vm-isolation` (formerly
/// `kata-mshv-vm-isolation`). A sandboxed pod's processes run under another kernel (Kata's VM)
/// or behind gVisor's Sentry, not in the node's /proc view and network namespace as the agent
/// expects, so a hold would only run to its deadline.
pub const DEFAULT_SANDBOXED_RUNTIME_CLASSES: [&str; 3] = ["gvisor", "runsc", "kata*"];

/// Whether `class` is one of `patterns` (exact, or a prefix for an entry ending in `*`).
pub fn runtime_class_matches(patterns: &[String], class: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => class.starts_with(prefix),
        None => p == class,
    })
}

/// Startup hold settings.
#[derive(Debug, Clone, Serialize)]
pub struct HoldSettings {
    /// Release the hold after this long even if the proxy never becomes ready (fail open).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The longest hold a pod's `holdfast.io/hold-timeout` may ask for: a larger value is
    /// clamped to this (with a problem on the pod's row), so no pod can keep the agent checking
    /// its proxy for a day.
    #[serde(with = "humantime_serde")]
    pub max_timeout: Duration,
    /// NFQUEUE number used in every pod's network namespace (queues are per namespace).
    pub queue_num: u16,
    /// How often a holding pod's proxy readiness is checked.
    #[serde(with = "humantime_serde")]
    pub ready_poll: Duration,
    /// Wait for the holdfast filter's `loaded` stat too, not only for Envoy's `/ready`.
    pub require_filter: bool,
}

impl Default for HoldSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            max_timeout: DEFAULT_MAX_HOLD_TIMEOUT,
            queue_num: 15015,
            ready_poll: Duration::from_millis(5),
            require_filter: false,
        }
    }
}

/// The default ceiling on a pod's `holdfast.io/hold-timeout` (`--max-hold-timeout`): ten minutes
/// is five times the default deadline and longer than any Envoy that will ever get ready takes
/// (pilot-agent's own startup wait, `pilot-agent wait`, gives up after 60 s); a pod asking for
/// more is clamped.
pub const DEFAULT_MAX_HOLD_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a `--status-listen` address is refused: `/status` and `/config` (pod names, errors, the
/// configuration) are for clients inside the agent's pod only, which a loopback listener
/// guarantees whatever the client's source address (Istio's inbound passthrough connects from
/// 127.0.0.6, a loopback address too, but to the pod IP, never to 127.0.0.1).
pub fn check_status_listen(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(format!(
            "--status-listen {addr} is not a loopback address: /status and /config answer only \
             inside the agent's pod (127.0.0.1:15300; reached with `kubectl port-forward`); serve \
             the kubelet's probes with --health-listen [::]:15301 and Prometheus with \
             --metrics-listen [::]:15302"
        ))
    }
}

/// Durations serialize as the same strings the flags and annotations accept.
mod humantime_serde {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }
}

/// A duration that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: {reason} (expected e.g. \"500ms\", \"30s\", \"2m\", \"1m30s\")"
)]
pub struct DurationError {
    pub input: String,
    pub reason: &'static str,
}

/// Longest duration accepted anywhere (a day): larger values are almost surely typos.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Parses `500ms`, `30s`, `2m`, `1h`, `1m30s` (Go/Kubernetes style, no fractions, no sign).
/// A bare integer is seconds, as `terminationGracePeriodSeconds` is.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = s.parse().map_err(|_| err("number too large"))?;
        return check_max(Duration::from_secs(secs)).ok_or_else(|| err("longer than 24h"));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit (use ms, s, m or h)")),
        };
        rest = &rest[unit_len..];
        let part = unit
            .checked_mul(u32::try_from(n).map_err(|_| err("number too large"))?)
            .ok_or_else(|| err("number too large"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| err("number too large"))?;
    }
    check_max(total).ok_or_else(|| err("longer than 24h"))
}

fn check_max(d: Duration) -> Option<Duration> {
    (d <= MAX_DURATION).then_some(d)
}

/// Formats a duration in the syntax [`parse_duration`] accepts.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) || ms == 0 {
        format!("{ms}ms")
    } else {
        format!("{}s", ms / 1000)
    }
}

/// Per-pod settings after annotations are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOverrides {
    /// `false` when the pod opted out with `holdfast.io/enabled: "false"`.
    pub enabled: bool,
    /// The hold deadline for this pod.
    pub hold_timeout: Duration,
    /// Annotations that were present but invalid: reported (logged, shown in status), not fatal.
    pub problems: Vec<String>,
}

impl Default for PodOverrides {
    /// No annotation: enabled, the default hold deadline, no problems.
    fn default() -> Self {
        Self {
            enabled: true,
            hold_timeout: HoldSettings::default().timeout,
            problems: Vec::new(),
        }
    }
}

impl PodOverrides {
    /// Applies a pod's annotations over the node defaults. Invalid values fall back to the default
    /// and are listed in `problems` with the annotation, its value and the fix.
    pub fn from_annotations<'a>(
        annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
        defaults: &HoldSettings,
    ) -> Self {
        let mut out = Self {
            enabled: true,
            hold_timeout: defaults.timeout,
            problems: Vec::new(),
        };
        for (key, value) in annotations {
            match key {
                ANNOTATION_ENABLED => match value.trim() {
                    "true" => out.enabled = true,
                    "false" => out.enabled = false,
                    other => out.problems.push(format!(
                        "annotation {ANNOTATION_ENABLED}={other:?} is not \"true\" or \"false\"; \
                         holdfast stays enabled for this pod"
                    )),
                },
                ANNOTATION_HOLD_TIMEOUT => match parse_duration(value) {
                    Ok(d) if d.is_zero() => out.problems.push(format!(
                        "annotation {ANNOTATION_HOLD_TIMEOUT}={value:?} is zero; use \
                         {ANNOTATION_ENABLED}: \"false\" to disable the hold; using {}",
                        format_duration(defaults.timeout)
                    )),
                    Ok(d) if d > defaults.max_timeout => {
                        out.hold_timeout = defaults.max_timeout;
                        out.problems.push(format!(
                            "annotation {ANNOTATION_HOLD_TIMEOUT}={value:?} is above the node's \
                             ceiling (--max-hold-timeout); using {}",
                            format_duration(defaults.max_timeout)
                        ));
                    }
                    Ok(d) => out.hold_timeout = d,
                    Err(e) => out.problems.push(format!(
                        "annotation {ANNOTATION_HOLD_TIMEOUT}: {e}; using {}",
                        format_duration(defaults.timeout)
                    )),
                },
                _ => {}
            }
        }
        out
    }
}

/// How the drain and the Job quit behave. Defaults suit a node with hundreds of pods.
#[derive(Debug, Clone, Serialize)]
pub struct DrainSettings {
    /// No byte moved for this long = remaining connections are idle keep-alives.
    #[serde(serialize_with = "ser_duration")]
    pub idle_window: Duration,
    /// How often the app's processes are re-scanned for new ones at first, doubling with each
    /// rescan up to 1 s (`decide::rescan_every`; exits are notified at once, and each rescans).
    #[serde(serialize_with = "ser_duration")]
    pub rescan_every: Duration,
    /// How often the counts (the filter's, Envoy's bytes) are sampled while the app runs (for the
    /// idle history).
    #[serde(serialize_with = "ser_duration")]
    pub stats_every: Duration,
    /// How often the counts are sampled once the app is gone, until nothing is in flight.
    #[serde(serialize_with = "ser_duration")]
    pub settle_poll: Duration,
    /// Timeout of each admin request.
    #[serde(serialize_with = "ser_duration")]
    pub admin_timeout: Duration,
    /// Attempts per admin `POST` (and failed `/stats` samples tolerated once the app is gone).
    pub admin_attempts: u32,
    /// Pause between attempts.
    #[serde(serialize_with = "ser_duration")]
    pub retry_backoff: Duration,
    /// Consecutive refused connections to the admin API that mean Envoy has exited.
    pub refusals_for_gone: u32,
    /// After `/quitquitquit`, how long to watch for the admin API to go away (for the report).
    #[serde(serialize_with = "ser_duration")]
    pub quit_confirm: Duration,
    /// Job: longest wait for in-flight traffic to settle after the app finished.
    #[serde(serialize_with = "ser_duration")]
    pub job_in_flight_wait: Duration,
    /// Job: how often a running Job's processes are re-scanned (exits are notified at once).
    #[serde(serialize_with = "ser_duration")]
    pub job_rescan_every: Duration,
    /// The filter's stats prefix in `/stats`.
    pub stat_prefix: String,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings {
            idle_window: Duration::from_millis(100),
            rescan_every: Duration::from_millis(100),
            stats_every: Duration::from_millis(100),
            settle_poll: Duration::from_millis(5),
            admin_timeout: Duration::from_millis(500),
            admin_attempts: 3,
            retry_backoff: Duration::from_millis(20),
            refusals_for_gone: 2,
            quit_confirm: Duration::from_secs(1),
            job_in_flight_wait: Duration::from_secs(5),
            job_rescan_every: Duration::from_secs(1),
            stat_prefix: crate::api::DEFAULT_STAT_PREFIX.to_string(),
        }
    }
}

/// The drain settings an operator may set (`holdfast agent --filter-stat-prefix`,
/// `--drain-idle-window`, `--job-in-flight-wait`, `--admin-timeout`); the rest keep their
/// defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainFlags {
    /// The filter's `stat_prefix` as set in its plugin configuration (`holdfast`): the agent
    /// reads `wasmcustom.<prefix>.*`.
    pub filter_stat_prefix: String,
    pub idle_window: Duration,
    pub job_in_flight_wait: Duration,
    pub admin_timeout: Duration,
}

impl Default for DrainFlags {
    fn default() -> Self {
        let d = DrainSettings::default();
        DrainFlags {
            filter_stat_prefix: FILTER_STAT_PREFIX.to_string(),
            idle_window: d.idle_window,
            job_in_flight_wait: d.job_in_flight_wait,
            admin_timeout: d.admin_timeout,
        }
    }
}

/// The filter's default `stat_prefix` (wasm-filter/src/config.rs); Envoy publishes a wasm
/// filter's stats under `wasmcustom.`.
pub const FILTER_STAT_PREFIX: &str = "holdfast";

/// A drain setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value:?}: {reason}")]
pub struct DrainFlagError {
    pub flag: &'static str,
    pub value: String,
    pub reason: String,
}

impl DrainSettings {
    /// The drain settings with the operator's flags applied, each checked: the prefix by the
    /// filter's own rule (1–64 of `[a-z0-9_]`, wasm-filter/src/config.rs
    /// `validate_stat_prefix`: a prefix the filter refuses could never match), the idle window
    /// 10 ms–10 s (shorter calls a busy connection idle between two writes; longer holds every
    /// drain), the Job's wait at most 5 min, the admin timeout 50 ms–10 s.
    pub fn from_flags(flags: &DrainFlags) -> Result<DrainSettings, DrainFlagError> {
        let err = |flag, value: String, reason: &str| DrainFlagError {
            flag,
            value,
            reason: reason.to_string(),
        };
        let p = &flags.filter_stat_prefix;
        if p.is_empty()
            || p.len() > 64
            || !p
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(err(
                "--filter-stat-prefix",
                p.clone(),
                "must be the filter's stat_prefix as in its plugin configuration: 1 to 64 of \
                 lowercase letters, digits and '_' (the filter refuses anything else), without \
                 the `wasmcustom.` Envoy adds",
            ));
        }
        let within = |flag, d: Duration, lo: Duration, hi: Duration| {
            if d < lo || d > hi {
                Err(err(
                    flag,
                    format_duration(d),
                    &format!(
                        "must be between {} and {}",
                        format_duration(lo),
                        format_duration(hi)
                    ),
                ))
            } else {
                Ok(d)
            }
        };
        let ms = Duration::from_millis;
        Ok(DrainSettings {
            idle_window: within("--drain-idle-window", flags.idle_window, ms(10), ms(10_000))?,
            job_in_flight_wait: within(
                "--job-in-flight-wait",
                flags.job_in_flight_wait,
                Duration::ZERO,
                Duration::from_secs(300),
            )?,
            admin_timeout: within("--admin-timeout", flags.admin_timeout, ms(50), ms(10_000))?,
            stat_prefix: format!("wasmcustom.{p}"),
            ..DrainSettings::default()
        })
    }
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration(" 45 "), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_name_the_problem() {
        for bad in [
            "",
            "s",
            "10",
            "-5s",
            "1.5s",
            "10x",
            "5 s",
            "99999999999999999999s",
            "25h",
            "1d",
        ] {
            if bad == "10" {
                continue; // a bare integer is seconds
            }
            let e = parse_duration(bad).expect_err(bad);
            assert_eq!(e.input, bad);
            assert!(e.to_string().contains("expected e.g."), "{e}");
        }
    }

    #[test]
    fn duration_round_trips_through_format() {
        for d in [
            Duration::from_millis(5),
            Duration::from_secs(120),
            Duration::from_millis(1500),
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn annotations_override_and_report() {
        let defaults = HoldSettings::default();
        let o = PodOverrides::from_annotations(
            [
                (ANNOTATION_ENABLED, "false"),
                (ANNOTATION_HOLD_TIMEOUT, "30s"),
                ("other", "x"),
            ],
            &defaults,
        );
        assert!(!o.enabled);
        assert_eq!(o.hold_timeout, Duration::from_secs(30));
        assert!(o.problems.is_empty());

        let o = PodOverrides::from_annotations(
            [
                (ANNOTATION_ENABLED, "nope"),
                (ANNOTATION_HOLD_TIMEOUT, "soon"),
            ],
            &defaults,
        );
        assert!(o.enabled, "an invalid value keeps the safe default");
        assert_eq!(o.hold_timeout, defaults.timeout);
        assert_eq!(o.problems.len(), 2);
        assert!(o.problems[0].contains(ANNOTATION_ENABLED));
        assert!(o.problems[1].contains("\"soon\""));

        let o = PodOverrides::from_annotations([(ANNOTATION_HOLD_TIMEOUT, "0s")], &defaults);
        assert_eq!(o.hold_timeout, defaults.timeout);
        assert_eq!(o.problems.len(), 1);

        // A pod cannot keep the agent busy for a day: clamped to the node's ceiling, and said.
        let o = PodOverrides::from_annotations([(ANNOTATION_HOLD_TIMEOUT, "24h")], &defaults);
        assert_eq!(o.hold_timeout, DEFAULT_MAX_HOLD_TIMEOUT);
        assert_eq!(o.problems.len(), 1);
        assert!(o.problems[0].contains("ceiling"), "{:?}", o.problems);
        let o = PodOverrides::from_annotations([(ANNOTATION_HOLD_TIMEOUT, "10m")], &defaults);
        assert_eq!(o.hold_timeout, DEFAULT_MAX_HOLD_TIMEOUT);
        assert!(o.problems.is_empty());
    }

    #[test]
    fn status_listen_must_be_loopback() {
        assert!(check_status_listen("127.0.0.1:15300".parse().unwrap()).is_ok());
        assert!(check_status_listen("[::1]:15300".parse().unwrap()).is_ok());
        for public in ["0.0.0.0:15300", "10.0.0.7:15300", "[::]:15300"] {
            let e = check_status_listen(public.parse().unwrap()).unwrap_err();
            assert!(e.contains("--health-listen") && e.contains(public), "{e}");
        }
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "on", " true", "tRuE"] {
            assert_eq!(parse_go_bool(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn drain_flags_are_checked_and_applied() {
        let ok = DrainSettings::from_flags(&DrainFlags::default()).expect("the defaults");
        assert_eq!(ok.stat_prefix, crate::api::DEFAULT_STAT_PREFIX);
        assert_eq!(ok.idle_window, DrainSettings::default().idle_window);
        let custom = DrainSettings::from_flags(&DrainFlags {
            filter_stat_prefix: "mesh_hf2".into(),
            idle_window: Duration::from_millis(250),
            job_in_flight_wait: Duration::ZERO,
            admin_timeout: Duration::from_secs(2),
        })
        .expect("in range");
        assert_eq!(custom.stat_prefix, "wasmcustom.mesh_hf2");
        assert_eq!(custom.idle_window, Duration::from_millis(250));
        assert_eq!(custom.admin_timeout, Duration::from_secs(2));
        for (flags, flag) in [
            (
                DrainFlags {
                    filter_stat_prefix: "".into(),
                    ..Default::default()
                },
                "--filter-stat-prefix",
            ),
            (
                DrainFlags {
                    filter_stat_prefix: "wasmcustom.holdfast".into(),
                    ..Default::default()
                },
                "--filter-stat-prefix",
            ),
            (
                DrainFlags {
                    filter_stat_prefix: "Holdfast".into(),
                    ..Default::default()
                },
                "--filter-stat-prefix",
            ),
            (
                DrainFlags {
                    filter_stat_prefix: "a".repeat(65),
                    ..Default::default()
                },
                "--filter-stat-prefix",
            ),
            (
                DrainFlags {
                    idle_window: Duration::from_millis(5),
                    ..Default::default()
                },
                "--drain-idle-window",
            ),
            (
                DrainFlags {
                    idle_window: Duration::from_secs(11),
                    ..Default::default()
                },
                "--drain-idle-window",
            ),
            (
                DrainFlags {
                    job_in_flight_wait: Duration::from_secs(301),
                    ..Default::default()
                },
                "--job-in-flight-wait",
            ),
            (
                DrainFlags {
                    admin_timeout: Duration::from_millis(10),
                    ..Default::default()
                },
                "--admin-timeout",
            ),
        ] {
            let e = DrainSettings::from_flags(&flags).expect_err("out of range");
            assert_eq!(e.flag, flag, "{e}");
            assert!(
                e.to_string().starts_with(flag),
                "the message names the flag: {e}"
            );
        }
    }
}
