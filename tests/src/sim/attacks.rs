//! What a hostile pod does (issue 25): programs an app container of the simulated node runs in
//! its pod's network namespace, as root with the namespace's `CAP_NET_ADMIN`, to test that one
//! pod cannot blind, crash or steer the agent. `sim-app app --attack NAME` runs one, then idles
//! until SIGTERM like any app.
//!
//! - [`Attack::FakeEnvoy`]: listens on Envoy's admin and capture ports (15000, 15001, 15006),
//!   never reports LIVE, and answers every admin request with a 4 MiB body (chunked, so only a
//!   cap stops a reader).
//! - [`Attack::RuleFlood`]: once holdfast's hold chain exists in its netns, adds a second jump to
//!   it (which breaks the agent's exact removal) and thousands of rules to the `filter` table
//!   (which the agent's fallback listing would print whole).
//! - [`Attack::NetlinkForge`]: reads the agent's NFQUEUE socket's port id from
//!   `/proc/net/netfilter/nfnetlink_queue` in its netns and sends it forged queued-packet
//!   messages as fast as it can.
//! - [`Attack::ForkFlood`]: forks and reaps children as fast as it can, so the node's pids
//!   wrap around (32768 on this machine) within seconds.
//! - [`Attack::Procs`] (issue 29): thousands of processes in the app container, kept until the
//!   app exits, and an app that takes its time to exit after SIGTERM (`--exit-delay-ms`): the
//!   agent's drain watches the app's processes for as long as the grace period lets it.
//!   With `fake_envoy`, the app is the pod's "Envoy" too (15000/15001/15006): it passes the
//!   readiness check (LIVE, workers started, the filter on every worker, 5 lines) and answers
//!   every other admin request — the drain's samples, `/server_info`, the quit — with
//!   [`DRAIN_FAKE_BODY`] bytes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The queue number holdfast binds in every pod (`--queue-num` default).
pub const HOLDFAST_QUEUE: u16 = 15015;

/// One attack, with its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// Admin answers of `body` bytes.
    FakeEnvoy { body: usize },
    /// `rules` rules in the filter table, and a second jump to holdfast's chain.
    RuleFlood { rules: u32 },
    /// Forged queue messages for `for_ms`.
    NetlinkForge { for_ms: u64 },
    /// Fork and reap for `for_ms`.
    ForkFlood { for_ms: u64 },
    /// `count` processes alive until the app exits; the app exits `linger_ms` after SIGTERM;
    /// with `fake_envoy`, a fake Envoy that is ready and answers the drain with ~1 MB.
    Procs {
        count: u32,
        linger_ms: u64,
        fake_envoy: bool,
    },
}

/// What [`Attack::Procs`]'s fake Envoy answers every request but readiness with: ~1 MB (the
/// issue's figure), chunked.
pub const DRAIN_FAKE_BODY: usize = 1_000_000;

impl Attack {
    /// The `sim-app app` flags.
    pub fn args(&self) -> Vec<String> {
        let (name, size) = match *self {
            Attack::FakeEnvoy { body } => ("fake-envoy", body as u64),
            Attack::RuleFlood { rules } => ("rule-flood", u64::from(rules)),
            Attack::NetlinkForge { for_ms } => ("netlink-forge", for_ms),
            Attack::ForkFlood { for_ms } => ("fork-flood", for_ms),
            Attack::Procs {
                count, fake_envoy, ..
            } => (
                if fake_envoy {
                    "procs-fake-envoy"
                } else {
                    "procs"
                },
                u64::from(count),
            ),
        };
        let mut args = vec![
            "--attack".into(),
            name.into(),
            "--attack-size".into(),
            size.to_string(),
        ];
        if let Attack::Procs { linger_ms, .. } = *self {
            args.extend(["--exit-delay-ms".into(), linger_ms.to_string()]);
        }
        args
    }

    /// Parses `--attack NAME --attack-size N` (a `procs` attack's linger is the app's own
    /// `--exit-delay-ms`: 0 here).
    pub fn parse(name: &str, size: u64) -> Result<Attack, String> {
        Ok(match name {
            "fake-envoy" => Attack::FakeEnvoy {
                body: size as usize,
            },
            "rule-flood" => Attack::RuleFlood { rules: size as u32 },
            "netlink-forge" => Attack::NetlinkForge { for_ms: size },
            "fork-flood" => Attack::ForkFlood { for_ms: size },
            "procs" | "procs-fake-envoy" => Attack::Procs {
                count: size as u32,
                linger_ms: 0,
                fake_envoy: name == "procs-fake-envoy",
            },
            other => return Err(format!("unknown attack {other:?}")),
        })
    }

