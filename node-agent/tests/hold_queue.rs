//! The startup hold against the real kernel: a test-made network namespace, real iptables rules
//! and a real NFQUEUE. No Envoy: a plain TcpListener stands in for Envoy's capture listener and is
//! opened late, as Envoy's would be.
//!
//! Needs root (netns, iptables, NFQUEUE). Skips with a message when not root, fails under CI.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use holdfast::effects::hold::{HoldConfig, HoldQueue, RuleSpec};

mod support;
use support::{joined, privileged, run, TestNetns};

/// The default hold with these rules.
fn with_rules(rules: RuleSpec) -> HoldConfig {
    HoldConfig {
        rules,
        ..Default::default()
    }
}

fn envoy_outbound() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 15001))
}

/// Accepts connections forever on a background thread (until the listener errors).
fn accept_all(listener: TcpListener) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        while !flag.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => kept.push(stream),
                Err(_) => break,
            }
        }
    });
    stop
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        ensure!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

#[test]
fn hold_then_release_connects() -> Result<()> {
    if !privileged("hold_then_release_connects") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-rel")?;
    let cfg = HoldConfig::default();
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    ensure!(
        HoldQueue::find(&t.ns, &cfg)?.is_active(),
        "no hold found after start"
    );

    let client = t.connect_bg(envoy_outbound(), Duration::from_secs(10))?;
    wait_until("the SYN to be held", Duration::from_secs(3), || {
        hold.held().packets >= 1
    })?;
    std::thread::sleep(Duration::from_millis(100));
    ensure!(
        !client.is_finished(),
        "connect finished while held: {:?}",
        client.join().ok().map(|r| r.0)
    );

    // The kernel agrees: one packet waits in this netns's queue.
    let waiting =
        t.ns.run(|| holdfast::effects::hold::nfqueue::kernel_queue_waiting(15015))?;
    ensure!(waiting == Some(1), "kernel queue shows {waiting:?} waiting");

    // Envoy's listener comes up late (seen through the netns's TCP table); then release.
    let listening = holdfast::effects::procfs::sockets::listening_ports_in_netns(&t.ns)?;
    ensure!(
        !listening.contains(&15001),
        "15001 listening early: {listening:?}"
    );
    let _stop = accept_all(t.listen(envoy_outbound())?);
    let listening = holdfast::effects::procfs::sockets::listening_ports_in_netns(&t.ns)?;
    ensure!(
        listening.contains(&15001),
        "15001 not listening: {listening:?}"
    );
    let released_at = Instant::now();
    let report = hold.release()?;
    let (result, connected_at) = joined(client)?;
    let stream = result.context("connect after release")?;
    let latency = connected_at.saturating_duration_since(released_at);
    println!(
        "release -> connected: {latency:?} (release took {:?}, held {:?}, report {report:?})",
        report.took, report.longest_wait
    );
    ensure!(stream.peer_addr()? == envoy_outbound());
    ensure!(report.stats.connections == 1, "report: {report:?}");
    ensure!(
        report.rules_removed && report.left_waiting == 0,
        "report: {report:?}"
    );
    ensure!(
        latency < Duration::from_millis(900),
        "release took {latency:?}: SYN retransmit, not release"
    );
    t.assert_no_hold()
}

#[test]
fn many_connections_all_complete() -> Result<()> {
    if !privileged("many_connections_all_complete") {
        return Ok(());
    }
    const N: u64 = 200;
    let t = TestNetns::new("hf-hold-many")?;
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    let clients: Vec<_> = (0..N)
        .map(|_| t.connect_bg(envoy_outbound(), Duration::from_secs(15)))
        .collect::<Result<_>>()?;
    wait_until("all SYNs held", Duration::from_secs(5), || {
        hold.held().connections >= N
    })?;
    ensure!(
        clients.iter().all(|c| !c.is_finished()),
        "a connect finished while held"
    );

    let _stop = accept_all(t.listen(envoy_outbound())?);
    let released_at = Instant::now();
    let report = hold.release()?;
    let mut refused = 0;
    let mut slowest = Duration::ZERO;
    for client in clients {
        let (result, at) = joined(client)?;
        match result {
            Ok(_) => slowest = slowest.max(at.saturating_duration_since(released_at)),
            Err(e) => {
                eprintln!("connect failed: {e}");
                refused += 1;
            }
        }
    }
    println!(
        "{N} held connections: slowest connected {slowest:?} after release; report {report:?}"
    );
    ensure!(refused == 0, "{refused} of {N} connections failed");
    ensure!(report.stats.connections == N, "report: {report:?}");
    t.assert_no_hold()
}

