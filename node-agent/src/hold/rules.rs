//! The iptables rules of the startup hold, installed in a pod's network namespace.
//!
//! Two dedicated chains in the `filter` table, each jumped to from the top of its built-in chain:
//!
//! - `HOLDFAST_OUT` (from `OUTPUT`): the app's SYNs to Envoy's outbound capture port. Istio's
//!   `nat OUTPUT` REDIRECT has already rewritten the destination to `127.0.0.1:15001` when the
//!   filter hook runs, so the match is `-d 127.0.0.1 --dport 15001`. Envoy's own connections (uid
//!   1337) are never held. The owner match is only valid in OUTPUT, which is why the inbound rule
//!   lives in a chain of its own.
//! - `HOLDFAST_IN` (from `INPUT`): SYNs to the inbound capture port. Connections arriving over the
//!   pod's veth are REDIRECTed to 15006 in `nat PREROUTING`, before `filter INPUT`. Loopback is
//!   excluded: Istio RETURNs the app's own connections on `lo`, so inbound SYNs on `lo` to 15006
//!   come only from Envoy's hairpin to its own pod IP, which must not wait for Envoy itself.
//!
//! Every rule carries `-m comment --comment holdfast` and `--queue-bypass` (with no queue bound,
//! the kernel accepts instead of dropping: never worse than no agent). Changes go through one
//! `iptables-restore --noflush` transaction, so the chains and jumps appear and disappear together.
//! `find` parses `iptables -S`, so an agent restarted mid-hold can find and adopt its hold.

use crate::netns::PodNetns;

/// Chain holding the outbound rule, jumped to from `OUTPUT`.
pub const OUT_CHAIN: &str = "HOLDFAST_OUT";
/// Chain holding the inbound rule, jumped to from `INPUT`.
pub const IN_CHAIN: &str = "HOLDFAST_IN";
/// Comment on every holdfast rule.
pub const COMMENT: &str = "holdfast";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netns(#[from] crate::netns::Error),
    #[error("`{program} {args}` failed in netns {netns:?} ({status}): {stderr}")]
    Failed {
        netns: crate::netns::NetnsId,
        program: String,
        args: String,
        status: String,
        stderr: String,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to hold and how.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuleSpec {
    /// NFQUEUE number the rules send SYNs to.
    pub queue_num: u16,
    /// Envoy's outbound capture port (Istio: 15001).
    pub outbound_port: u16,
    /// Envoy's inbound capture port (Istio: 15006); `None` to hold outbound only.
    pub inbound_port: Option<u16>,
    /// The proxy's uid (Istio: 1337), whose connections are never held.
    pub proxy_uid: u32,
    /// `iptables` binary (must use the same backend, nft or legacy, as the pod's Istio rules).
    pub iptables: String,
    /// `iptables-restore` binary of the same backend.
    pub iptables_restore: String,
    /// Also hold IPv6 (`::1`), for pods whose Istio rules cover IPv6 (dual-stack).
    pub ipv6: bool,
    /// pilot-agent's DNS port (Istio: 15053) when the pod's DNS is captured: DNS is held until
    /// it listens. TODO(issue 10 §5): rules for it; `None` holds no DNS.
    pub dns_port: Option<u16>,
    /// `ip6tables` binary (same backend).
    pub ip6tables: String,
    /// `ip6tables-restore` binary (same backend).
    pub ip6tables_restore: String,
}

/// An address family: iptables or ip6tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1/32",
            Family::V6 => "::1/128",
        }
    }

    fn iptables(self, spec: &RuleSpec) -> &str {
        match self {
            Family::V4 => &spec.iptables,
            Family::V6 => &spec.ip6tables,
        }
    }

    fn restore(self, spec: &RuleSpec) -> &str {
        match self {
            Family::V4 => &spec.iptables_restore,
            Family::V6 => &spec.ip6tables_restore,
        }
    }
}

impl RuleSpec {
    /// The families the hold covers.
    pub fn families(&self) -> &'static [Family] {
        if self.ipv6 {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        }
    }
}

