//! The istio-init stand-in: Istio's default REDIRECT-mode nat rules (what
//! `istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d 15090,15021,15020`
//! installs), as argument vectors for `iptables -t nat`, and the code that applies them inside the
//! pod's network namespace (run by `sim-app istio-init`, the pod's init container).
//!
//! With [`InitOptions`] it also writes what istio-iptables adds for IPv6 pods (the same rules in
//! `ip6tables` with `::1/128` and `::6/128`) and for DNS capture (`ISTIO_META_DNS_CAPTURE`:
//! the `ISTIO_OUTPUT_DNS` chains in nat and raw), following
//! tools/istio-iptables/pkg/capture/run.go in istio/istio (`Run`, `SetupDNSRedir`,
//! `addDNSConntrackZones`) and its goldens `testdata/dns-uid-gid.golden` and
//! `testdata/ipv6-inbound-ports.golden`. Those go in through `iptables-restore --noflush`, one
//! transaction per family, as istio-iptables itself applies its rules.

use std::io::Write as _;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Proxy uid and gid (Istio's default).
pub const PROXY_UID: u32 = 1337;
/// Envoy admin port.
pub const ADMIN_PORT: u16 = 15000;
/// pilot-agent's DNS proxy port (`DefaultDNSProxyAddr` = `localhost:15053`).
pub const DNS_PORT: u16 = 15053;
/// pilot-agent's status port (`/healthz/ready`, `/drain`, `/quitquitquit`).
pub const STATUS_PORT: u16 = 15020;
/// Envoy's health listener (bootstrap `0.0.0.0_15021`, routing `/healthz/ready` to
/// pilot-agent's status port): where the injected startup and readiness probes go.
pub const HEALTH_PORT: u16 = 15021;
/// Outbound capture port.
pub const OUTBOUND_PORT: u16 = 15001;
/// Inbound capture port.
pub const INBOUND_PORT: u16 = 15006;

/// The chains istio-iptables creates in the nat table, in creation order.
pub const CHAINS: [&str; 4] = [
    "ISTIO_INBOUND",
    "ISTIO_REDIRECT",
    "ISTIO_IN_REDIRECT",
    "ISTIO_OUTPUT",
];

/// The rules, exactly as DESIGN.md lists them (`iptables-save` form, nat table).
pub const RULES: [&str; 18] = [
    "-A PREROUTING -p tcp -j ISTIO_INBOUND",
    "-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN",
    "-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN",
    "-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN",
    "-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN",
    "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
    "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006",
    "-A OUTPUT -j ISTIO_OUTPUT",
    "-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN",
    "-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT",
    "-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN",
    "-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN",
    "-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT",
    "-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN",
    "-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN",
    "-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN",
    "-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
    "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001",
];

/// Every `iptables` invocation, in order: create the chains, then append the rules. The rule
/// texts contain no quoting, so splitting on whitespace gives exactly iptables' argv.
pub fn iptables_invocations() -> Vec<Vec<String>> {
    let mut out = Vec::with_capacity(CHAINS.len() + RULES.len());
    for chain in CHAINS {
        out.push(vec!["-t".into(), "nat".into(), "-N".into(), chain.into()]);
    }
    for rule in RULES {
        let mut argv = vec!["-t".to_string(), "nat".to_string()];
        argv.extend(rule.split_whitespace().map(str::to_string));
        out.push(argv);
    }
    out
}

/// What the init step installs beyond the default IPv4 TCP capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitOptions {
    /// Also write the IPv6 rules (istio-iptables does when the pod's first address is IPv6, or
    /// with `ISTIO_DUAL_STACK`).
    pub ipv6: bool,
    /// DNS capture (`ISTIO_META_DNS_CAPTURE`): redirect DNS to these servers (the pod's
    /// resolv.conf nameservers, as istio-iptables reads them) to 15053. Empty: no DNS capture.
    pub dns_servers: Vec<IpAddr>,
}

