//! The istio-init stand-in: Istio's default REDIRECT-mode nat rules (what
//! `istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d 15090,15021,15020`
//! installs), as argument vectors for `iptables -t nat`, and the code that applies them inside the
//! pod's network namespace (run by `sim-app istio-init`, the pod's init container).

use std::process::Command;
use std::time::{Duration, Instant};

/// Proxy uid and gid (Istio's default).
pub const PROXY_UID: u32 = 1337;
/// Envoy admin port.
pub const ADMIN_PORT: u16 = 15000;
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
    if let Some(rest) = min_duration.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
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
}