#[test]
fn queue_is_bound_before_the_rule() -> Result<()> {
    if !privileged("queue_is_bound_before_the_rule") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-order")?;
    // Connect in a tight loop while the hold starts: every SYN that hits the rule must reach the
    // queue (the rule's kernel counter equals what the queue saw). A bypassed SYN would be
    // counted by the rule but never queued.
    let ns = t.ns.try_clone()?;
    let tries = Arc::new(AtomicU64::new(0));
    let spammer = std::thread::spawn({
        let tries = tries.clone();
        move || {
            ns.run(move || {
                let mut attempts = 0u64;
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    attempts += 1;
                    tries.store(attempts, Ordering::SeqCst);
                    // Refused at once until the hold is in place; then held until released.
                    if TcpStream::connect_timeout(&envoy_outbound(), Duration::from_secs(5)).is_ok()
                    {
                        break;
                    }
                }
                attempts
            })
        }
    });
    // The loop is refused a few times before the hold goes in.
    wait_until(
        "connects refused before the hold",
        Duration::from_secs(3),
        || tries.load(Ordering::SeqCst) >= 3,
    )?;
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    wait_until("a SYN to be held", Duration::from_secs(3), || {
        hold.held().packets >= 1
    })?;
    // Every SYN the rule counted reaches the queue: the queue's count catches up with the rule's
    // (SYN retransmissions of the held connect count on both). A bypassed SYN would leave the
    // rule ahead for good, and the wait times out.
    let mut counts = (0, 0);
    wait_until(
        "the queue to see every SYN the rule counted",
        Duration::from_secs(3),
        || {
            counts = (t.outbound_rule_packets().unwrap_or(0), hold.held().packets);
            counts.0 == counts.1
        },
    )
    .with_context(|| format!("rule counted {} SYNs, the queue saw {}", counts.0, counts.1))?;
    println!("rule counted {} SYNs, queue held {}", counts.0, counts.1);

    let _stop = accept_all(t.listen(envoy_outbound())?);
    hold.release()?;
    let attempts = joined(spammer)??;
    println!("connect attempts before the hold caught one: {attempts}");
    ensure!(
        attempts > 1,
        "the loop never ran before the hold (attempts {attempts})"
    );
    t.assert_no_hold()
}

#[test]
fn release_when_rule_already_gone_and_remove_leftover() -> Result<()> {
    if !privileged("release_when_rule_already_gone") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-gone")?;
    let cfg = HoldConfig::default();
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    ensure!(
        HoldQueue::remove_leftover(&t.ns, &cfg)?,
        "remove_leftover found nothing"
    );
    ensure!(
        !HoldQueue::remove_leftover(&t.ns, &cfg)?,
        "second remove_leftover removed something"
    );
    let report = hold.release()?;
    ensure!(!report.rules_removed, "report: {report:?}");
    t.assert_no_hold()?;

    // A hold dropped without release leaves its rules; remove_leftover clears them.
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    drop(hold);
    ensure!(
        HoldQueue::find(&t.ns, &cfg)?.is_active(),
        "rules gone after drop"
    );
    ensure!(HoldQueue::remove_leftover(&t.ns, &cfg)?);
    ensure!(!HoldQueue::find(&t.ns, &cfg)?.is_active());
    t.assert_no_hold()
}

#[test]
fn adopt_after_agent_restart() -> Result<()> {
    if !privileged("adopt_after_agent_restart") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-adopt")?;
    let cfg = with_rules(RuleSpec {
        queue_num: 4242,
        ..Default::default()
    });
    ensure!(
        HoldQueue::adopt(&t.ns, &cfg)?.is_none(),
        "adopted a hold that does not exist"
    );
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    let client = t.connect_bg(envoy_outbound(), Duration::from_secs(10))?;
    wait_until("the SYN to be held", Duration::from_secs(3), || {
        hold.held().packets >= 1
    })?;
    // The agent dies: the queue closes, the held SYN is dropped, the rules stay.
    drop(hold);
    let found = HoldQueue::find(&t.ns, &HoldConfig::default())?;
    ensure!(
        found.is_active() && found.queue_num == Some(4242),
        "found: {found:?}"
    );

    // The new agent uses the default queue number but adopts the one in the rules.
    let adopted = HoldQueue::adopt(&t.ns, &HoldConfig::default())?.context("nothing adopted")?;
    ensure!(adopted.queue_num() == 4242);
    // TCP retransmits the dropped SYN (~1 s); the adopted queue holds it.
    wait_until(
        "the retransmitted SYN to be held",
        Duration::from_secs(4),
        || adopted.held().packets >= 1,
    )?;
    ensure!(!client.is_finished(), "connect finished while held");
    let _stop = accept_all(t.listen(envoy_outbound())?);
    let report = adopted.release()?;
    let (result, _) = joined(client)?;
    result.context("connect after adopted release")?;
    println!("adopted release report: {report:?}");
    t.assert_no_hold()
}

