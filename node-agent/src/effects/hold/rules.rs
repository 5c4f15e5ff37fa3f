//! The iptables rules of the startup hold, installed in a pod's network namespace.
//!
//! Two dedicated chains in the `filter` table, each jumped to from the top of its built-in chain:
//!
//! - `HOLDFAST_OUT` (from `OUTPUT`): the app's SYNs to Envoy's outbound capture port. Istio's
//!   `nat OUTPUT` REDIRECT has already rewritten the destination to `127.0.0.1:15001` when the
//!   filter hook runs (nat OUTPUT has priority -100, filter 0), so the match is
//!   `-d 127.0.0.1 --dport 15001`. Envoy's own connections (uid 1337) are never held. The owner
//!   match is only valid in OUTPUT, which is why the inbound rule lives in a chain of its own.
//! - `HOLDFAST_IN` (from `INPUT`): SYNs to the inbound capture port. Connections arriving over the
//!   pod's veth are REDIRECTed to 15006 in `nat PREROUTING`, before `filter INPUT`. Loopback is
//!   excluded: Istio RETURNs the app's own connections on `lo`, so inbound SYNs on `lo` to 15006
//!   come only from Envoy's hairpin to its own pod IP, which must not wait for Envoy itself.
//!
//! **IPv6** ([`RuleSpec::ipv6`]): the same chains in `ip6tables`, with `::1` for `127.0.0.1` and
//! the same queue. istio-iptables writes the IPv6 rules as copies of the IPv4 ones with `::1/128`
//! and `::6/128` (`AppendVersionedRule(..., "::1/128", ...)` in
//! tools/istio-iptables/pkg/capture/run.go; golden `testdata/ipv6-inbound-ports.golden`), and the
//! kernel's REDIRECT of a locally generated packet rewrites it to the loopback address of its
//! family (`nf_nat_redirect_ipv6`: `::1`). IPv6 is best effort: if `ip6tables` is missing or
//! fails, the IPv4 hold stands and the error is reported (see `Installed::ipv6_error`).
//!
//! **DNS** ([`RuleSpec::dns_port`]): with `ISTIO_META_DNS_CAPTURE`, istio-iptables appends
//! `-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS` after the uid/gid 1337 RETURNs, and in ISTIO_OUTPUT_DNS
//! `-p tcp --dport 53 [-d <resolv.conf server>] -j REDIRECT --to-ports 15053` and
//! `-p udp --dport 53 [-d <server>] -j REDIRECT --to-port 15053` (`SetupDNSRedir` in run.go;
//! golden `testdata/dns-uid-gid.golden`). Like the TCP capture, filter OUTPUT sees those packets
//! after the nat REDIRECT, addressed to `127.0.0.1:15053` (`::1` for IPv6 servers), so the hold
//! queues the app's (not uid 1337's) UDP packets and TCP SYNs to the loopback DNS port. Matching
//! the post-REDIRECT address holds exactly what Istio sends to pilot-agent: DNS to servers Istio
//! does not capture, and pilot-agent's own upstream queries (uid 1337, RETURNed before the DNS
//! chain), pass. A queued UDP query is released by the same accept verdict as a SYN.
//!
//! Every rule carries `-m comment --comment holdfast` and `--queue-bypass` (with no queue bound,
//! the kernel accepts instead of dropping: never worse than no agent). Changes go through one
//! `iptables-restore --noflush` transaction per family, so the chains and jumps appear and
//! disappear together. `find` reads the hold back (so an agent restarted mid-hold can adopt it)
//! from holdfast's own chains only, never the pod's whole table (issue 29: a pod with `NET_ADMIN`
//! fills its own tables at will): one `iptables-restore` probe says whether any holdfast chain
//! exists at all (no output to read); only if one does, `iptables -S <chain>` lists it and
//! `iptables -C` checks each jump as holdfast writes it.
//!
//! **Over its bounds, remembered** (`BOUND_CHAIN`): a command in a pod's namespace runs with
//! bounds of its own (`effects::netns`). iptables-nft 1.8.9 fetches the whole table for any
//! listing, check or rule deletion — `-S <chain>` of a 50,000-rule table took 2.2 s and 68 MB
//! here — while creating, flushing and deleting chains and adding rules cost ~20 ms and 2 MB
//! whatever the table holds. So a flooded table breaks the bounds of a listing or a release, and
//! the pod is failed open: `disarm_and_mark` empties holdfast's chains (nothing is held) and
//! creates `HOLDFAST_BOUND` with the time in a comment, in one cheap transaction; every later
//! look — a restarted agent's too — first probes for that chain, cheaply, and runs nothing
//! heavier in that namespace ([`Error::Remembered`]).

use crate::effects::netns::PodNetns;

