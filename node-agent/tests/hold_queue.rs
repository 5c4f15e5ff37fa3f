//! The startup hold against the real kernel: a test-made network namespace, real iptables rules
//! and a real NFQUEUE. No Envoy: a plain TcpListener stands in for Envoy's capture listener and is
//! opened late, as Envoy's would be.
//!
//! Needs root (netns, iptables, NFQUEUE). Skips with a message when not root, fails under CI.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use holdfast::hold::{HoldConfig, HoldQueue};

mod support;
use support::{privileged, run, TestNetns};

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
        t.ns.run(|| holdfast::hold::queue::kernel_queue_waiting(15015))?;
    ensure!(waiting == Some(1), "kernel queue shows {waiting:?} waiting");

    // Envoy's listener comes up late (seen through the netns's TCP table); then release.
    let listening = holdfast::procfs_pods::sockets::listening_ports_in_netns(&t.ns)?;
    ensure!(
        !listening.contains(&15001),
        "15001 listening early: {listening:?}"
    );
    let _stop = accept_all(t.listen(envoy_outbound())?);
    let listening = holdfast::procfs_pods::sockets::listening_ports_in_netns(&t.ns)?;
    ensure!(
        listening.contains(&15001),
        "15001 not listening: {listening:?}"
    );
    let released_at = Instant::now();
    let report = hold.release()?;
    let (result, connected_at) = client
        .join()
        .map_err(|_| anyhow::anyhow!("client panicked"))?;
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
        let (result, at) = client
            .join()
            .map_err(|_| anyhow::anyhow!("client panicked"))?;
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
    let spammer = std::thread::spawn(move || {
        ns.run(|| {
            let mut attempts = 0u64;
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                attempts += 1;
                // Refused at once until the hold is in place; then held until released.
                if TcpStream::connect_timeout(&envoy_outbound(), Duration::from_secs(5)).is_ok() {
                    break;
                }
            }
            attempts
        })
    });
    std::thread::sleep(Duration::from_millis(50));
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    wait_until("a SYN to be held", Duration::from_secs(3), || {
        hold.held().packets >= 1
    })?;
    std::thread::sleep(Duration::from_millis(50));
    let counted_by_rule = t.outbound_rule_packets()?;
    let held = hold.held().packets;
    println!("rule counted {counted_by_rule} SYNs, queue held {held}");
    ensure!(
        counted_by_rule == held,
        "rule counted {counted_by_rule} SYNs but the queue saw {held}: a SYN bypassed"
    );

    let _stop = accept_all(t.listen(envoy_outbound())?);
    hold.release()?;
    let attempts = spammer
        .join()
        .map_err(|_| anyhow::anyhow!("spammer panicked"))??;
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
    let cfg = HoldConfig {
        rules: holdfast::hold::RuleSpec {
            queue_num: 4242,
            ..Default::default()
        },
        ..Default::default()
    };
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
    let (result, _) = client
        .join()
        .map_err(|_| anyhow::anyhow!("client panicked"))?;
    result.context("connect after adopted release")?;
    println!("adopted release report: {report:?}");
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
            "link",
            "add",
            "hf-hp0",
            "netns",
            "hf-hold-pod",
            "type",
            "veth",
            "peer",
            "name",
            "hf-hp1",
            "netns",
            "hf-hold-peer",
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
    out_client
        .join()
        .map_err(|_| anyhow::anyhow!("panicked"))?
        .0
        .context("outbound connect")?;
    in_client
        .join()
        .map_err(|_| anyhow::anyhow!("panicked"))?
        .0
        .context("inbound connect")?;
    println!("redirected outbound + veth inbound released: {report:?}");
    ensure!(report.stats.connections == 2, "report: {report:?}");
    pod.assert_no_hold()
}

#[test]
fn ipv6_hold_then_release() -> Result<()> {
    if !privileged("ipv6_hold_then_release") {
        return Ok(());
    }
    let t = TestNetns::new("hf-hold-v6")?;
    let cfg = HoldConfig {
        rules: holdfast::hold::RuleSpec {
            ipv6: true,
            ..Default::default()
        },
        ..Default::default()
    };
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
        let (result, _) = client
            .join()
            .map_err(|_| anyhow::anyhow!("client panicked"))?;
        result.context("connect after release")?;
    }
    ensure!(report.stats.connections == 2, "report: {report:?}");
    let listing6 =
        t.ns.run_command("ip6tables", &["-S".to_string()], None)?
            .stdout;
    ensure!(
        !listing6.contains("HOLDFAST"),
        "ip6tables rules left:\n{listing6}"
    );
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
        let (result, _) = client
            .join()
            .map_err(|_| anyhow::anyhow!("client panicked"))?;
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
    let cfg = HoldConfig {
        rules: holdfast::hold::RuleSpec {
            iptables: "/nonexistent/iptables".to_string(),
            ..Default::default()
        },
        ..Default::default()
    };
    let err = HoldQueue::start(&t.ns, &cfg).expect_err("start without iptables");
    println!("start error: {err}");
    ensure!(err.to_string().contains("/nonexistent/iptables"), "{err}");
    ensure!(err.kind() == "rules", "kind {}", err.kind());
    // The queue was closed again: a fresh hold can bind the same queue number.
    let hold = HoldQueue::start(&t.ns, &HoldConfig::default())?;
    hold.release()?;
    t.assert_no_hold()
}