    /// Runs the attack (on threads of its own where it lasts); returns a line for the app's log.
    pub fn run(self) -> std::io::Result<String> {
        match self {
            Attack::FakeEnvoy { body } => fake_envoy(body),
            Attack::RuleFlood { rules } => rule_flood(rules),
            Attack::NetlinkForge { for_ms } => netlink_forge(Duration::from_millis(for_ms)),
            Attack::ForkFlood { for_ms } => fork_flood(Duration::from_millis(for_ms)),
            Attack::Procs {
                count, fake_envoy, ..
            } => procs(count, fake_envoy),
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
}

fn fake_envoy(body: usize) -> std::io::Result<String> {
    let admin = TcpListener::bind("127.0.0.1:15000")?;
    for port in [15001u16, 15006] {
        let l = TcpListener::bind(("0.0.0.0", port))?;
        // Accept and drop: the ports listen, nothing is served.
        spawn("fake-capture", move || {
            for s in l.incoming() {
                drop(s);
            }
        })?;
    }
    spawn("fake-admin", move || {
        for s in admin.incoming().flatten() {
            let _ = std::thread::Builder::new()
                .name("fake-admin-conn".into())
                .spawn(move || serve_huge(s, body));
        }
    })?;
    Ok(format!(
        "fake Envoy: 15000/15001/15006 listen, every admin answer {body} bytes, never LIVE"
    ))
}

/// Every request on the connection gets `200` and `body` bytes of stat-like lines, chunked.
fn serve_huge(s: TcpStream, body: usize) {
    let mut reader = BufReader::new(match s.try_clone() {
        Ok(r) => r,
        Err(_) => return,
    });
    let mut out = s;
    let line = b"cluster.fake.upstream_cx_total: 1\n";
    let chunk: Vec<u8> = line.iter().copied().cycle().take(16 * 1024).collect();
    loop {
        // The request head, up to its blank line.
        let mut head = String::new();
        loop {
            let mut l = String::new();
            match reader.read_line(&mut l) {
                Ok(0) | Err(_) => return,
                Ok(_) if l == "\r\n" || l == "\n" => break,
                Ok(_) => head.push_str(&l),
            }
        }
        if out
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            .is_err()
        {
            return;
        }
        let mut left = body;
        while left > 0 {
            let n = left.min(chunk.len());
            if write!(out, "{n:x}\r\n").is_err()
                || out.write_all(&chunk[..n]).is_err()
                || out.write_all(b"\r\n").is_err()
            {
                return;
            }
            left -= n;
        }
        if out.write_all(b"0\r\n\r\n").is_err() {
            return;
        }
    }
}

/// The fake Envoy's answer to the readiness request: LIVE, workers started, the filter
/// configured on both workers (`holdfast::lifecycle::readiness::decide`).
const READY_STATS: &str = "server.state: 0\nserver.concurrency: 2\nlistener_manager.workers_started: 1\nwasmcustom.holdfast.workers_ready: 2\nwasmcustom.holdfast.loaded: 1\n";

fn procs(count: u32, fake_envoy: bool) -> std::io::Result<String> {
    let mut line = String::new();
    if fake_envoy {
        let admin = TcpListener::bind("127.0.0.1:15000")?;
        for port in [15001u16, 15006] {
            let l = TcpListener::bind(("0.0.0.0", port))?;
            spawn("fake-capture", move || {
                for s in l.incoming() {
                    drop(s);
                }
            })?;
        }
        spawn("fake-admin", move || {
            for s in admin.incoming().flatten() {
                let _ = std::thread::Builder::new()
                    .name("fake-admin-conn".into())
                    .spawn(move || serve_ready_then_huge(s, DRAIN_FAKE_BODY));
            }
        })?;
        line.push_str(&format!(
            "fake Envoy: ready to the readiness check, every other admin answer {DRAIN_FAKE_BODY} bytes; "
        ));
    }
    // The children die with the thread that forked them (`PR_SET_PDEATHSIG`): one thread
    // forks them all and stays until the process exits.
    let (tx, rx) = std::sync::mpsc::channel();
    spawn("procs", move || {
        let t = Instant::now();
        let mut forked = 0u32;
        let mut error = None;
        for _ in 0..count {
            match crate::sim::process::fork_sleeper() {
                Ok(_) => forked += 1,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        let _ = tx.send((forked, t.elapsed(), error));
        loop {
            std::thread::park();
        }
    })?;
    let (forked, took, error) = rx
        .recv()
        .map_err(|_| std::io::Error::other("the forking thread ended"))?;
    line.push_str(&format!(
        "procs: {forked} processes alive until the app exits (forked in {took:?}){}",
        error.map_or(String::new(), |e| format!(", then fork failed: {e}"))
    ));
    Ok(line)
}

/// Like [`serve_huge`], but the readiness request (`/stats?filter=`, without `usedonly`) and
/// `/ready` get what a ready Envoy answers.
fn serve_ready_then_huge(s: TcpStream, body: usize) {
    let mut reader = BufReader::new(match s.try_clone() {
        Ok(r) => r,
        Err(_) => return,
    });
    let mut out = s;
    let line = b"listener.0.0.0.0_15006.downstream_cx_rx_bytes_total: 1\n";
    let chunk: Vec<u8> = line.iter().copied().cycle().take(16 * 1024).collect();
    loop {
        let mut head = String::new();
        loop {
            let mut l = String::new();
            match reader.read_line(&mut l) {
                Ok(0) | Err(_) => return,
                Ok(_) if l == "\r\n" || l == "\n" => break,
                Ok(_) => head.push_str(&l),
            }
        }
        let target = head.split_whitespace().nth(1).unwrap_or("");
        let small = if target == "/ready" {
            Some("LIVE\n")
        } else if target.starts_with("/stats?filter=") {
            Some(READY_STATS)
        } else {
            None
        };
        if let Some(text) = small {
            if write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{text}",
                text.len()
            )
            .is_err()
            {
                return;
            }
            continue;
        }
        if out
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            .is_err()
        {
            return;
        }
        let mut left = body;
        while left > 0 {
            let n = left.min(chunk.len());
            if write!(out, "{n:x}\r\n").is_err()
                || out.write_all(&chunk[..n]).is_err()
                || out.write_all(b"\r\n").is_err()
            {
                return;
            }
            left -= n;
        }
        if out.write_all(b"0\r\n\r\n").is_err() {
            return;
        }
    }
}

fn iptables(args: &[&str]) -> std::io::Result<std::process::Output> {
    std::process::Command::new("iptables").args(args).output()
}

fn rule_flood(rules: u32) -> std::io::Result<String> {
    // Wait for the agent's hold (its chain in this netns).
    let t = Instant::now();
    while !iptables(&["-w", "-S", "HOLDFAST_OUT"])?.status.success() {
        if t.elapsed() > Duration::from_secs(30) {
            return Ok("rule flood: holdfast's chain never appeared".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut script = String::from("*filter\n-A OUTPUT -j HOLDFAST_OUT\n");
    for i in 0..rules {
        script.push_str(&format!(
            "-A INPUT -s 10.{}.{}.{}/32 -p tcp -m tcp --dport {} -m comment --comment flood-rule-{i} -j ACCEPT\n",
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff,
            1024 + (i % 60000)
        ));
    }
    script.push_str("COMMIT\n");
    let mut child = std::process::Command::new("iptables-restore")
        .args(["-w", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let status = child.wait()?;
    Ok(format!(
        "rule flood: a second jump to HOLDFAST_OUT and {rules} rules in the filter table ({status}) after {:?}",
        t.elapsed()
    ))
}

/// The port id bound to `queue` in this netns (`/proc/self/net/netfilter/nfnetlink_queue`:
/// `queue_num peer_portid ...`).
fn queue_port_id(queue: u16) -> Option<u32> {
    let mut text = String::new();
    std::fs::File::open("/proc/self/net/netfilter/nfnetlink_queue")
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let num: u16 = f.next()?.parse().ok()?;
        let port: u32 = f.next()?.parse().ok()?;
        (num == queue).then_some(port)
    })
}

/// One forged `NFQNL_MSG_PACKET` for `queue`: packet id `id`, an IPv4 TCP SYN 127.0.0.1:`sport`
/// → 127.0.0.1:15001 (include/uapi/linux/netfilter/nfnetlink_queue.h).
fn forged_packet(queue: u16, id: u32, sport: u16) -> Vec<u8> {
    let mut attrs = Vec::new();
    let mut put = |ty: u16, value: &[u8]| {
        let len = 4 + value.len();
        attrs.extend_from_slice(&(len as u16).to_ne_bytes());
        attrs.extend_from_slice(&ty.to_ne_bytes());
        attrs.extend_from_slice(value);
        attrs.resize(attrs.len() + ((len + 3) & !3) - len, 0);
    };
    let mut hdr = id.to_be_bytes().to_vec();
    hdr.extend_from_slice(&[0x08, 0x00, 3]);
    put(1, &hdr); // NFQA_PACKET_HDR
    let mut ip = vec![0u8; 40];
    ip[0] = 0x45;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[127, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[127, 0, 0, 1]);
    ip[20..22].copy_from_slice(&sport.to_be_bytes());
    ip[22..24].copy_from_slice(&15001u16.to_be_bytes());
    ip[33] = 0x02; // SYN
    put(10, &ip); // NFQA_PAYLOAD
    let len = 16 + 4 + attrs.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&((3u16 << 8)/* NFNL_SUBSYS_QUEUE */).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&id.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&[libc::AF_INET as u8, 0]);
    msg.extend_from_slice(&queue.to_be_bytes());
    msg.extend_from_slice(&attrs);
    msg
}

fn netlink_forge(for_: Duration) -> std::io::Result<String> {
    use nix::sys::socket::{
        sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
    };
    use std::os::fd::AsRawFd;
    let t = Instant::now();
    let port = loop {
        if let Some(p) = queue_port_id(HOLDFAST_QUEUE) {
            break p;
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Ok("netlink forger: the agent's queue never appeared".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )?;
    let to = NetlinkAddr::new(port, 0);
    let start = Instant::now();
    let (mut sent, mut refused) = (0u64, 0u64);
    let mut id = 1u32;
    while start.elapsed() < for_ {
        let msg = forged_packet(HOLDFAST_QUEUE, id, 10_000 + (id % 50_000) as u16);
        match sendto(fd.as_raw_fd(), &msg, &to, MsgFlags::MSG_DONTWAIT) {
            Ok(_) => sent += 1,
            Err(_) => {
                refused += 1;
                // Full, or the socket is gone (the agent released the hold): slow down.
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        id = id.wrapping_add(1);
    }
    Ok(format!(
        "netlink forger: {sent} forged messages sent to port id {port}, {refused} refused, over {:?}",
        start.elapsed()
    ))
}

fn fork_flood(for_: Duration) -> std::io::Result<String> {
    let start = Instant::now();
    let first = std::process::id();
    eprintln!("sim-app: fork flood: 4 forkers for {for_:?} from pid {first}");
    // Four forkers: one alone reaches ~3,000 forks a second here, short of a wrap in 10 s.
    let forkers: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut forks, mut last, mut wrapped) = (0u64, 0i32, false);
                while start.elapsed() < for_ {
                    let Ok(pid) = crate::sim::process::fork_and_exit() else {
                        break;
                    };
                    forks += 1;
                    wrapped |= pid < last;
                    last = pid;
                }
                (forks, wrapped)
            })
        })
        .collect();
    let (mut forks, mut wrapped) = (0u64, false);
    for f in forkers {
        if let Ok((n, w)) = f.join() {
            forks += n;
            wrapped |= w;
        }
    }
    Ok(format!(
        "fork flood: {forks} children in {:?} (from pid {first}), pids wrapped: {wrapped}",
        start.elapsed()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_packets_parse_as_the_agent_reads_them() {
        let msg = forged_packet(HOLDFAST_QUEUE, 7, 40000);
        let parsed = holdfast::effects::hold::nfqueue::parse_datagram(&msg);
        assert_eq!(parsed.packets.len(), 1, "{parsed:?}");
        assert_eq!(parsed.packets[0].id, 7);
        let flow = parsed.packets[0].flow.expect("a flow");
        assert_eq!((flow.src_port, flow.dst_port), (40000, 15001));
        for a in [
            Attack::FakeEnvoy { body: 4 << 20 },
            Attack::RuleFlood { rules: 5000 },
            Attack::NetlinkForge { for_ms: 10 },
            Attack::ForkFlood { for_ms: 10 },
            Attack::Procs {
                count: 2000,
                linger_ms: 0,
                fake_envoy: true,
            },
            Attack::Procs {
                count: 2000,
                linger_ms: 0,
                fake_envoy: false,
            },
        ] {
            let args = a.args();
            assert_eq!(Attack::parse(&args[1], args[3].parse().unwrap()), Ok(a));
        }
        let lingering = Attack::Procs {
            count: 1,
            linger_ms: 15_000,
            fake_envoy: false,
        };
        assert!(lingering
            .args()
            .ends_with(&["--exit-delay-ms".into(), "15000".into()]));
    }
}