/// Chain holding the outbound rule, jumped to from `OUTPUT`.
pub(crate) const OUT_CHAIN: &str = "HOLDFAST_OUT";
/// Chain holding the inbound rule, jumped to from `INPUT`.
pub(crate) const IN_CHAIN: &str = "HOLDFAST_IN";
/// Comment on every holdfast rule.
pub(crate) const COMMENT: &str = "holdfast";
/// The chain whose presence says a command in this namespace broke its bounds (see the module
/// docs): made by [`disarm_and_mark`], probed before any listing.
pub(crate) const BOUND_CHAIN: &str = "HOLDFAST_BOUND";
/// The comment of the rule in [`BOUND_CHAIN`]: `holdfast-over-bound-ms=<Unix milliseconds>`.
pub(crate) const BOUND_PREFIX: &str = "holdfast-over-bound-ms=";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netns(#[from] crate::effects::netns::Error),
    #[error("`{program} {args}` failed in netns {netns:?} ({status}): {stderr}")]
    Failed {
        netns: crate::effects::netns::NetnsId,
        program: String,
        args: String,
        status: String,
        stderr: String,
    },
    /// A command in this namespace broke its bounds before (this agent's or a previous one's:
    /// `BOUND_CHAIN` is there), so none is run again to look.
    #[error("a command the agent ran in network namespace {0:?} broke its bounds before (holdfast's {BOUND_CHAIN} marker is there): nothing more is run there")]
    Remembered(crate::effects::netns::NetnsId),
}

impl Error {
    /// Whether a command broke its own bounds (its output, time, memory or CPU: the pod's
    /// tables made it too costly), now or before (`Some(true)`: remembered, [`BOUND_CHAIN`]);
    /// `None` for any other failure.
    pub(crate) fn over_bound(&self) -> Option<bool> {
        match self {
            Error::Netns(crate::effects::netns::Error::CommandOverBound { .. }) => Some(false),
            Error::Remembered(_) => Some(true),
            _ => None,
        }
    }
}

/// Result of this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

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
    /// Also hold IPv6 (`::1`): on for every pod with an IPv6 address (the IPv6 rules only match
    /// what Istio's ip6tables rules redirected, so they cost nothing where Istio has none).
    pub ipv6: bool,
    /// pilot-agent's DNS port (Istio: 15053) when the pod's DNS is captured: the app's UDP
    /// packets and TCP SYNs redirected to it are held too. `None` holds no DNS.
    pub dns_port: Option<u16>,
    /// `ip6tables` binary (same backend).
    pub ip6tables: String,
    /// `ip6tables-restore` binary (same backend).
    pub ip6tables_restore: String,
    /// When the hold began (Unix milliseconds), written into the chain as a marker rule so that an
    /// agent adopting the hold counts its deadline from the hold's start, not its own
    /// (`SINCE_PREFIX`). `None` writes no marker (what agents before it wrote).
    #[serde(skip)]
    pub since: Option<u64>,
}

/// The comment of the marker rule that carries the hold's start: `-A HOLDFAST_OUT -m comment
/// --comment holdfast-since-ms=<Unix milliseconds>`. It has no target, so it changes no packet's fate
/// (a rule without `-j` only counts); the chain's flush at release removes it with the rest.
/// A pod (it may write rules in its own namespace) can forge it only to shorten its own hold:
/// the deadline is counted from it, never past `--max-hold-timeout` from the agent's own look.
pub(crate) const SINCE_PREFIX: &str = "holdfast-since-ms=";

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
    pub(crate) fn families(&self) -> &'static [Family] {
        if self.ipv6 {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        }
    }
}

/// The reference mesh's ports and uid (`crate::mesh::REFERENCE_OUTBOUND_PORT`), for tests and
/// tools: the agent builds every pod's rules from that pod's mesh profile
/// (`HoldConfig::for_pod`), never from this default.
impl Default for RuleSpec {
    fn default() -> Self {
        use crate::mesh;
        RuleSpec {
            queue_num: 15015,
            outbound_port: mesh::REFERENCE_OUTBOUND_PORT,
            inbound_port: Some(mesh::REFERENCE_INBOUND_PORT),
            proxy_uid: mesh::REFERENCE_PROXY_UID,
            iptables: "iptables".to_string(),
            iptables_restore: "iptables-restore".to_string(),
            ipv6: false,
            dns_port: None,
            ip6tables: "ip6tables".to_string(),
            ip6tables_restore: "ip6tables-restore".to_string(),
            since: None,
        }
    }
}

/// A hold found in a netns by `find`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FoundHold {
    /// Queue number of the first NFQUEUE rule in the holdfast chains, if any.
    pub queue_num: Option<u16>,
    /// NFQUEUE rules in the holdfast chains.
    pub queue_rules: usize,
    /// `-A OUTPUT ... -j HOLDFAST_OUT` / `-A INPUT ... -j HOLDFAST_IN` rules, as printed by `-S`
    /// ([`parse_found`]), or as holdfast writes them where `iptables -C` found them
    /// (`find`).
    pub jumps: Vec<String>,
    /// Holdfast chains that exist.
    pub chains: Vec<String>,
    /// When the hold began, by its marker rule (`SINCE_PREFIX`; the earliest if several).
    pub since: Option<u64>,
}