/// The nameservers of a resolv.conf text (`nameserver <ip>` lines; others ignored).
pub fn nameservers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next()?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The nat and raw rules for one family (`v6`), as an `iptables-restore --noflush` input.
/// `dns` turns on DNS capture (its port-53 exceptions apply to both families); `servers` are
/// the DNS servers of this family.
pub fn restore_script(v6: bool, dns: bool, servers: &[IpAddr]) -> String {
    let (lo, passthrough, host) = if v6 {
        ("::1/128", "::6/128", "/128")
    } else {
        ("127.0.0.1/32", "127.0.0.6/32", "/32")
    };
    let uid = PROXY_UID;
    let mut nat = vec![
        "-A PREROUTING -p tcp -j ISTIO_INBOUND".to_string(),
        "-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN".into(),
        "-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN".into(),
        "-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN".into(),
        "-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN".into(),
        "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT".into(),
        format!("-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports {INBOUND_PORT}"),
        "-A OUTPUT -j ISTIO_OUTPUT".into(),
        format!("-A ISTIO_OUTPUT -o lo -s {passthrough} -j RETURN"),
    ];
    // run.go: with redirectDNS, port 53 is left out of the proxy's hairpin and of the app's
    // loopback RETURN ("Users may have a DNS server that is on localhost").
    for owner in ["--uid-owner", "--gid-owner"] {
        let hairpin_ports = if dns && owner == "--uid-owner" {
            "-m multiport ! --dports 53,15008"
        } else {
            "! --dport 15008"
        };
        nat.push(format!("-A ISTIO_OUTPUT -o lo ! -d {lo} -p tcp {hairpin_ports} -m owner {owner} {uid} -j ISTIO_IN_REDIRECT"));
        if dns {
            nat.push(format!(
                "-A ISTIO_OUTPUT -o lo -p tcp ! --dport 53 -m owner ! {owner} {uid} -j RETURN"
            ));
        } else {
            nat.push(format!(
                "-A ISTIO_OUTPUT -o lo -m owner ! {owner} {uid} -j RETURN"
            ));
        }
        nat.push(format!("-A ISTIO_OUTPUT -m owner {owner} {uid} -j RETURN"));
    }
    let mut raw = Vec::new();
    let mut chains = vec![
        "ISTIO_INBOUND",
        "ISTIO_REDIRECT",
        "ISTIO_IN_REDIRECT",
        "ISTIO_OUTPUT",
    ];
    let mut raw_chains = Vec::new();
    if dns {
        // SetupDNSRedir: the nat jump only when this family has servers.
        if !servers.is_empty() {
            chains.push("ISTIO_OUTPUT_DNS");
            nat.push("-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS".into());
            for s in servers {
                nat.push(format!(
                    "-A ISTIO_OUTPUT_DNS -p tcp --dport 53 -d {s}{host} -j REDIRECT --to-ports {DNS_PORT}"
                ));
            }
            for s in servers {
                nat.push(format!(
                    "-A ISTIO_OUTPUT_DNS -p udp --dport 53 -d {s}{host} -j REDIRECT --to-ports {DNS_PORT}"
                ));
            }
        }
        // addDNSConntrackZones: pilot-agent's upstream queries in zone 1, its answers to the
        // app in zone 2; the app's queries to the servers in zone 2, their answers in zone 1.
        raw_chains.push("ISTIO_OUTPUT_DNS");
        raw.push("-A OUTPUT -j ISTIO_OUTPUT_DNS".to_string());
        for owner in ["--uid-owner", "--gid-owner"] {
            raw.push(format!(
                "-A ISTIO_OUTPUT_DNS -p udp --dport 53 -m owner {owner} {uid} -j CT --zone 1"
            ));
            raw.push(format!(
                "-A ISTIO_OUTPUT_DNS -p udp --sport {DNS_PORT} -m owner {owner} {uid} -j CT --zone 2"
            ));
        }
        if !servers.is_empty() {
            raw_chains.push("ISTIO_INBOUND");
            raw.push("-A PREROUTING -j ISTIO_INBOUND".into());
        }
        for s in servers {
            raw.push(format!(
                "-A ISTIO_OUTPUT_DNS -p udp --dport 53 -d {s}{host} -j CT --zone 2"
            ));
            raw.push(format!(
                "-A ISTIO_INBOUND -p udp --sport 53 -s {s}{host} -j CT --zone 1"
            ));
        }
    }
    nat.push(format!("-A ISTIO_OUTPUT -d {lo} -j RETURN"));
    nat.push("-A ISTIO_OUTPUT -j ISTIO_REDIRECT".into());
    nat.push(format!(
        "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}"
    ));
    let mut script = String::from("*nat\n");
    for c in chains {
        script.push_str(&format!(":{c} - [0:0]\n"));
    }
    for r in nat {
        script.push_str(&r);
        script.push('\n');
    }
    script.push_str("COMMIT\n");
    if !raw.is_empty() {
        script.push_str("*raw\n");
        for c in raw_chains {
            script.push_str(&format!(":{c} - [0:0]\n"));
        }
        for r in raw {
            script.push_str(&r);
            script.push('\n');
        }
        script.push_str("COMMIT\n");
    }
    script
}