/// Issue 28: the hold's start survives the agent: it is written into the hold's chain (a
/// marker rule without a target) and an adopting agent reads it back, so the deadline counts
/// from the first agent's install, not each successor's. Real iptables: the marker as
/// iptables prints it, and the release leaves nothing.
#[test]
fn adopt_keeps_the_holds_start() -> Result<()> {
    if !privileged("adopt_keeps_the_holds_start") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-since")?;
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    let since = hold.since();
    let listing = t.iptables(&["-S", "HOLDFAST_OUT"])?;
    ensure!(
        listing.contains("--comment \"holdfast-since-ms="),
        "no start marker:\n{listing}"
    );
    drop(hold);
    std::thread::sleep(Duration::from_millis(2100));
    let adopted = HoldQueue::adopt(&t.ns, &HoldConfig::default())?.context("nothing adopted")?;
    ensure!(
        adopted.since() == since,
        "adopted start {:?}, installed {:?}",
        adopted.since(),
        since
    );
    let age = std::time::SystemTime::now().duration_since(adopted.since())?;
    ensure!(age >= Duration::from_secs(1), "age {age:?}");
    // A second adoption (the refreshed rules keep the marker).
    drop(adopted);
    let again = HoldQueue::adopt(&t.ns, &HoldConfig::default())?.context("nothing adopted")?;
    ensure!(
        again.since() == since,
        "lost on refresh: {:?}",
        again.since()
    );
    again.release()?;
    t.assert_no_hold()
}