impl FoundHold {
    /// A hold is in force when some jump leads to a chain with an NFQUEUE rule.
    pub fn is_active(&self) -> bool {
        self.queue_rules > 0 && !self.jumps.is_empty()
    }
}

/// The hold rules of one family as argument vectors for `iptables -A`, without the table flag.
pub(crate) fn hold_rules(spec: &RuleSpec, family: Family) -> Vec<Vec<String>> {
    let queue = spec.queue_num.to_string();
    let uid = spec.proxy_uid.to_string();
    // Every rule ends the same way: marked as ours, queued, passed when no agent is bound.
    let to_queue = args(&[
        "-m",
        "comment",
        "--comment",
        COMMENT,
        "-j",
        "NFQUEUE",
        "--queue-num",
        &queue,
        "--queue-bypass",
    ]);
    // An outbound rule: the app's (not the proxy uid's) packets to `port` on loopback, after
    // Istio's nat REDIRECT. `syn` narrows TCP to connection openings.
    let outbound = |proto: &str, port: u16| {
        let mut rule = args(&["-A", OUT_CHAIN, "-p", proto]);
        if proto == "tcp" {
            rule.push("--syn".to_string());
        }
        rule.extend(args(&[
            "-d",
            family.loopback(),
            "--dport",
            &port.to_string(),
            "-m",
            "owner",
            "!",
            "--uid-owner",
            &uid,
        ]));
        rule.extend(to_queue.iter().cloned());
        rule
    };
    let mut rules = Vec::new();
    if let Some(since) = spec.since {
        rules.push(vec![
            "-A".to_string(),
            OUT_CHAIN.to_string(),
            "-m".to_string(),
            "comment".to_string(),
            "--comment".to_string(),
            format!("{SINCE_PREFIX}{since}"),
        ]);
    }
    rules.push(outbound("tcp", spec.outbound_port));
    if let Some(dns) = spec.dns_port {
        rules.push(outbound("udp", dns));
        rules.push(outbound("tcp", dns));
    }
    if let Some(inbound) = spec.inbound_port {
        let mut rule = args(&[
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
        ]);
        rule.extend(to_queue.iter().cloned());
        rules.push(rule);
    }
    rules
}

/// The jumps from the built-in chains, inserted first so no earlier ACCEPT skips the hold.
pub(crate) fn jump_rules() -> Vec<Vec<String>> {
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

/// The jumps as holdfast writes them, as `-S` prints them: `(built-in chain, holdfast chain,
/// the printed rule)`.
fn canonical_jumps() -> [(&'static str, &'static str, String); 2] {
    let printed = |builtin: &str, chain: &str| {
        format!("-A {builtin} -m comment --comment {COMMENT} -j {chain}")
    };
    [
        ("OUTPUT", OUT_CHAIN, printed("OUTPUT", OUT_CHAIN)),
        ("INPUT", IN_CHAIN, printed("INPUT", IN_CHAIN)),
    ]
}

/// `iptables-restore --noflush` input that removes holdfast's jumps (as holdfast writes them)
/// and chains found in `existing`, or `None` when there is nothing to remove. Built from
/// holdfast's own rule text and chain names only, never from the text the pod's table printed
/// (issue 29: a pod writes its own table, and `-D <its spec>` would hand its text to
/// iptables-restore's parser). A jump the pod added in another form keeps the chain referenced
/// and the transaction fails: `flush_script` then empties the chains instead.
pub fn remove_script(existing: &FoundHold) -> Option<String> {
    if existing.jumps.is_empty() && existing.chains.is_empty() {
        return None;
    }
    let mut script = String::from("*filter\n");
    for (builtin, chain, printed) in canonical_jumps() {
        if existing.jumps.contains(&printed) {
            script.push_str(&format!(
                "-D {builtin} -m comment --comment {COMMENT} -j {chain}\n"
            ));
        }
    }
    for chain in holdfast_chains(existing) {
        script.push_str(&format!("-F {chain}\n-X {chain}\n"));
    }
    script.push_str("COMMIT\n");
    Some(script)
}

/// `iptables-restore --noflush` input that empties holdfast's chains in `existing` (a jump to an
/// empty chain returns at once: nothing is held), for when they cannot be removed.
pub(crate) fn flush_script(existing: &FoundHold) -> Option<String> {
    let chains = holdfast_chains(existing);
    if chains.is_empty() {
        return None;
    }
    let mut script = String::from("*filter\n");
    for chain in chains {
        script.push_str(&format!("-F {chain}\n"));
    }
    script.push_str("COMMIT\n");
    Some(script)
}

/// Holdfast's chain names among those found (the names written into scripts are the constants).
fn holdfast_chains(existing: &FoundHold) -> Vec<&'static str> {
    [OUT_CHAIN, IN_CHAIN]
        .into_iter()
        .filter(|c| existing.chains.iter().any(|f| f == c))
        .collect()
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
            ["-A", chain, ..] if is_holdfast_chain(chain) => {
                let since = words
                    .windows(2)
                    .find(|w| w[0] == "--comment")
                    .and_then(|w| w[1].trim_matches('"').strip_prefix(SINCE_PREFIX))
                    .and_then(|t| t.parse::<u64>().ok());
                if let Some(t) = since {
                    found.since = Some(found.since.map_or(t, |f| f.min(t)));
                }
            }
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

/// Reads the holdfast rules present in the netns (all families of `spec`, merged). An IPv6
/// table that cannot be listed counts as holding nothing (see [`find_per_family`]).
pub(crate) fn find(netns: &PodNetns, spec: &RuleSpec) -> Result<FoundHold> {
    Ok(merge(&find_per_family(netns, spec)?))
}

/// What the probe ([`probe_script`]) says about a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// No holdfast chain: nothing of holdfast's is there (a jump needs its chain).
    Nothing,
    /// [`BOUND_CHAIN`] is there.
    Remembered,
    /// A holdfast chain exists (or the probe failed otherwise): list.
    List,
}