impl Default for RuleSpec {
    fn default() -> Self {
        RuleSpec {
            queue_num: 15015,
            outbound_port: 15001,
            inbound_port: Some(15006),
            proxy_uid: 1337,
            iptables: "iptables".to_string(),
            iptables_restore: "iptables-restore".to_string(),
            ipv6: false,
            dns_port: None,
            ip6tables: "ip6tables".to_string(),
            ip6tables_restore: "ip6tables-restore".to_string(),
        }
    }
}

/// A hold found in a netns by [`find`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FoundHold {
    /// Queue number of the first NFQUEUE rule in the holdfast chains, if any.
    pub queue_num: Option<u16>,
    /// NFQUEUE rules in the holdfast chains.
    pub queue_rules: usize,
    /// `-A OUTPUT ... -j HOLDFAST_OUT` / `-A INPUT ... -j HOLDFAST_IN` rules, as printed by `-S`.
    pub jumps: Vec<String>,
    /// Holdfast chains that exist.
    pub chains: Vec<String>,
}

impl FoundHold {
    /// A hold is in force when some jump leads to a chain with an NFQUEUE rule.
    pub fn is_active(&self) -> bool {
        self.queue_rules > 0 && !self.jumps.is_empty()
    }
}

/// The hold rules of one family as argument vectors for `iptables -A`, without the table flag.
pub fn hold_rules(spec: &RuleSpec, family: Family) -> Vec<Vec<String>> {
    let queue = spec.queue_num.to_string();
    let mut rules = vec![args(&[
        "-A",
        OUT_CHAIN,
        "-p",
        "tcp",
        "--syn",
        "-d",
        family.loopback(),
        "--dport",
        &spec.outbound_port.to_string(),
        "-m",
        "owner",
        "!",
        "--uid-owner",
        &spec.proxy_uid.to_string(),
        "-m",
        "comment",
        "--comment",
        COMMENT,
        "-j",
        "NFQUEUE",
        "--queue-num",
        &queue,
        "--queue-bypass",
    ])];
    if let Some(inbound) = spec.inbound_port {
        rules.push(args(&[
            "-A",
            IN_CHAIN,
            "!",
            "-i",
            "lo",
            "-p",
            "tcp",
            "--syn",
            "--dport",
            &inbound.to_string(),
            "-m",
            "comment",
            "--comment",
            COMMENT,
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue,
            "--queue-bypass",
        ]));
    }
    rules
}

/// The jumps from the built-in chains, inserted first so no earlier ACCEPT skips the hold.
pub fn jump_rules() -> Vec<Vec<String>> {
    vec![
        args(&[
            "-I",
            "OUTPUT",
            "1",
            "-m",
            "comment",
            "--comment",
            COMMENT,
            "-j",
            OUT_CHAIN,
        ]),
        args(&[
            "-I",
            "INPUT",
            "1",
            "-m",
            "comment",
            "--comment",
            COMMENT,
            "-j",
            IN_CHAIN,
        ]),
    ]
}

fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `iptables-restore --noflush` input that (re)creates the chains (declaring an existing chain
/// flushes it) and adds the jumps that `existing` does not already have.
pub fn install_script(spec: &RuleSpec, family: Family, existing: &FoundHold) -> String {
    let mut script = String::from("*filter\n");
    script.push_str(&format!(":{OUT_CHAIN} - [0:0]\n:{IN_CHAIN} - [0:0]\n"));
    for rule in hold_rules(spec, family) {
        script.push_str(&rule.join(" "));
        script.push('\n');
    }
    for jump in jump_rules() {
        let target = jump.last().map(String::as_str).unwrap_or_default();
        let builtin = jump.get(1).map(String::as_str).unwrap_or_default();
        let present = existing.jumps.iter().any(|j| {
            j.starts_with(&format!("-A {builtin} ")) && j.ends_with(&format!("-j {target}"))
        });
        if !present {
            script.push_str(&jump.join(" "));
            script.push('\n');
        }
    }
    script.push_str("COMMIT\n");
    script
}

/// `iptables-restore --noflush` input that removes every jump and chain in `existing`, or `None`
/// when there is nothing to remove.
pub fn remove_script(existing: &FoundHold) -> Option<String> {
    if existing.jumps.is_empty() && existing.chains.is_empty() {
        return None;
    }
    let mut script = String::from("*filter\n");
    for jump in &existing.jumps {
        // `-S` prints rules as `-A CHAIN spec`; `-D CHAIN spec` deletes exactly that rule.
        if let Some(spec) = jump.strip_prefix("-A ") {
            script.push_str(&format!("-D {spec}\n"));
        }
    }
    for chain in &existing.chains {
        script.push_str(&format!("-F {chain}\n-X {chain}\n"));
    }
    script.push_str("COMMIT\n");
    Some(script)
}

/// Parses `iptables -S` (filter table) output for holdfast chains, rules and jumps.
pub fn parse_found(iptables_s: &str) -> FoundHold {
    let mut found = FoundHold::default();
    for line in iptables_s.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["-N", chain] if is_holdfast_chain(chain) => found.chains.push(chain.to_string()),
            ["-A", chain, ..]
                if is_holdfast_chain(chain) && words.windows(2).any(|w| w == ["-j", "NFQUEUE"]) =>
            {
                found.queue_rules += 1;
                if found.queue_num.is_none() {
                    found.queue_num = words
                        .windows(2)
                        .find(|w| w[0] == "--queue-num")
                        .and_then(|w| w[1].parse().ok());
                }
            }
            ["-A", chain, ..] if is_holdfast_chain(chain) => {}
            ["-A", _, ..] => {
                let jumps_to_ours = words
                    .windows(2)
                    .any(|w| (w[0] == "-j" || w[0] == "-g") && is_holdfast_chain(w[1]));
                if jumps_to_ours {
                    found.jumps.push(line.to_string());
                }
            }
            _ => {}
        }
    }
    found
}

fn is_holdfast_chain(chain: &str) -> bool {
    chain == OUT_CHAIN || chain == IN_CHAIN
}

fn run_checked(
    netns: &PodNetns,
    program: &str,
    args: &[String],
    stdin: Option<String>,
) -> Result<String> {
    let output = netns.run_command(program, args, stdin.map(String::into_bytes))?;
    if !output.status.success() {
        return Err(Error::Failed {
            netns: netns.id(),
            program: program.to_string(),
            args: args.join(" "),
            status: output.status.to_string(),
            stderr: output.stderr.trim().to_string(),
        });
    }
    Ok(output.stdout)
}

/// Reads the holdfast rules present in the netns (all families of `spec`, merged).
pub fn find(netns: &PodNetns, spec: &RuleSpec) -> Result<FoundHold> {
    Ok(merge(&find_per_family(netns, spec)?))
}

fn find_family(netns: &PodNetns, spec: &RuleSpec, family: Family) -> Result<FoundHold> {
    let listing = args(&["-w", "5", "-t", "filter", "-S"]);
    let out = run_checked(netns, family.iptables(spec), &listing, None)?;
    Ok(parse_found(&out))
}

/// Installs (or re-installs, replacing the chains' rules) the hold, one transaction per family.
pub fn install(netns: &PodNetns, spec: &RuleSpec) -> Result<()> {
    let mut existing = Vec::new();
    for &family in spec.families() {
        existing.push((family, find_family(netns, spec, family)?));
    }
    install_over(netns, spec, &existing)
}

/// Per address family, what [`find_per_family`] saw.
pub type FoundPerFamily = Vec<(Family, FoundHold)>;

/// [`find`], keeping each family's findings apart (for [`install_over`]).
pub fn find_per_family(netns: &PodNetns, spec: &RuleSpec) -> Result<FoundPerFamily> {
    spec.families()
        .iter()
        .map(|&family| Ok((family, find_family(netns, spec, family)?)))
        .collect()
}

/// Merges per-family findings into one [`FoundHold`].
pub fn merge(found: &FoundPerFamily) -> FoundHold {
    let mut merged = FoundHold::default();
    for (_, f) in found {
        merged.queue_num = merged.queue_num.or(f.queue_num);
        merged.queue_rules += f.queue_rules;
        merged.jumps.extend(f.jumps.iter().cloned());
        merged.chains.extend(f.chains.iter().cloned());
    }
    merged
}