#[test]
fn proxy_uid_is_not_held() -> Result<()> {
    if !privileged("proxy_uid_is_not_held") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-owner")?;
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    // A child process forked inside the netns, as a given uid, connecting to 15001 where nothing
    // listens: refused at once if not held, killed by `timeout` if held.
    let attempt = |uid: u32| -> Result<(std::process::Output, Duration)> {
        let started = Instant::now();
        let out = t.ns.run(move || {
            Command::new("timeout")
                .args(["2", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/15001"])
                .uid(uid)
                .gid(uid)
                .output()
        })??;
        Ok((out, started.elapsed()))
    };
    let (proxy, proxy_took) = attempt(1337)?;
    ensure!(hold.held().packets == 0, "the proxy's SYN was held");
    ensure!(proxy.status.code() == Some(1), "proxy connect: {proxy:?}");
    ensure!(
        String::from_utf8_lossy(&proxy.stderr).contains("refused"),
        "proxy connect: {proxy:?}"
    );
    ensure!(
        proxy_took < Duration::from_secs(1),
        "proxy connect took {proxy_took:?}"
    );

    let (app, app_took) = attempt(1000)?;
    println!(
        "uid 1337: refused after {proxy_took:?}; uid 1000: {:?} after {app_took:?}",
        app.status
    );
    ensure!(
        app.status.code() == Some(124),
        "app connect was not held: {app:?}"
    );
    ensure!(hold.held().packets >= 1, "app SYN not counted");
    hold.release()?;
    t.assert_no_hold()
}

#[test]
fn outbound_through_istio_redirect_and_inbound_over_veth() -> Result<()> {
    if !privileged("outbound_through_istio_redirect") {
        return Ok(());
    }
    // pod netns with a veth to a peer netns, Istio-like nat rules in the pod.
    let pod = TestNetns::new("hf-hold-pod")?;
    let peer = TestNetns::new("hf-hold-peer")?;
    let _ = run("ip", &["link", "del", "hf-hp0"]);
    run(
        "ip",
        &[
            "link", "add", "hf-hp0", "netns", &pod.name, "type", "veth", "peer", "name", "hf-hp1",
            "netns", &peer.name,
        ],
    )?;
    pod.ip(&["addr", "add", "198.18.0.2/24", "dev", "hf-hp0"])?;
    pod.ip(&["link", "set", "hf-hp0", "up"])?;
    peer.ip(&["addr", "add", "198.18.0.1/24", "dev", "hf-hp1"])?;
    peer.ip(&["link", "set", "hf-hp1", "up"])?;
    pod.iptables(&[
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "tcp",
        "-d",
        "198.18.0.1",
        "-m",
        "owner",
        "!",
        "--uid-owner",
        "1337",
        "-j",
        "REDIRECT",
        "--to-ports",
        "15001",
    ])?;
    pod.iptables(&[
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-p",
        "tcp",
        "-i",
        "hf-hp0",
        "-j",
        "REDIRECT",
        "--to-ports",
        "15006",
    ])?;

    let hold = HoldQueue::start(&pod.ns, &HoldConfig::default())?;
    let out_client = pod.connect_bg(
        SocketAddr::from(([198, 18, 0, 1], 80)),
        Duration::from_secs(10),
    )?;
    let in_client = peer.connect_bg(
        SocketAddr::from(([198, 18, 0, 2], 8080)),
        Duration::from_secs(10),
    )?;
    wait_until("both SYNs held", Duration::from_secs(3), || {
        hold.held().connections >= 2
    })?;
    ensure!(
        !out_client.is_finished() && !in_client.is_finished(),
        "a connect finished while held"
    );

    let _out = accept_all(pod.listen(envoy_outbound())?);
    let _in = accept_all(pod.listen(SocketAddr::from(([0, 0, 0, 0], 15006)))?);
    let report = hold.release()?;
    joined(out_client)?.0.context("outbound connect")?;
    joined(in_client)?.0.context("inbound connect")?;
    println!("redirected outbound + veth inbound released: {report:?}");
    ensure!(report.stats.connections == 2, "report: {report:?}");
    pod.assert_no_hold()
}

/// A release removes the rules it wrote without listing them first; where the table is not as
/// it wrote it (here a leftover hold under a fresh one: two jumps per chain), that one
/// transaction fails whole and the release reads holdfast's chains and removes everything
/// instead (the jumps one transaction at a time: `iptables -C` says a jump is there, not how
/// many times).
#[test]
fn release_clears_a_table_not_as_installed() -> Result<()> {
    if !privileged("release_clears_a_table_not_as_installed") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-dup")?;
    let cfg = HoldConfig::default();
    drop(HoldQueue::start(&t.ns, &cfg)?);
    let hold = HoldQueue::start_fresh(&t.ns, &cfg)?;
    let jumps = HoldQueue::find(&t.ns, &cfg)?.jumps.len();
    ensure!(jumps == 2, "expected a jump per chain, found {jumps}");
    let report = hold.release()?;
    ensure!(report.rules_removed, "report: {report:?}");
    t.assert_no_hold()
}

/// A hold written with IPv6 rules (the pod's IPs not known yet) is cleared by an agent whose
/// spec is IPv4-only (the IPs arrived: an IPv4-only pod), both as a leftover and after adopting
/// it: no IPv6 rule may stay in the running pod (found by the chaos soak, issue 11).
#[test]
fn ipv6_rules_go_when_the_pod_turns_out_ipv4_only() -> Result<()> {
    if !privileged("ipv6_rules_go_when_the_pod_turns_out_ipv4_only") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-v6gone")?;
    let with_v6 = |ipv6| {
        with_rules(RuleSpec {
            ipv6,
            ..Default::default()
        })
    };
    // The agent dies holding; its successor knows the pod is IPv4-only and finds it ready.
    drop(HoldQueue::start(&t.ns, &with_v6(true))?);
    ensure!(HoldQueue::remove_leftover(&t.ns, &with_v6(false))?);
    t.assert_no_hold()?;
    // ... or finds it still holding, adopts and releases the hold.
    drop(HoldQueue::start(&t.ns, &with_v6(true))?);
    let adopted = HoldQueue::adopt(&t.ns, &with_v6(false))?.context("nothing adopted")?;
    adopted.release()?;
    t.assert_no_hold()
}

#[test]
fn ipv6_hold_then_release() -> Result<()> {
    if !privileged("ipv6_hold_then_release") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-v6")?;
    let cfg = with_rules(RuleSpec {
        ipv6: true,
        ..Default::default()
    });
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    let v6: SocketAddr = "[::1]:15001".parse()?;
    let client6 = t.connect_bg(v6, Duration::from_secs(10))?;
    let client4 = t.connect_bg(envoy_outbound(), Duration::from_secs(10))?;
    wait_until("both SYNs held", Duration::from_secs(3), || {
        hold.held().connections >= 2
    })?;
    ensure!(
        !client6.is_finished() && !client4.is_finished(),
        "a connect finished while held"
    );
    let listener6 = t.ns.run(move || TcpListener::bind(v6))??;
    let _stop6 = accept_all(listener6);
    let _stop4 = accept_all(t.listen(envoy_outbound())?);
    let report = hold.release()?;
    for client in [client6, client4] {
        let (result, _) = joined(client)?;
        result.context("connect after release")?;
    }
    ensure!(report.stats.connections == 2, "report: {report:?}");
    t.assert_no_hold()
}

#[test]
fn overflow_fails_open_not_dropped() -> Result<()> {
    if !privileged("overflow_fails_open_not_dropped") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-ovf")?;
    let cfg = HoldConfig {
        queue_max_len: 5,
        ..Default::default()
    };
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    let clients: Vec<_> = (0..20)
        .map(|_| t.connect_bg(envoy_outbound(), Duration::from_secs(10)))
        .collect::<Result<_>>()?;
    // Past the queue length the kernel accepts (fail-open): those SYNs meet the closed port at
    // once. Dropped SYNs would instead leave their connects blocked in retransmission.
    wait_until(
        "15 overflow connects to finish",
        Duration::from_secs(3),
        || clients.iter().filter(|c| c.is_finished()).count() >= 15,
    )?;
    std::thread::sleep(Duration::from_millis(100));
    let finished = clients.iter().filter(|c| c.is_finished()).count();
    let held = hold.held();
    println!(
        "queue max 5: {finished} of 20 connects passed at once, {} held",
        held.packets
    );
    ensure!(
        finished == 15 && held.packets == 5,
        "finished {finished}, held {held:?}"
    );
    let _stop = accept_all(t.listen(envoy_outbound())?);
    hold.release()?;
    let mut connected = 0;
    for client in clients {
        let (result, _) = joined(client)?;
        if result.is_ok() {
            connected += 1;
        }
    }
    ensure!(
        connected == 5,
        "{connected} held connects succeeded after release, expected 5"
    );
    t.assert_no_hold()
}

#[test]
fn start_fails_cleanly_without_iptables() -> Result<()> {
    if !privileged("start_fails_cleanly_without_iptables") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-bad")?;
    // The first command is `iptables-restore` (the probe before any listing, issue 29).
    let cfg = with_rules(RuleSpec {
        iptables: "/nonexistent/iptables".to_string(),
        iptables_restore: "/nonexistent/iptables-restore".to_string(),
        ..Default::default()
    });
    let err = HoldQueue::start(&t.ns, &cfg).expect_err("start without iptables");
    println!("start error: {err}");
    ensure!(
        err.to_string().contains("/nonexistent/iptables-restore"),
        "{err}"
    );
    ensure!(err.kind() == "rules", "kind {}", err.kind());
    // The queue was closed again: a fresh hold can bind the same queue number.
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    hold.release()?;
    t.assert_no_hold()
}

/// A minimal DNS query (id 0x1234, one A question for `svc.`), enough for a UDP exchange.
const DNS_QUERY: &[u8] =
    b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03svc\x00\x00\x01\x00\x01";

/// Istio-like DNS capture in a test netns: the app's UDP and TCP to a resolver on port 53 are
/// REDIRECTed to 15053 (`SetupDNSRedir` in istio/istio tools/istio-iptables/pkg/capture/run.go,
/// with 127.0.0.53 as the resolv.conf server, as in its `dns-uid-gid.golden`), uid 1337 excluded.
fn istio_dns_capture(t: &TestNetns) -> Result<()> {
    for proto in ["udp", "tcp"] {
        t.iptables(&[
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-m",
            "owner",
            "--uid-owner",
            "1337",
            "-j",
            "RETURN",
        ])?;
        t.iptables(&[
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            proto,
            "--dport",
            "53",
            "-d",
            "127.0.0.53/32",
            "-j",
            "REDIRECT",
            "--to-ports",
            "15053",
        ])?;
    }
    Ok(())
}

/// Sends one query over UDP from inside the netns to the resolver 127.0.0.53:53 and waits up to
/// `timeout` for an answer, on a background thread: the outcome and when it came.
fn dns_query_bg(
    t: &TestNetns,
    timeout: Duration,
) -> Result<std::thread::JoinHandle<(std::io::Result<Vec<u8>>, Instant)>> {
    let socket = t.ns.run(|| -> std::io::Result<std::net::UdpSocket> {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        s.connect("127.0.0.53:53")?;
        Ok(s)
    })??;
    Ok(std::thread::spawn(move || {
        let exchange = || -> std::io::Result<Vec<u8>> {
            socket.set_read_timeout(Some(timeout))?;
            socket.send(DNS_QUERY)?;
            let mut buf = [0u8; 512];
            let n = socket.recv(&mut buf)?;
            Ok(buf[..n].to_vec())
        };
        let r = exchange();
        (r, Instant::now())
    }))
}

#[test]
fn dns_query_is_held_until_released_udp_and_tcp() -> Result<()> {
    if !privileged("dns_query_is_held_until_released_udp_and_tcp") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-dns")?;
    istio_dns_capture(&t)?;

    // Without a hold, pilot-agent's port not yet bound: the query is refused at once (ICMP port
    // unreachable on the connected socket) — what an app's first lookup meets today.
    let sent_unheld = Instant::now();
    let (unheld, at) = dns_query_bg(&t, Duration::from_secs(3))?
        .join()
        .map_err(|_| anyhow::anyhow!("query thread panicked"))?;
    let refused = unheld.expect_err("no DNS server yet");
    println!(
        "unheld query before 15053 listens: {refused} ({:?})",
        at.saturating_duration_since(sent_unheld)
    );
    ensure!(
        refused.kind() == std::io::ErrorKind::ConnectionRefused,
        "expected refused, got {refused}"
    );

    let cfg = with_rules(RuleSpec {
        dns_port: Some(15053),
        ..Default::default()
    });
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    let query = dns_query_bg(&t, Duration::from_secs(10))?;
    let tcp = t.connect_bg(
        SocketAddr::from(([127, 0, 0, 53], 53)),
        Duration::from_secs(10),
    )?;
    wait_until(
        "the UDP query and the TCP SYN held",
        Duration::from_secs(3),
        || hold.held().dns_packets >= 2,
    )?;
    std::thread::sleep(Duration::from_millis(200));
    ensure!(
        !query.is_finished() && !tcp.is_finished(),
        "a DNS exchange finished while held"
    );

    // pilot-agent's DNS proxy comes up: UDP echo and a TCP listener on 127.0.0.1:15053.
    let udp =
        t.ns.run(|| std::net::UdpSocket::bind("127.0.0.1:15053"))??;
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&buf[..n], from);
        }
    });
    let _tcp_dns = accept_all(t.listen(SocketAddr::from(([127, 0, 0, 1], 15053)))?);
    let released_at = Instant::now();
    let report = hold.release()?;
    let (answer, answered_at) = joined(query)?;
    let answer = answer.context("the held query gets its answer after release")?;
    ensure!(answer == DNS_QUERY, "echoed answer differs: {answer:?}");
    joined(tcp)?
        .0
        .context("the held TCP DNS connection completes after release")?;
    let latency = answered_at.saturating_duration_since(released_at);
    println!("held DNS query answered {latency:?} after release; report {report:?}");
    ensure!(report.stats.dns_packets >= 2, "report: {report:?}");
    ensure!(
        latency < Duration::from_millis(500),
        "answer came {latency:?} after release: a retry, not the release"
    );
    t.assert_no_hold()
}