/// `iptables-restore --noflush` input that creates and deletes [`BOUND_CHAIN`] and holdfast's
/// two chains in one transaction: it succeeds, changing nothing, exactly when none of them
/// exists ("Chain already exists" otherwise, at the line of the first that does). Creating and
/// deleting chains costs iptables-nft the same whatever the rest of the table holds (20 ms and
/// 2 MB beside 50,000 rules, against 2.2 s and 68 MB for `-S <chain>`).
pub(crate) fn probe_script() -> String {
    let mut script = String::from("*filter\n");
    for chain in [BOUND_CHAIN, OUT_CHAIN, IN_CHAIN] {
        script.push_str(&format!("-N {chain}\n-X {chain}\n"));
    }
    script.push_str("COMMIT\n");
    script
}

/// Reads the probe's end: success is [`Probe::Nothing`]; a failure at line 2 (`-N` of
/// [`BOUND_CHAIN`], iptables-restore's "line 2 failed", nft and legacy alike) is
/// [`Probe::Remembered`]; any other failure is [`Probe::List`].
pub(crate) fn parse_probe(success: bool, stderr: &str) -> Probe {
    if success {
        Probe::Nothing
    } else if stderr.contains("line 2 failed") {
        Probe::Remembered
    } else {
        Probe::List
    }
}

fn find_family(netns: &PodNetns, spec: &RuleSpec, family: Family) -> Result<FoundHold> {
    let restore = args(&["-w", "5", "--noflush"]);
    let probe = netns.run_command(
        family.restore(spec),
        &restore,
        Some(probe_script().into_bytes()),
    )?;
    match parse_probe(probe.status.success(), &probe.stderr) {
        Probe::Nothing => return Ok(FoundHold::default()),
        Probe::Remembered => return Err(Error::Remembered(netns.id())),
        Probe::List => {}
    }
    // Holdfast's own chains only: a flood elsewhere in the pod's table prints nothing here.
    let mut listed = String::new();
    for chain in [OUT_CHAIN, IN_CHAIN] {
        let listing = args(&["-w", "5", "-t", "filter", "-S", chain]);
        let out = netns.run_command(family.iptables(spec), &listing, None)?;
        // A chain that is not there fails the listing (iptables-nft 1.8.9 says "chain ... is
        // incompatible, use 'nft' tool", legacy "No chain/target/match by that name"); so
        // does one that cannot be listed: neither holds anything holdfast can use.
        if out.status.success() {
            listed.push_str(&out.stdout);
        }
    }
    let mut found = parse_found(&listed);
    // The jumps, as holdfast writes them: `-C` answers yes or no, printing nothing.
    for (builtin, chain, printed) in canonical_jumps() {
        if !found.chains.iter().any(|c| c == chain) {
            continue;
        }
        let check = args(&[
            "-w",
            "5",
            "-t",
            "filter",
            "-C",
            builtin,
            "-m",
            "comment",
            "--comment",
            COMMENT,
            "-j",
            chain,
        ]);
        if netns
            .run_command(family.iptables(spec), &check, None)?
            .status
            .success()
        {
            found.jumps.push(printed);
        }
    }
    Ok(found)
}

/// Per address family, what [`find_per_family`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FoundPerFamily {
    /// The families whose tables were listed, with what they hold.
    pub families: Vec<(Family, FoundHold)>,
    /// Why the IPv6 table could not be listed (IPv6 is then left out: fail open).
    pub ipv6_error: Option<String>,
}

impl FoundPerFamily {
    /// Nothing found, for a namespace known to be new: every family of `spec` is installed.
    pub(crate) fn nothing(spec: &RuleSpec) -> FoundPerFamily {
        FoundPerFamily {
            families: spec
                .families()
                .iter()
                .map(|&f| (f, FoundHold::default()))
                .collect(),
            ipv6_error: None,
        }
    }
}

/// What [`install_over`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Installed {
    /// The families whose rules are in force.
    pub families: Vec<Family>,
    /// Why IPv6 is not held although asked for (`ip6tables` missing or failing): IPv4 is held
    /// regardless, IPv6 connections pass unheld as without an agent.
    pub ipv6_error: Option<String>,
}

