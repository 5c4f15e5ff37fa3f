//! `sock_diag` in a real network namespace: the netlink socket is made inside a test netns once
//! and then queried from the test's own thread (no setns per query), and sees exactly that
//! namespace's listeners: IPv4, IPv6 `::1` and `::`, UDP, and not a closed one. The `#[ignore]`d
//! `timing` test compares its cost with reading `/proc/thread-self/net/tcp{,6}` (the old way).

mod support;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::Instant;

use anyhow::{ensure, Result};
use holdfast::effects::procfs::sock_diag::SockDiag;
use support::{privileged, TestNetns};

/// Binds inside the netns (sockets keep the namespace they were made in).
fn tcp_in(t: &TestNetns, addr: &str) -> Result<TcpListener> {
    let addr: SocketAddr = addr.parse()?;
    Ok(t.ns.run(move || TcpListener::bind(addr))??)
}

fn udp_in(t: &TestNetns, addr: &str) -> Result<UdpSocket> {
    let addr: SocketAddr = addr.parse()?;
    Ok(t.ns.run(move || UdpSocket::bind(addr))??)
}

#[test]
fn listeners_in_a_netns_are_seen_and_closed_ones_are_not() -> Result<()> {
    if !privileged("listeners_in_a_netns_are_seen_and_closed_ones_are_not") {
        return Ok(());
    }
    let t = TestNetns::new("hf-diag")?;
    let diag = SockDiag::open_in(&t.ns)?;
    ensure!(
        diag.tcp_listening_ports()?.is_empty(),
        "a fresh netns has no listener"
    );

    let v4 = tcp_in(&t, "127.0.0.1:15001")?;
    let v6_loopback = tcp_in(&t, "[::1]:15006")?;
    let v6_any = tcp_in(&t, "[::]:15021")?;
    let dns_udp = udp_in(&t, "127.0.0.1:15053")?;
    let dns_udp6 = udp_in(&t, "[::1]:15054")?;
    // A listener in the host's netns on the same port must not count.
    let host = TcpListener::bind("127.0.0.1:0")?;
    let host_port = host.local_addr()?.port();

    let ports = diag.tcp_listening_ports()?;
    for port in [15001, 15006, 15021] {
        ensure!(ports.contains(&port), "{port} not in {ports:?}");
    }
    ensure!(
        !ports.contains(&host_port),
        "the host's listener leaked: {ports:?}"
    );
    ensure!(
        !ports.contains(&15053),
        "a UDP socket is not a TCP listener: {ports:?}"
    );
    let udp = diag.udp_bound_ports()?;
    ensure!(udp.contains(&15053) && udp.contains(&15054), "udp {udp:?}");
    ensure!(!udp.contains(&15001), "udp {udp:?}");
    let sockets = diag.sockets(holdfast::effects::procfs::sock_diag::Kind::TcpListen)?;
    ensure!(
        sockets
            .iter()
            .any(|s| s.port == 15006 && s.local == std::net::Ipv6Addr::LOCALHOST),
        "{sockets:?}"
    );

    drop(v4);
    drop(dns_udp);
    let ports = diag.tcp_listening_ports()?;
    ensure!(
        !ports.contains(&15001) && ports.contains(&15006),
        "{ports:?}"
    );
    ensure!(!diag.udp_bound_ports()?.contains(&15053));
    drop((v6_loopback, v6_any, dns_udp6));
    ensure!(diag.tcp_listening_ports()?.is_empty());
    Ok(())
}

/// CPU time of the calling thread (`/proc/thread-self/schedstat`: nanoseconds on CPU first).
fn thread_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(f64::NAN, |ns| ns as f64 / 1e9)
}

#[test]
#[ignore = "timing: prints the cost of one query, sock_diag vs procfs"]
fn timing() -> Result<()> {
    if !privileged("timing") {
        return Ok(());
    }
    let t = TestNetns::new("hf-diagt")?;
    let _l = [
        tcp_in(&t, "127.0.0.1:15001")?,
        tcp_in(&t, "[::]:15006")?,
        tcp_in(&t, "127.0.0.1:15000")?,
    ];
    let diag = SockDiag::open_in(&t.ns)?;
    let rounds = 2000;
    let cpu = thread_cpu_seconds;
    let (wall, cpu0) = (Instant::now(), cpu());
    for _ in 0..rounds {
        let ports = diag.tcp_listening_ports()?;
        ensure!(ports.contains(&15001) && ports.contains(&15006));
    }
    let diag_wall = wall.elapsed().as_secs_f64() / rounds as f64;
    let diag_cpu = (cpu() - cpu0) / rounds as f64;
    let (wall, cpu0) = (Instant::now(), cpu());
    for _ in 0..rounds {
        ensure!(diag.udp_bound_ports()?.is_empty());
    }
    let udp_wall = wall.elapsed().as_secs_f64() / rounds as f64;
    let udp_cpu = (cpu() - cpu0) / rounds as f64;

    // The old way, with the netns entered once (not counting the thread per read it also cost).
    let procfs_rounds = 50;
    let per_read = t.ns.run(move || -> Result<(f64, f64)> {
        let cpu_thread = thread_cpu_seconds;
        let (wall, cpu0) = (Instant::now(), cpu_thread());
        for _ in 0..procfs_rounds {
            let v4 = std::fs::read("/proc/thread-self/net/tcp")?;
            let v6 = std::fs::read("/proc/thread-self/net/tcp6")?;
            ensure!(!v4.is_empty() && !v6.is_empty());
        }
        Ok((
            wall.elapsed().as_secs_f64() / procfs_rounds as f64,
            (cpu_thread() - cpu0) / procfs_rounds as f64,
        ))
    })??;
    println!(
        "sock_diag TCP LISTEN (v4+v6): {:.1} µs wall, {:.1} µs CPU per query ({rounds} rounds)",
        diag_wall * 1e6,
        diag_cpu * 1e6
    );
    println!(
        "sock_diag UDP bound (v4+v6):  {:.1} µs wall, {:.1} µs CPU per query",
        udp_wall * 1e6,
        udp_cpu * 1e6
    );
    println!(
        "procfs net/tcp + net/tcp6:    {:.1} µs wall, {:.1} µs CPU per read ({procfs_rounds} rounds)",
        per_read.0 * 1e6,
        per_read.1 * 1e6
    );
    Ok(())
}