#[test]
fn pass_through_accepts_at_once_then_holds_again() -> Result<()> {
    if !privileged("pass_through_accepts_at_once_then_holds_again") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-pass")?;
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    // Held first (nothing listens on 15001: once let through, a connect is refused at once).
    let held_before = t.connect_bg(envoy_outbound(), Duration::from_secs(10))?;
    wait_until("the SYN to be held", Duration::from_secs(3), || {
        hold.held().packets >= 1
    })?;
    std::thread::sleep(Duration::from_millis(100));
    ensure!(!held_before.is_finished(), "connect finished while held");

    // An init container runs: everything held goes, and new SYNs pass at once.
    let switched_at = Instant::now();
    hold.set_pass_through(true);
    ensure!(hold.pass_through());
    let (result, at) = joined(held_before)?;
    let err = result.expect_err("nothing listens: refused once let through");
    let freed_after = at.saturating_duration_since(switched_at);
    ensure!(
        err.kind() == std::io::ErrorKind::ConnectionRefused,
        "held connect: {err}"
    );
    ensure!(
        freed_after < Duration::from_millis(500),
        "held connect let go {freed_after:?} after pass-through: not at once"
    );
    for _ in 0..5 {
        let started = Instant::now();
        let (result, at) = t
            .connect_bg(envoy_outbound(), Duration::from_secs(5))?
            .join()
            .map_err(|_| anyhow::anyhow!("client panicked"))?;
        let took = at.saturating_duration_since(started);
        ensure!(
            result.as_ref().err().map(|e| e.kind()) == Some(std::io::ErrorKind::ConnectionRefused),
            "connect during pass-through: {result:?}"
        );
        ensure!(
            took < Duration::from_millis(500),
            "connect during pass-through took {took:?}"
        );
    }
    let stats = hold.held();
    println!("pass-through: held connect freed after {freed_after:?}; stats {stats:?}");
    ensure!(stats.passed_through >= 5, "stats: {stats:?}");
    ensure!(
        stats.packets == 1,
        "passed packets counted as held: {stats:?}"
    );

    // The init phase is over: hold again.
    hold.set_pass_through(false);
    let held_after = t.connect_bg(envoy_outbound(), Duration::from_secs(10))?;
    wait_until("the SYN to be held again", Duration::from_secs(3), || {
        hold.held().packets >= 2
    })?;
    std::thread::sleep(Duration::from_millis(300));
    ensure!(
        !held_after.is_finished(),
        "connect after pass-through off was not held"
    );
    let _stop = accept_all(t.listen(envoy_outbound())?);
    hold.release()?;
    joined(held_after)?
        .0
        .context("connect held after pass-through, then released")?;
    t.assert_no_hold()
}