/// Why the init step failed.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("cannot run iptables {args:?}: {source} (is iptables installed? `just setup`)")]
    Spawn {
        args: Vec<String>,
        source: std::io::Error,
    },
    #[error("iptables {args:?} failed with {status}: {stderr}")]
    Failed {
        args: Vec<String>,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// Installs the rules in the current network namespace (the init container runs inside the
/// pod's), then sleeps until at least `min_duration` has passed since `started`: real istio-init
/// takes 100+ ms, and that window is what a node agent uses to act before the app starts.
pub fn run(iptables: &str, min_duration: Duration, started: Instant) -> Result<(), InitError> {
    run_with(
        iptables,
        "ip6tables",
        &InitOptions::default(),
        min_duration,
        started,
    )
}

/// [`run`] with IPv6 and DNS capture as `opts` asks: the default shape through `iptables` calls
/// (as before), anything more through one `iptables-restore`/`ip6tables-restore` per family.
pub fn run_with(
    iptables: &str,
    ip6tables: &str,
    opts: &InitOptions,
    min_duration: Duration,
    started: Instant,
) -> Result<(), InitError> {
    // A second run in the same netns (an in-place restart of every container, KEP-5532, runs
    // the init containers again): Istio's rules are there already. Recent istio-iptables
    // compares what is there with what it would write (tools/istio-iptables/pkg/capture/run.go,
    // its `--reconcile` flag) and, when they differ, removes its own ISTIO_* chains and the jumps
    // to them before it applies its rules again; identical rules are left as they are. The sim
    // takes the remove-and-apply path every time: the harsher one for a hold already in the
    // netns (the hold's chains are in the filter table, which Istio's cleanup does not touch).
    remove_previous_run(iptables);
    if opts.ipv6 {
        remove_previous_run(ip6tables);
    }
    if opts == &InitOptions::default() {
        install_by_invocations(iptables)?;
    } else {
        let dns = !opts.dns_servers.is_empty();
        let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) =
            opts.dns_servers.iter().partition(|a| a.is_ipv4());
        restore(
            &format!("{iptables}-restore"),
            &restore_script(false, dns, &v4),
        )?;
        if opts.ipv6 {
            restore(
                &format!("{ip6tables}-restore"),
                &restore_script(true, dns, &v6),
            )?;
        }
    }
    if let Some(rest) = min_duration.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    Ok(())
}