/// [`find`], keeping each family's findings apart (for [`install_over`]). IPv4 must list; an
/// IPv6 failure is recorded in [`FoundPerFamily::ipv6_error`] and the family left out.
pub(crate) fn find_per_family(netns: &PodNetns, spec: &RuleSpec) -> Result<FoundPerFamily> {
    let mut found = FoundPerFamily::default();
    for &family in spec.families() {
        match (family, find_family(netns, spec, family)) {
            (_, Ok(f)) => found.families.push((family, f)),
            // Over its bounds is the pod's doing in either family.
            (Family::V6, Err(e)) if e.over_bound().is_none() => {
                found.ipv6_error = Some(e.to_string())
            }
            (_, Err(e)) => return Err(e),
        }
    }
    Ok(found)
}

/// Merges per-family findings into one [`FoundHold`].
pub(crate) fn merge(found: &FoundPerFamily) -> FoundHold {
    let mut merged = FoundHold::default();
    for (_, f) in &found.families {
        merged.queue_num = merged.queue_num.or(f.queue_num);
        merged.queue_rules += f.queue_rules;
        merged.jumps.extend(f.jumps.iter().cloned());
        merged.chains.extend(f.chains.iter().cloned());
        merged.since = match (merged.since, f.since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    merged
}

/// Installs the rules over what a fresh [`find_per_family`] saw (one `iptables-restore` per
/// family, no second listing). The families' restores run at once, each in its own child (the
/// hold is in when the slower is: a pod's app may connect ~150 ms after its sandbox, and on a
/// busy node each child took 20–90 ms; issue 29). IPv4's failure is an error (the caller
/// clears what did go in); an IPv6 failure (or an IPv6 table that could not be listed) is
/// reported in [`Installed::ipv6_error`] and leaves the IPv4 hold in force.
pub(crate) fn install_over(
    netns: &PodNetns,
    spec: &RuleSpec,
    existing: &FoundPerFamily,
) -> Result<Installed> {
    let mut installed = Installed {
        families: Vec::new(),
        ipv6_error: existing.ipv6_error.clone(),
    };
    let restore = args(&["-w", "5", "--noflush"]);
    let results: Vec<(Family, Result<String>)> = std::thread::scope(|scope| {
        let runs: Vec<_> = existing
            .families
            .iter()
            .map(|(family, found)| {
                let family = *family;
                let script = install_script(spec, family, found);
                let restore = &restore;
                (
                    family,
                    scope.spawn(move || {
                        run_checked(netns, family.restore(spec), restore, Some(script))
                    }),
                )
            })
            .collect();
        runs.into_iter()
            .map(|(family, run)| {
                let result = run.join().unwrap_or_else(|_| {
                    Err(Error::Failed {
                        netns: netns.id(),
                        program: family.restore(spec).to_string(),
                        args: restore.join(" "),
                        status: "the thread running it panicked".into(),
                        stderr: String::new(),
                    })
                });
                (family, result)
            })
            .collect()
    });
    for (family, result) in results {
        match (family, result) {
            (_, Ok(_)) => installed.families.push(family),
            (Family::V6, Err(e)) => installed.ipv6_error = Some(e.to_string()),
            (Family::V4, Err(e)) => return Err(e),
        }
    }
    if let Some(error) = &installed.ipv6_error {
        tracing::warn!(netns = ?netns.id(), %error, "IPv6 connections are not held (the IPv4 hold is in force)");
    }
    tracing::debug!(netns = ?netns.id(), queue = spec.queue_num, families = ?installed.families, dns = ?spec.dns_port, "hold rules installed");
    Ok(installed)
}

/// `iptables-restore --noflush` input that removes the hold exactly as [`install_script`] wrote
/// it into a namespace that had none: one jump per built-in chain, then the chains. It fails as
/// a whole (a transaction) if the table differs — a jump already gone, or a second jump to our
/// chain (`-X` then refuses: the chain is still referenced) — and changes nothing then.
pub(crate) fn installed_removal_script() -> String {
    let mut script = String::from("*filter\n");
    for jump in jump_rules() {
        // `-I CHAIN 1 spec` → `-D CHAIN spec`.
        let [_, chain, _, rest @ ..] = jump.as_slice() else {
            continue;
        };
        script.push_str(&format!("-D {chain} {}\n", rest.join(" ")));
    }
    for chain in [OUT_CHAIN, IN_CHAIN] {
        script.push_str(&format!("-F {chain}\n-X {chain}\n"));
    }
    script.push_str("COMMIT\n");
    script
}

/// Removes a hold this agent installed in `installed` (the families [`install_over`] put it
/// in): one `iptables-restore` per family with [`installed_removal_script`], no listing. A
/// family where that transaction fails (someone changed the table) and every family not in
/// `installed` are cleared as [`remove`] does, by listing first. `true` if anything was
/// removed.
pub(crate) fn remove_installed(
    netns: &PodNetns,
    spec: &RuleSpec,
    installed: &[Family],
) -> Result<bool> {
    let restore = args(&["-w", "5", "--noflush"]);
    let script = installed_removal_script();
    let mut removed = Vec::new();
    for &family in installed {
        match run_checked(netns, family.restore(spec), &restore, Some(script.clone())) {
            Ok(_) => removed.push(family),
            // The table made even this cost too much: a listing would cost more.
            Err(error) if error.over_bound().is_some() => return Err(error),
            Err(error) => {
                tracing::debug!(netns = ?netns.id(), ?family, %error, "the hold is not as installed; listing the rules to remove them")
            }
        }
    }
    let rest: Vec<Family> = [Family::V4, Family::V6]
        .into_iter()
        .filter(|f| !removed.contains(f))
        .collect();
    Ok(remove_families(netns, spec, &rest)? || !removed.is_empty())
}

/// `iptables-restore --noflush` input that empties holdfast's chains (creating them where they
/// are not: an empty chain holds nothing) and creates [`BOUND_CHAIN`] with a rule dated `at_ms`
/// (Unix milliseconds): only chain declarations and an appended rule, which iptables-nft does at
/// the same small cost whatever the pod's table holds.
pub(crate) fn disarm_script(at_ms: u64) -> String {
    format!(
        "*filter\n:{OUT_CHAIN} - [0:0]\n:{IN_CHAIN} - [0:0]\n:{BOUND_CHAIN} - [0:0]\n\
         -A {BOUND_CHAIN} -m comment --comment {BOUND_PREFIX}{at_ms}\nCOMMIT\n"
    )
}

/// After a command in the namespace broke its bounds: nothing of the hold holds any more, and
/// the namespace remembers it for every later look, this agent's or a successor's ([`find`]
/// answers [`Error::Remembered`] from then on). One cheap transaction per family, no listing;
/// IPv6 best effort.
pub(crate) fn disarm_and_mark(netns: &PodNetns, spec: &RuleSpec, at_ms: u64) -> Result<()> {
    let restore = args(&["-w", "5", "--noflush"]);
    for family in [Family::V4, Family::V6] {
        match (
            family,
            run_checked(
                netns,
                family.restore(spec),
                &restore,
                Some(disarm_script(at_ms)),
            ),
        ) {
            (_, Ok(_)) => {}
            (Family::V6, Err(error)) => {
                tracing::debug!(netns = ?netns.id(), %error, "cannot mark the IPv6 table")
            }
            (Family::V4, Err(e)) => return Err(e),
        }
    }
    Ok(())
}

/// Most transactions one jump of holdfast's may take to remove when written more than once
/// ([`remove_found`]).
const MAX_JUMP_COPIES: usize = 8;

/// Removes what [`find_family`] found in one family: one transaction ([`remove_script`]), and
/// when that fails — a jump holdfast wrote twice (`-C` cannot count them), or one of the pod's
/// own, keeps a chain referenced — each of holdfast's jumps one transaction at a time until it
/// is gone, then the chains; a chain that still cannot go is emptied ([`flush_script`]): it
/// holds nothing. A command over its bounds ends it at once.
fn remove_found(
    netns: &PodNetns,
    spec: &RuleSpec,
    family: Family,
    existing: &FoundHold,
) -> Result<bool> {
    let restore = args(&["-w", "5", "--noflush"]);
    let run = |script: String| run_checked(netns, family.restore(spec), &restore, Some(script));
    let Some(script) = remove_script(existing) else {
        return Ok(false);
    };
    match run(script) {
        Ok(_) => return Ok(true),
        Err(e) if e.over_bound().is_some() => return Err(e),
        Err(e) => {
            tracing::debug!(netns = ?netns.id(), error = %e, "the hold is not as found; removing its jumps one at a time")
        }
    }
    for (builtin, chain, printed) in canonical_jumps() {
        if !existing.jumps.contains(&printed) {
            continue;
        }
        for _ in 0..MAX_JUMP_COPIES {
            let one = format!(
                "*filter\n-D {builtin} -m comment --comment {COMMENT} -j {chain}\nCOMMIT\n"
            );
            match run(one) {
                Ok(_) => {}
                Err(e) if e.over_bound().is_some() => return Err(e),
                Err(_) => break,
            }
        }
    }
    let chains = FoundHold {
        jumps: Vec::new(),
        ..existing.clone()
    };
    match remove_script(&chains).map(run) {
        None | Some(Ok(_)) => Ok(true),
        Some(Err(e)) if e.over_bound().is_some() => Err(e),
        Some(Err(e)) => {
            tracing::debug!(netns = ?netns.id(), error = %e, "a jump of the pod's own keeps the hold's chains; emptying them");
            match flush_script(existing) {
                None => Err(e),
                Some(flush) => run(flush).map(|_| true),
            }
        }
    }
}

/// Removes every holdfast jump and chain from the netns, one transaction per family.
/// Idempotent: returns `false` when there was nothing to remove. An IPv6 table that cannot be
/// listed or changed is logged and skipped (what could not be listed cannot hold anything for
/// us; a rule left there passes packets, `--queue-bypass`, once the queue is closed).
///
/// Both families are cleared whatever `spec.ipv6` says: IPv6 rules go in while a pod's IPs are
/// not known yet, and a successor (or this agent, once the IPs are in the status) may hold a
/// spec for an IPv4-only pod. Removing with that spec left the IPv6 rules behind (the chaos soak
/// found them in running pods after agent restarts).
pub(crate) fn remove(netns: &PodNetns, spec: &RuleSpec) -> Result<bool> {
    remove_families(netns, spec, &[Family::V4, Family::V6])
}

fn remove_families(netns: &PodNetns, spec: &RuleSpec, families: &[Family]) -> Result<bool> {
    let mut removed = false;
    for &family in families {
        let result = find_family(netns, spec, family)
            .and_then(|existing| remove_found(netns, spec, family, &existing));
        match (family, result) {
            (_, Ok(r)) => removed |= r,
            (_, Err(e)) if e.over_bound().is_some() => return Err(e),
            (Family::V6, Err(error)) if spec.ipv6 => {
                tracing::warn!(netns = ?netns.id(), %error, "cannot remove IPv6 hold rules")
            }
            // Not asked for: a node without ip6tables has nothing there to remove.
            (Family::V6, Err(error)) => {
                tracing::debug!(netns = ?netns.id(), %error, "cannot list IPv6 hold rules")
            }
            (Family::V4, Err(e)) => return Err(e),
        }
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

    /// The hold's start is written as a marker rule without a target and read back from the
    /// listing, so a successor counts the deadline from it (issue 28); a listing without one
    /// (an older agent's hold) reads `None`.
    #[test]
    fn the_holds_start_is_kept_in_a_marker_rule() {
        let spec = RuleSpec {
            since: Some(1_795_327_237_458),
            ..RuleSpec::default()
        };
        let script = install_script(&spec, Family::V4, &FoundHold::default());
        assert!(
            script
                .contains("-A HOLDFAST_OUT -m comment --comment holdfast-since-ms=1795327237458\n"),
            "{script}"
        );
        // Unquoted (iptables-nft 1.8.9 quotes it for the `=`: below, and `hold_queue.rs`).
        let listed = format!(
            "{LISTED}-A HOLDFAST_OUT -m comment --comment holdfast-since-ms=1795327237458\n"
        );
        let found = parse_found(&listed);
        assert_eq!(found.since, Some(1_795_327_237_458));
        assert!(found.is_active());
        assert_eq!(found.queue_rules, 1 + 1, "the marker is not a queue rule");
        assert_eq!(parse_found(LISTED).since, None);
        // Quoted as iptables prints it, or forged twice: the earliest counts; garbage is ignored.
        let two = format!(
            "{listed}-A HOLDFAST_IN -m comment --comment \"holdfast-since-ms=1795327000000\"\n\
             -A HOLDFAST_IN -m comment --comment holdfast-since-ms=soon\n"
        );
        assert_eq!(parse_found(&two).since, Some(1_795_327_000_000));
        // Without a start, no marker.
        let plain = install_script(&RuleSpec::default(), Family::V4, &FoundHold::default());
        assert!(!plain.contains(SINCE_PREFIX), "{plain}");
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
    fn installed_removal_script_undoes_the_install() {
        assert_eq!(
            installed_removal_script(),
            "*filter\n\
             -D OUTPUT -m comment --comment holdfast -j HOLDFAST_OUT\n\
             -D INPUT -m comment --comment holdfast -j HOLDFAST_IN\n\
             -F HOLDFAST_OUT\n-X HOLDFAST_OUT\n-F HOLDFAST_IN\n-X HOLDFAST_IN\n\
             COMMIT\n"
        );
    }

    #[test]
    fn remove_script_deletes_the_jumps_then_the_chains() {
        let script = remove_script(&parse_found(LISTED)).expect("something to remove");
        assert_eq!(
            script,
            "*filter\n\
             -D OUTPUT -m comment --comment holdfast -j HOLDFAST_OUT\n\
             -D INPUT -m comment --comment holdfast -j HOLDFAST_IN\n\
             -F HOLDFAST_OUT\n-X HOLDFAST_OUT\n-F HOLDFAST_IN\n-X HOLDFAST_IN\n\
             COMMIT\n"
        );
        assert_eq!(
            flush_script(&parse_found(LISTED)).as_deref(),
            Some("*filter\n-F HOLDFAST_OUT\n-F HOLDFAST_IN\nCOMMIT\n")
        );
    }

    /// Issue 29: the probe that comes before any listing changes nothing, and tells "nothing of
    /// holdfast's", "remembered over its bounds" and "list" apart from iptables-restore's own
    /// words (as iptables-nft 1.8.9 printed them here).
    #[test]
    fn the_probe_tells_nothing_remembered_and_list_apart() {
        assert_eq!(
            probe_script(),
            "*filter\n-N HOLDFAST_BOUND\n-X HOLDFAST_BOUND\n-N HOLDFAST_OUT\n-X HOLDFAST_OUT\n\
             -N HOLDFAST_IN\n-X HOLDFAST_IN\nCOMMIT\n"
        );
        assert_eq!(parse_probe(true, ""), Probe::Nothing);
        assert_eq!(
            parse_probe(
                false,
                "iptables-restore: line 2 failed: Chain already exists.\n"
            ),
            Probe::Remembered
        );
        assert_eq!(
            parse_probe(
                false,
                "iptables-restore: line 4 failed: Chain already exists.\n"
            ),
            Probe::List
        );
        assert_eq!(
            parse_probe(false, "iptables-restore: line 12 failed\n"),
            Probe::List
        );
        assert_eq!(
            parse_probe(false, "Another app is currently holding the xtables lock."),
            Probe::List
        );
        let disarm = disarm_script(1_795_327_237_458);
        assert_eq!(
            disarm,
            "*filter\n:HOLDFAST_OUT - [0:0]\n:HOLDFAST_IN - [0:0]\n:HOLDFAST_BOUND - [0:0]\n\
             -A HOLDFAST_BOUND -m comment --comment holdfast-over-bound-ms=1795327237458\nCOMMIT\n"
        );
    }

    /// Issue 29: the removal script carries none of the pod's rule text: only holdfast's own
    /// jumps (as holdfast writes them) and chains; a jump the pod wrote, with a crafted comment
    /// or from a chain whose name iptables would not take, is not in it (it keeps the chain
    /// referenced, and the chains are then emptied instead: `flush_script`).
    #[test]
    fn remove_script_never_carries_the_pods_rule_text() {
        let listed = "-P OUTPUT ACCEPT
-N HOLDFAST_OUT
-A OUTPUT -p udp -j ACCEPT
-A OUTPUT -m comment --comment \"x\\\" -j ACCEPT COMMIT *nat\" -j HOLDFAST_OUT
-A OUTPUT -p tcp -j RETURN
-A OUTPUT -m comment --comment holdfast -j HOLDFAST_OUT
-A weird;chain -j HOLDFAST_OUT
-A HOLDFAST_OUT -p tcp -j NFQUEUE --queue-num 15015 --queue-bypass
";
        let found = parse_found(listed);
        assert_eq!(found.jumps.len(), 3);
        let script = remove_script(&found).expect("something to remove");
        assert_eq!(
            script,
            "*filter\n-D OUTPUT -m comment --comment holdfast -j HOLDFAST_OUT\n\
             -F HOLDFAST_OUT\n-X HOLDFAST_OUT\nCOMMIT\n"
        );
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
        assert!(!v6.contains("127.0.0.1"), "{v6}");
        assert_eq!(outbound_only.len(), 1);
        // No DNS rule unless asked for.
        assert!(!fresh.contains("-p udp"), "{fresh}");
    }

    #[test]
    fn dns_rules_queue_the_apps_redirected_queries_in_both_families() {
        let spec = RuleSpec {
            dns_port: Some(15053),
            ipv6: true,
            ..RuleSpec::default()
        };
        for (family, loopback) in [(Family::V4, "127.0.0.1/32"), (Family::V6, "::1/128")] {
            let rules: Vec<String> = hold_rules(&spec, family)
                .into_iter()
                .map(|r| r.join(" "))
                .collect();
            assert_eq!(rules.len(), 4, "{rules:#?}");
            let udp = format!("-A HOLDFAST_OUT -p udp -d {loopback} --dport 15053 -m owner ! --uid-owner 1337 -m comment --comment holdfast -j NFQUEUE --queue-num 15015 --queue-bypass");
            let tcp = format!("-A HOLDFAST_OUT -p tcp --syn -d {loopback} --dport 15053 -m owner ! --uid-owner 1337 -m comment --comment holdfast -j NFQUEUE --queue-num 15015 --queue-bypass");
            assert!(rules.contains(&udp), "{rules:#?}");
            assert!(rules.contains(&tcp), "{rules:#?}");
        }
        assert_eq!(spec.families(), [Family::V4, Family::V6]);
        assert_eq!(RuleSpec::default().families(), [Family::V4]);
    }

    #[test]
    fn parses_listed_dns_rule() {
        // As printed by iptables-nft 1.8.9 for the DNS rules above.
        let listed = format!("{LISTED}-A HOLDFAST_OUT -d 127.0.0.1/32 -p udp -m udp --dport 15053 -m owner ! --uid-owner 1337 -m comment --comment holdfast -j NFQUEUE --queue-num 15015 --queue-bypass\n");
        let found = parse_found(&listed);
        assert_eq!(found.queue_rules, 3);
        assert!(found.is_active());
    }

    #[test]
    fn nothing_found_covers_every_family() {
        let spec = RuleSpec {
            ipv6: true,
            ..RuleSpec::default()
        };
        let none = FoundPerFamily::nothing(&spec);
        assert_eq!(none.families.len(), 2);
        assert_eq!(merge(&none), FoundHold::default());
    }
}