#[test]
fn ipv6_fails_open_without_ip6tables() -> Result<()> {
    if !privileged("ipv6_fails_open_without_ip6tables") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-no6")?;
    let cfg = with_rules(RuleSpec {
        ipv6: true,
        ip6tables: "/nonexistent/ip6tables".to_string(),
        ip6tables_restore: "/nonexistent/ip6tables-restore".to_string(),
        ..Default::default()
    });
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    let problem = hold.ipv6_problem().map(str::to_string);
    println!("IPv6 problem: {problem:?}");
    ensure!(
        problem
            .as_deref()
            .is_some_and(|p| p.contains("/nonexistent/ip6tables")),
        "no clear IPv6 error: {problem:?}"
    );
    // IPv4 is held regardless.
    let client = t.connect_bg(envoy_outbound(), Duration::from_secs(10))?;
    wait_until("the IPv4 SYN to be held", Duration::from_secs(3), || {
        hold.held().packets >= 1
    })?;
    // IPv6 is not held: refused at once, as without an agent.
    let v6: SocketAddr = "[::1]:15001".parse()?;
    let (r6, _) = t
        .connect_bg(v6, Duration::from_secs(3))?
        .join()
        .map_err(|_| anyhow::anyhow!("client panicked"))?;
    ensure!(
        r6.as_ref().err().map(|e| e.kind()) == Some(std::io::ErrorKind::ConnectionRefused),
        "IPv6 connect: {r6:?}"
    );
    ensure!(HoldQueue::find(&t.ns, &cfg)?.is_active());
    let _stop = accept_all(t.listen(envoy_outbound())?);
    hold.release()?;
    joined(client)?.0.context("IPv4 connect after release")?;
    ensure!(!HoldQueue::remove_leftover(&t.ns, &cfg)?);
    t.assert_no_hold()
}