/// Removes what a previous run of this step left in the nat table (nothing on a first run): the
/// jumps from the built-in chains, then Istio's chains, flushed and deleted. Errors (a rule or
/// chain not there) are expected and ignored.
fn remove_previous_run(iptables: &str) {
    let exists = Command::new(iptables)
        .args(["-t", "nat", "-S", "ISTIO_OUTPUT"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !exists {
        return;
    }
    let run = |args: &[&str]| {
        let _ = Command::new(iptables)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    };
    run(&[
        "-t",
        "nat",
        "-D",
        "PREROUTING",
        "-p",
        "tcp",
        "-j",
        "ISTIO_INBOUND",
    ]);
    run(&["-t", "nat", "-D", "OUTPUT", "-j", "ISTIO_OUTPUT"]);
    for chain in CHAINS.iter().chain(["ISTIO_OUTPUT_DNS"].iter()) {
        run(&["-t", "nat", "-F", chain]);
    }
    for chain in CHAINS.iter().chain(["ISTIO_OUTPUT_DNS"].iter()) {
        run(&["-t", "nat", "-X", chain]);
    }
}

fn restore(program: &str, script: &str) -> Result<(), InitError> {
    let args = vec!["--noflush".to_string()];
    let spawn_err = |source| InitError::Spawn {
        args: vec![program.to_string()],
        source,
    };
    let mut child = Command::new(program)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(InitError::Failed {
            args: vec![program.to_string(), script.to_string()],
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

fn install_by_invocations(iptables: &str) -> Result<(), InitError> {
    for args in iptables_invocations() {
        let out = Command::new(iptables)
            .args(&args)
            .output()
            .map_err(|source| InitError::Spawn {
                args: args.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(InitError::Failed {
                args,
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocations_create_chains_before_rules() {
        let inv = iptables_invocations();
        assert_eq!(inv.len(), 22);
        assert_eq!(inv[0], ["-t", "nat", "-N", "ISTIO_INBOUND"]);
        assert_eq!(
            inv[4],
            [
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-p",
                "tcp",
                "-j",
                "ISTIO_INBOUND"
            ]
        );
        let last = inv.last().expect("non-empty");
        assert_eq!(last[last.len() - 1], "15001");
        // uid/gid 1337 are excluded from the outbound redirect.
        assert!(RULES.contains(&"-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN"));
        assert!(RULES.contains(&"-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN"));
    }

    #[test]
    fn restore_script_without_dns_is_the_default_rules() {
        let script = restore_script(false, false, &[]);
        let rules: Vec<&str> = script.lines().filter(|l| l.starts_with("-A")).collect();
        assert_eq!(rules, RULES);
        assert!(!script.contains("*raw"));
        let v6 = restore_script(true, false, &[]);
        assert!(v6.contains("-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN"));
        assert!(v6.contains("-A ISTIO_OUTPUT -d ::1/128 -j RETURN"));
        assert!(!v6.contains("127.0.0."));
    }

    #[test]
    fn dns_capture_rules_follow_istio_iptables() {
        let server: IpAddr = "198.18.0.1".parse().expect("ip");
        let script = restore_script(false, true, &[server]);
        for rule in [
            // The lines of istio's dns-uid-gid.golden, with uid/gid 1337 and our server.
            "-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp -m multiport ! --dports 53,15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT",
            "-A ISTIO_OUTPUT -o lo -p tcp ! --dport 53 -m owner ! --uid-owner 1337 -j RETURN",
            "-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT",
            "-A ISTIO_OUTPUT -o lo -p tcp ! --dport 53 -m owner ! --gid-owner 1337 -j RETURN",
            "-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS",
            "-A ISTIO_OUTPUT_DNS -p tcp --dport 53 -d 198.18.0.1/32 -j REDIRECT --to-ports 15053",
            "-A ISTIO_OUTPUT_DNS -p udp --dport 53 -d 198.18.0.1/32 -j REDIRECT --to-ports 15053",
            "-A ISTIO_OUTPUT_DNS -p udp --sport 15053 -m owner --uid-owner 1337 -j CT --zone 2",
            "-A ISTIO_INBOUND -p udp --sport 53 -s 198.18.0.1/32 -j CT --zone 1",
        ] {
            assert!(script.lines().any(|l| l == rule), "missing {rule}:\n{script}");
        }
        // The DNS jump comes after the proxy's RETURNs and before the loopback RETURN.
        let pos = |r: &str| script.lines().position(|l| l == r).expect(r);
        assert!(
            pos("-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN")
                < pos("-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS")
        );
        assert!(
            pos("-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS")
                < pos("-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN")
        );
        // No IPv6 server: no nat jump in the IPv6 table, but the conntrack zones for the proxy.
        let v6 = restore_script(true, true, &[]);
        assert!(!v6.contains("-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS"));
        assert!(v6.contains(
            "-A ISTIO_OUTPUT_DNS -p udp --dport 53 -m owner --uid-owner 1337 -j CT --zone 1"
        ));
    }

    #[test]
    fn nameservers_from_resolv_conf() {
        let text = "search a b\nnameserver 198.18.0.1\nnameserver fd00::1\nnameserver bogus\noptions ndots:5\n";
        let servers = nameservers(text);
        assert_eq!(servers.len(), 2);
        assert!(servers[1].is_ipv6());
    }
}