/// Installs the rules over what a fresh [`find_per_family`] saw (one `iptables-restore` per
/// family, no second listing).
pub fn install_over(netns: &PodNetns, spec: &RuleSpec, existing: &FoundPerFamily) -> Result<()> {
    for (family, existing) in existing {
        let family = *family;
        let script = install_script(spec, family, existing);
        let restore = args(&["-w", "5", "--noflush"]);
        run_checked(netns, family.restore(spec), &restore, Some(script))?;
    }
    tracing::debug!(netns = ?netns.id(), queue = spec.queue_num, "hold rules installed");
    Ok(())
}

/// Removes every holdfast jump and chain from the netns, one transaction per family.
/// Idempotent: returns `false` when there was nothing to remove.
pub fn remove(netns: &PodNetns, spec: &RuleSpec) -> Result<bool> {
    let mut removed = false;
    for &family in spec.families() {
        let existing = find_family(netns, spec, family)?;
        let Some(script) = remove_script(&existing) else {
            continue;
        };
        let restore = args(&["-w", "5", "--noflush"]);
        run_checked(netns, family.restore(spec), &restore, Some(script))?;
        removed = true;
    }
    if removed {
        tracing::debug!(netns = ?netns.id(), "hold rules removed");
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    // As printed by iptables-nft 1.8.9 for the rules above.
    const LISTED: &str = "-P INPUT ACCEPT
-P FORWARD ACCEPT
-P OUTPUT ACCEPT
-N HOLDFAST_IN
-N HOLDFAST_OUT
-A INPUT -m comment --comment holdfast -j HOLDFAST_IN
-A OUTPUT -m comment --comment holdfast -j HOLDFAST_OUT
-A HOLDFAST_IN ! -i lo -p tcp -m tcp --dport 15006 --tcp-flags FIN,SYN,RST,ACK SYN -m comment --comment holdfast -j NFQUEUE --queue-num 15015 --queue-bypass
-A HOLDFAST_OUT -d 127.0.0.1/32 -p tcp -m tcp --dport 15001 --tcp-flags FIN,SYN,RST,ACK SYN -m owner ! --uid-owner 1337 -m comment --comment holdfast -j NFQUEUE --queue-num 15015 --queue-bypass
";

    #[test]
    fn parses_listed_rules() {
        let found = parse_found(LISTED);
        assert!(found.is_active());
        assert_eq!(found.queue_num, Some(15015));
        assert_eq!(found.queue_rules, 2);
        assert_eq!(found.jumps.len(), 2);
        assert_eq!(found.chains, vec![IN_CHAIN, OUT_CHAIN]);
    }

    #[test]
    fn nothing_found_in_an_empty_table() {
        let found = parse_found("-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT\n");
        assert!(!found.is_active());
        assert_eq!(found, FoundHold::default());
        assert_eq!(remove_script(&found), None);
        assert_eq!(parse_found("garbage\n-A\n-N\n\u{0}"), FoundHold::default());
    }

    #[test]
    fn remove_script_deletes_exact_jumps_then_chains() {
        let script = remove_script(&parse_found(LISTED)).expect("something to remove");
        assert!(script.contains("-D INPUT -m comment --comment holdfast -j HOLDFAST_IN\n"));
        assert!(script.contains("-D OUTPUT -m comment --comment holdfast -j HOLDFAST_OUT\n"));
        assert!(script.contains("-F HOLDFAST_OUT\n-X HOLDFAST_OUT\n"));
        assert!(script.ends_with("COMMIT\n"));
    }

    #[test]
    fn install_script_skips_present_jumps() {
        let spec = RuleSpec::default();
        let fresh = install_script(&spec, Family::V4, &FoundHold::default());
        assert!(fresh.contains("-I OUTPUT 1 -m comment --comment holdfast -j HOLDFAST_OUT\n"));
        assert!(fresh.contains("--uid-owner 1337"));
        assert!(fresh.contains("--queue-num 15015 --queue-bypass"));
        let again = install_script(&spec, Family::V4, &parse_found(LISTED));
        assert!(!again.contains("-I OUTPUT"));
        assert!(!again.contains("-I INPUT"));
        let outbound_only = hold_rules(
            &RuleSpec {
                inbound_port: None,
                ..RuleSpec::default()
            },
            Family::V4,
        );
        let v6 = install_script(&spec, Family::V6, &FoundHold::default());
        assert!(v6.contains("-d ::1/128"), "{v6}");
        assert_eq!(outbound_only.len(), 1);
    }
}