#[test]
fn adopt_brings_rules_up_to_the_pods_shape() -> Result<()> {
    if !privileged("adopt_brings_rules_up_to_the_pods_shape") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-adopt6")?;
    // An earlier agent held IPv4 TCP only, then died.
    drop(HoldQueue::start(&t.ns, &HoldConfig::default())?);
    let cfg = with_rules(RuleSpec {
        ipv6: true,
        dns_port: Some(15053),
        ..Default::default()
    });
    let adopted = HoldQueue::adopt(&t.ns, &cfg)?.context("nothing adopted")?;
    let v4 = t.iptables(&["-S", "HOLDFAST_OUT"])?;
    let v6 =
        t.ns.run_command(
            "ip6tables",
            &["-S".to_string(), "HOLDFAST_OUT".to_string()],
            None,
        )?
        .stdout;
    println!("after adopt:\n{v4}{v6}");
    for (family, listing) in [("v4", &v4), ("v6", &v6)] {
        ensure!(
            listing.contains("-p udp") && listing.contains("--dport 15053"),
            "{family}: no DNS rule after adopt:\n{listing}"
        );
        ensure!(
            listing.contains("--dport 15001"),
            "{family}: no outbound rule after adopt:\n{listing}"
        );
    }
    adopted.release()?;
    t.assert_no_hold()
}

#[test]
fn proxy_uid_dns_is_not_held() -> Result<()> {
    if !privileged("proxy_uid_dns_is_not_held") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-dnsown")?;
    let cfg = with_rules(RuleSpec {
        dns_port: Some(15053),
        ..Default::default()
    });
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    // One UDP datagram to the DNS port from a process of `uid` (bash's /dev/udp).
    let send = |uid: u32| -> Result<std::process::Output> {
        Ok(t.ns.run(move || {
            Command::new("bash")
                .args(["-c", "echo query > /dev/udp/127.0.0.1/15053"])
                .uid(uid)
                .gid(uid)
                .output()
        })??)
    };
    // Positive control first: an app's packet is held.
    let app = send(1000)?;
    ensure!(app.status.success(), "uid 1000 send: {app:?}");
    wait_until("the app's DNS packet held", Duration::from_secs(3), || {
        hold.held().dns_packets >= 1
    })?;
    // Then pilot-agent's, then the app's again. The OUTPUT hook queues a packet in the sender's
    // own send (net/netfilter/nfnetlink_queue.c `nfqnl_enqueue_packet`), and a held packet stays
    // in the queue until its verdict: once the second app send has returned, the kernel's queue
    // holds every packet the rule took, in order. Two (both the app's) means the proxy's passed.
    let proxy = send(1337)?;
    ensure!(proxy.status.success(), "uid 1337 send: {proxy:?}");
    let app = send(1000)?;
    ensure!(app.status.success(), "uid 1000 send: {app:?}");
    let queue_num = cfg.rules.queue_num;
    let queued =
        t.ns.run(move || holdfast::effects::hold::nfqueue::kernel_queue_waiting(queue_num))?;
    ensure!(
        queued == Some(2),
        "the kernel's queue holds {queued:?} packets after two app sends and one of pilot-agent's: \
         the proxy's own DNS packet was held"
    );
    wait_until("both app packets read", Duration::from_secs(3), || {
        hold.held().dns_packets >= 2
    })?;
    println!("DNS by uid: {:?}", hold.held());
    hold.release()?;
    t.assert_no_hold()
}

#[test]
fn ipv6_disabled_in_the_netns_still_holds_ipv4() -> Result<()> {
    if !privileged("ipv6_disabled_in_the_netns_still_holds_ipv4") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-v6off")?;
    run(
        "ip",
        &[
            "netns",
            "exec",
            &t.name,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.lo.disable_ipv6=1",
        ],
    )?;
    let cfg = with_rules(RuleSpec {
        ipv6: true,
        dns_port: Some(15053),
        ..Default::default()
    });
    // ip6tables still works in such a netns: the IPv6 rules go in and can never match.
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    println!(
        "IPv6 disabled in the netns: ipv6_problem {:?}",
        hold.ipv6_problem()
    );
    let client = t.connect_bg(envoy_outbound(), Duration::from_secs(10))?;
    wait_until("the IPv4 SYN to be held", Duration::from_secs(3), || {
        hold.held().packets >= 1
    })?;
    let _stop = accept_all(t.listen(envoy_outbound())?);
    hold.release()?;
    joined(client)?.0.context("IPv4 connect after release")?;
    let v6 =
        t.ns.run_command("ip6tables", &["-S".to_string()], None)?
            .stdout;
    ensure!(!v6.contains("HOLDFAST"), "ip6tables rules left:\n{v6}");
    t.assert_no_hold()
}

#[test]
fn ipv6_dns_query_is_held_until_released() -> Result<()> {
    if !privileged("ipv6_dns_query_is_held_until_released") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-dns6")?;
    // Istio's IPv6 DNS capture for a resolver on ::1 (its goldens use ::127.0.0.53, which a
    // bare test netns cannot route): ip6tables nat REDIRECT of UDP port 53 to 15053.
    let redirect: Vec<String> = [
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "udp",
        "--dport",
        "53",
        "-d",
        "::1/128",
        "-j",
        "REDIRECT",
        "--to-ports",
        "15053",
    ]
    .map(String::from)
    .to_vec();
    let out = t.ns.run_command("ip6tables", &redirect, None)?;
    ensure!(out.status.success(), "ip6tables: {}", out.stderr);
    let cfg = with_rules(RuleSpec {
        ipv6: true,
        dns_port: Some(15053),
        ..Default::default()
    });
    let hold = HoldQueue::start(&t.ns, &cfg)?;
    let socket = t.ns.run(|| -> std::io::Result<std::net::UdpSocket> {
        let s = std::net::UdpSocket::bind("[::1]:0")?;
        s.connect("[::1]:53")?;
        Ok(s)
    })??;
    let query = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
        socket.set_read_timeout(Some(Duration::from_secs(10)))?;
        socket.send(DNS_QUERY)?;
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf)?;
        Ok(buf[..n].to_vec())
    });
    wait_until("the IPv6 query held", Duration::from_secs(3), || {
        hold.held().dns_packets >= 1
    })?;
    std::thread::sleep(Duration::from_millis(200));
    ensure!(!query.is_finished(), "the IPv6 query finished while held");
    let server = t.ns.run(|| std::net::UdpSocket::bind("[::1]:15053"))??;
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = server.recv_from(&mut buf) {
            let _ = server.send_to(&buf[..n], from);
        }
    });
    let report = hold.release()?;
    let answer = joined(query)?.context("the held IPv6 query gets its answer after release")?;
    ensure!(answer == DNS_QUERY, "echoed answer differs");
    println!("IPv6 DNS held and released: {report:?}");
    t.assert_no_hold()
}
