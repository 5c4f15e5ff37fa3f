//! Listening sockets of a network namespace, asked of the kernel through `sock_diag`
//! (`NETLINK_SOCK_DIAG`, the interface `ss` uses) instead of read from `/proc/<pid>/net/tcp`.
//!
//! Why: reading `/proc/.../net/tcp{,6}` makes the kernel walk its whole established-connections
//! hash table (every bucket, even in an empty namespace: ~4 ms of CPU per read on a node with
//! 262,144 buckets; perf shows `established_get_first`). A sock_diag dump restricted to
//! `1 << TCP_LISTEN` walks only the listening hash (`inet_diag_dump_icsk` skips the established
//! table when no other state is asked for), so one query costs microseconds.
//!
//! A netlink socket answers for the network namespace it was **created** in (`sock_net(skb->sk)`
//! in `inet_diag_dump`), whichever thread uses it later. So [`SockDiag::open_in`] creates it once
//! on a thread inside the pod's netns ([`PodNetns::run`]) and every later query is a plain
//! `sendto`/`recv` from any thread, with no `setns`.
//!
//! Wire format, from the kernel's uapi headers:
//! - `linux/netlink.h`: `struct nlmsghdr { __u32 nlmsg_len; __u16 nlmsg_type; __u16 nlmsg_flags;
//!   __u32 nlmsg_seq; __u32 nlmsg_pid; }` (16 bytes), messages aligned to 4 bytes
//!   (`NLMSG_ALIGN`), `NLMSG_ERROR` = 2 (payload `int error` + the request's header),
//!   `NLMSG_DONE` = 3, `NLM_F_REQUEST` = 1, `NLM_F_DUMP` = `NLM_F_ROOT | NLM_F_MATCH` = 0x300.
//! - `linux/sock_diag.h`: `SOCK_DIAG_BY_FAMILY` = 20.
//! - `linux/inet_diag.h`: `struct inet_diag_req_v2 { __u8 sdiag_family; __u8 sdiag_protocol;
//!   __u8 idiag_ext; __u8 pad; __u32 idiag_states; struct inet_diag_sockid id; }` (56 bytes);
//!   `struct inet_diag_sockid { __be16 idiag_sport; __be16 idiag_dport; __be32 idiag_src[4];
//!   __be32 idiag_dst[4]; __u32 idiag_if; __u32 idiag_cookie[2]; }` (48 bytes);
//!   `struct inet_diag_msg { __u8 idiag_family; __u8 idiag_state; __u8 idiag_timer;
//!   __u8 idiag_retrans; struct inet_diag_sockid id; __u32 idiag_expires; __u32 idiag_rqueue;
//!   __u32 idiag_wqueue; __u32 idiag_uid; __u32 idiag_inode; }` (72 bytes).
//! - `net/tcp_states.h`: `TCP_ESTABLISHED` = 1, `TCP_FIN_WAIT1` = 4, `TCP_CLOSE` = 7,
//!   `TCP_CLOSE_WAIT` = 8, `TCP_LAST_ACK` = 9, `TCP_LISTEN` = 10, `TCP_CLOSING` = 11. A bound,
//!   unconnected UDP socket (a DNS server's) is in `TCP_CLOSE` (`ss -u` shows it as `UNCONN`).
//! - `idiag_wqueue` of a TCP socket (`tcp_diag_get_info`, net/ipv4/tcp_diag.c): for a listener
//!   its accept backlog limit, for any other TCP socket `tp->write_seq - tp->snd_una`: bytes
//!   written and not yet acknowledged by the peer, unsent and sent alike (a FIN counts one, as
//!   it takes a sequence number: `tcp_send_fin` increments `write_seq`). `ss` shows it as
//!   `Send-Q`.
//!
//! The filter by port is done here, not with `INET_DIAG_REQ_BYTECODE`: a pod has a handful of
//! listening sockets, and the bytecode's jump semantics are easy to get subtly wrong.
//! Every reply is checked (lengths, sequence number, kernel errors): a short or garbled reply is
//! an [`Error`], never a panic.

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::Duration;

use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::effects::netns::{NetnsId, PodNetns};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_REQ_V2_LEN: usize = 56;
const INET_DIAG_MSG_LEN: usize = 72;
const TCP_LISTEN: u8 = 10;
const TCP_CLOSE: u8 = 7;
/// The states in which a TCP socket can still hold bytes for its peer (include/net/tcp_states.h):
/// ESTABLISHED (1) and CLOSE_WAIT (8) can still write; FIN_WAIT1 (4), LAST_ACK (9) and CLOSING
/// (11) have sent or queued their FIN after data the peer may not have acknowledged. Left out:
/// LISTEN (its `idiag_wqueue` is the backlog limit, not bytes), SYN_SENT/SYN_RECV (nothing
/// written yet), FIN_WAIT2 and TIME_WAIT (everything, FIN included, was acknowledged), CLOSE.
const TCP_SENDING_STATES: u32 = (1 << 1) | (1 << 4) | (1 << 8) | (1 << 9) | (1 << 11);
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;
/// Receive buffer: the kernel sizes dump batches to at most 32 KiB.
const RECV_BUFFER: usize = 64 * 1024;
/// Bound of one `recv`: the kernel builds dump batches synchronously, so an answer is immediate;
/// the timeout only guards against a kernel that never answers.
const RECV_TIMEOUT: Duration = Duration::from_millis(500);
/// Messages one dump may take before it is called malformed (a loop guard, far above a pod's).
const MAX_MESSAGES: usize = 1 << 20;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create a sock_diag netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("cannot create the sock_diag socket inside network namespace {netns:?}: {reason}")]
    Netns { netns: NetnsId, reason: String },
    #[error("sock_diag request failed: {0}")]
    Send(std::io::Error),
    #[error("sock_diag reply could not be read: {0}")]
    Recv(std::io::Error),
    #[error("the kernel refused the sock_diag request: {0}")]
    Kernel(std::io::Error),
    #[error("malformed sock_diag reply: {0}")]
    Malformed(String),
}

/// Result of this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Which sockets to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// TCP sockets in LISTEN state.
    TcpListen,
    /// UDP sockets bound and not connected (a server's, such as pilot-agent's DNS proxy).
    UdpBound,
    /// TCP sockets that can still hold bytes for their peer (`TCP_SENDING_STATES`).
    TcpSending,
}

impl Kind {
    fn protocol_and_states(self) -> (u8, u32) {
        match self {
            Kind::TcpListen => (IPPROTO_TCP, 1 << TCP_LISTEN),
            Kind::UdpBound => (IPPROTO_UDP, 1 << TCP_CLOSE),
            Kind::TcpSending => (IPPROTO_TCP, TCP_SENDING_STATES),
        }
    }
}

/// One socket from a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagSocket {
    pub local: IpAddr,
    pub port: u16,
    /// The peer's port (0 for a listener or an unconnected socket).
    pub remote_port: u16,
    pub state: u8,
    /// `idiag_wqueue` (see the module docs: for a TCP socket not listening, bytes not yet
    /// acknowledged by the peer).
    pub wqueue: u32,
}

/// A sock_diag netlink socket bound to one network namespace (the one it was created in).
#[derive(Debug)]
pub struct SockDiag {
    /// One dump at a time.
    inner: Mutex<Dumper>,
}

/// The socket and the last sequence number.
#[derive(Debug)]
struct Dumper {
    fd: OwnedFd,
    seq: u32,
    /// The kernel refused an exact lookup (not `ENOENT`): dump instead from then on.
    exact_unsupported: bool,
}

impl Dumper {
    /// A TCP listener on `port` reached through `127.0.0.1`, else through `::1`.
    fn tcp_listener_reached(&mut self, port: u16) -> Result<bool> {
        for (family, addr) in [
            (AF_INET, IpAddr::from([127, 0, 0, 1])),
            (AF_INET6, IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
        ] {
            self.seq = self.seq.wrapping_add(1);
            let req = lookup_request(self.seq, family, addr, port);
            // One socket's message or an error: well under a page (MSG_TRUNC catches more).
            let mut buf = [0u8; 4096];
            match exchange_one(&self.fd, self.seq, &req, &mut buf) {
                Ok(s) if s.state == TCP_LISTEN && s.port == port => return Ok(true),
                Ok(_) => {}
                Err(Error::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// A bound, unconnected UDP socket on `port` that a datagram to `127.0.0.1`, else `::1`,
    /// would reach. The UDP handler's exact lookup takes the local address from the request's
    /// *destination* fields (`udp_dump_one` in net/ipv4/udp_diag.c calls
    /// `__udp4_lib_lookup(net, id.idiag_src, id.idiag_sport, id.idiag_dst, id.idiag_dport, ..)`,
    /// whose third and fourth arguments are the receiving socket's: "src and dst are swapped for
    /// historical reasons"), the opposite of TCP's.
    fn udp_bound_reached(&mut self, port: u16) -> Result<bool> {
        for (family, addr) in [
            (AF_INET, IpAddr::from([127, 0, 0, 1])),
            (AF_INET6, IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
        ] {
            self.seq = self.seq.wrapping_add(1);
            let req = udp_lookup_request(self.seq, family, addr, port);
            let mut buf = [0u8; 4096];
            match exchange_one(&self.fd, self.seq, &req, &mut buf) {
                Ok(s) if s.port == port => return Ok(true),
                Ok(_) => {}
                Err(Error::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    fn dump(&mut self, family: u8, kind: Kind, out: &mut Vec<DiagSocket>) -> Result<()> {
        self.seq = self.seq.wrapping_add(1);
        // Allocated per dump, not kept: every pod keeps its probe (and so this socket) for its
        // whole life, and 64 KiB each would be 7 MiB of RSS at 110 pods. Dumps are the
        // fallback and the DNS check; the frequent check is the exact lookup below.
        let mut buf = vec![0u8; RECV_BUFFER];
        dump(&self.fd, self.seq, family, kind, &mut buf, out)
    }
}

impl SockDiag {
    /// A socket answering for the calling thread's network namespace.
    pub fn open_current() -> Result<SockDiag> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(netlink::SOCK_DIAG),
        )
        .map_err(|e| Error::Socket(e.into()))?;
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(RECV_TIMEOUT),
        )
        .map_err(|e| Error::Socket(e.into()))?;
        Ok(SockDiag {
            inner: Mutex::new(Dumper {
                fd,
                seq: 1,
                exact_unsupported: false,
            }),
        })
    }

    /// A socket answering for `netns`: created by a thread inside it, then usable anywhere.
    pub fn open_in(netns: &PodNetns) -> Result<SockDiag> {
        let id = netns.id();
        netns
            .run(SockDiag::open_current)
            .map_err(|e| Error::Netns {
                netns: id,
                reason: e.to_string(),
            })?
    }

    /// Every socket of `kind`, IPv4 and IPv6.
    pub fn sockets(&self, kind: Kind) -> Result<Vec<DiagSocket>> {
        let mut dumper = self.lock();
        let mut out = Vec::new();
        for family in [AF_INET, AF_INET6] {
            dumper.dump(family, kind, &mut out)?;
        }
        Ok(out)
    }

    /// Whether every port in `wanted` has a TCP socket in LISTEN state that a connection to the
    /// loopback address would reach (`127.0.0.1`, else `::1`): where the app's REDIRECTed
    /// connections and pilot-agent's DNS capture arrive.
    ///
    /// Asked port by port with an exact lookup, not a dump: a request without `NLM_F_DUMP`
    /// makes the kernel look the socket up the way an arriving SYN does
    /// (`inet_diag_find_one_icsk` → `inet_lookup(net, .., saddr = id.idiag_dst, sport =
    /// id.idiag_dport, daddr = id.idiag_src, dport = id.idiag_sport, id.idiag_if)` in
    /// net/ipv4/inet_diag.c): with a zero remote address and port no established socket can
    /// match, so the answer is the listener (`0.0.0.0`, `[::]` dual-stack, or the loopback
    /// address itself) or `ENOENT`. A dump walks every bucket of the listening hash whatever
    /// the namespace (perf at 110 pods: a quarter of the agent's CPU in `tcp_diag_dump`); a
    /// lookup is one hash probe. A kernel that refuses the exact form falls back to the dump.
    pub fn tcp_listening_all(&self, wanted: &[u16]) -> Result<bool> {
        let mut dumper = self.lock();
        if !dumper.exact_unsupported {
            match wanted
                .iter()
                .try_fold(true, |all, p| Ok(all && dumper.tcp_listener_reached(*p)?))
            {
                Ok(all) => return Ok(all),
                Err(Error::Kernel(e)) if e.raw_os_error() != Some(libc::ENOENT) => {
                    tracing::debug!(error = %e, "sock_diag exact lookup refused; dumping listeners instead");
                    dumper.exact_unsupported = true;
                }
                Err(e) => return Err(e),
            }
        }
        let mut out = Vec::new();
        for family in [AF_INET, AF_INET6] {
            dumper.dump(family, Kind::TcpListen, &mut out)?;
            if wanted.iter().all(|p| out.iter().any(|s| s.port == *p)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Dumper> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes the namespace's TCP sockets (IPv4 and IPv6) still hold for their peers: the sum of
    /// `idiag_wqueue` over every socket in `TCP_SENDING_STATES` — what the kernel would still
    /// send, or resend, after the process that wrote it exited, and what is lost when the
    /// namespace is torn down first — leaving out the connections with `skip_port` at either
    /// end (the caller's own: Envoy's admin port, whose last answer to the agent's keep-alive
    /// stays unacknowledged until the agent's delayed ACK or next request).
    ///
    /// A dump: the kernel walks the established hash (every bucket, like `ss -t`), so this is
    /// asked only while a drain samples, not by the frequent readiness checks.
    pub(crate) fn tcp_send_queued(&self, skip_port: u16) -> Result<u64> {
        let sockets = self.sockets(Kind::TcpSending)?;
        Ok(sockets
            .iter()
            .filter(|s| s.port != skip_port && s.remote_port != skip_port)
            .map(|s| u64::from(s.wqueue))
            .sum())
    }

    /// Ports with a TCP socket in LISTEN state (IPv4 or IPv6).
    pub fn tcp_listening_ports(&self) -> Result<HashSet<u16>> {
        Ok(self
            .sockets(Kind::TcpListen)?
            .into_iter()
            .map(|s| s.port)
            .collect())
    }

    /// Whether a bound UDP socket on `port` receives what is sent to the loopback address (the
    /// DNS capture's 15053): one exact lookup per family, not a dump of every UDP socket of the
    /// namespace (a pod can open thousands). A kernel that refuses the exact form is answered
    /// from a dump.
    pub(crate) fn udp_bound(&self, port: u16) -> Result<bool> {
        let mut dumper = self.lock();
        if !dumper.exact_unsupported {
            match dumper.udp_bound_reached(port) {
                Ok(found) => return Ok(found),
                Err(Error::Kernel(e)) if e.raw_os_error() != Some(libc::ENOENT) => {
                    tracing::debug!(error = %e, "sock_diag exact UDP lookup refused; dumping instead");
                    dumper.exact_unsupported = true;
                }
                Err(e) => return Err(e),
            }
        }
        drop(dumper);
        Ok(self.udp_bound_ports()?.contains(&port))
    }

    /// Ports with a bound, unconnected UDP socket (IPv4 or IPv6).
    pub fn udp_bound_ports(&self) -> Result<HashSet<u16>> {
        Ok(self
            .sockets(Kind::UdpBound)?
            .into_iter()
            .map(|s| s.port)
            .collect())
    }
}

/// The `SOCK_DIAG_BY_FAMILY` dump request for one family.
fn request(seq: u32, family: u8, kind: Kind) -> [u8; NLMSG_HDRLEN + INET_DIAG_REQ_V2_LEN] {
    let (protocol, states) = kind.protocol_and_states();
    let mut msg = [0u8; NLMSG_HDRLEN + INET_DIAG_REQ_V2_LEN];
    let len = msg.len() as u32;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    msg[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    msg[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    msg[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel. inet_diag_req_v2 follows; the sockid stays zero (no filter).
    msg[16] = family;
    msg[17] = protocol;
    msg[20..24].copy_from_slice(&states.to_ne_bytes());
    msg
}

/// An exact `SOCK_DIAG_BY_FAMILY` request (no `NLM_F_DUMP`): the TCP socket a connection
/// to `local:port` from nowhere would reach. The cookie is `INET_DIAG_NOCOOKIE` (`~0U` twice:
/// `sock_diag_check_cookie` then accepts any socket).
fn lookup_request(
    seq: u32,
    family: u8,
    local: IpAddr,
    port: u16,
) -> [u8; NLMSG_HDRLEN + INET_DIAG_REQ_V2_LEN] {
    let mut msg = request(seq, family, Kind::TcpListen);
    msg[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    // inet_diag_sockid at offset 24: sport (big endian), dport, src[16], dst[16], if, cookie[2].
    msg[24..26].copy_from_slice(&port.to_be_bytes());
    match local {
        IpAddr::V4(v4) => msg[28..32].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => msg[28..44].copy_from_slice(&v6.octets()),
    }
    msg[64..72].copy_from_slice(&[0xff; 8]);
    msg
}

/// An exact UDP request: the socket a datagram to `local:port` would reach (the local address in
/// the destination fields, see [`Dumper::udp_bound_reached`]).
fn udp_lookup_request(
    seq: u32,
    family: u8,
    local: IpAddr,
    port: u16,
) -> [u8; NLMSG_HDRLEN + INET_DIAG_REQ_V2_LEN] {
    let mut msg = request(seq, family, Kind::UdpBound);
    msg[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    // inet_diag_sockid at offset 24: sport, dport (26), src[16] (28), dst[16] (44), if, cookie.
    msg[26..28].copy_from_slice(&port.to_be_bytes());
    match local {
        IpAddr::V4(v4) => msg[44..48].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => msg[44..60].copy_from_slice(&v6.octets()),
    }
    msg[64..72].copy_from_slice(&[0xff; 8]);
    msg
}

/// Sends one request to the kernel.
fn send(fd: &OwnedFd, req: &[u8]) -> Result<()> {
    let kernel = netlink::SocketAddrNetlink::new(0, 0);
    rustix::net::sendto(fd, req, SendFlags::empty(), &kernel).map_err(|e| Error::Send(e.into()))?;
    Ok(())
}

/// Receives one datagram into `buf`: its length, or an error if it did not fit.
fn recv_datagram(fd: &OwnedFd, buf: &mut [u8]) -> Result<usize> {
    let (_, len) =
        rustix::net::recv(fd, &mut *buf, RecvFlags::TRUNC).map_err(|e| Error::Recv(e.into()))?;
    if len > buf.len() {
        return Err(Error::Malformed(format!(
            "a {len}-byte datagram does not fit the {}-byte buffer",
            buf.len()
        )));
    }
    Ok(len)
}

/// Sends an exact request and reads its one answer: the socket, or the kernel's error.
fn exchange_one(fd: &OwnedFd, seq: u32, req: &[u8], buf: &mut [u8]) -> Result<DiagSocket> {
    send(fd, req)?;
    let mut messages = 0usize;
    loop {
        let len = recv_datagram(fd, buf)?;
        let mut out = Vec::new();
        // An answer of our sequence is the socket (then `More`: no DONE follows a non-dump
        // answer) or an error; a stale datagram of an abandoned request holds neither.
        let batch = parse_batch(&buf[..len], seq, &mut out, &mut messages)?;
        if let Some(s) = out.pop() {
            return Ok(s);
        }
        if batch == Batch::Done {
            return Err(Error::Malformed("DONE without a socket".into()));
        }
    }
}

fn dump(
    fd: &OwnedFd,
    seq: u32,
    family: u8,
    kind: Kind,
    buf: &mut [u8],
    out: &mut Vec<DiagSocket>,
) -> Result<()> {
    send(fd, &request(seq, family, kind))?;
    let mut messages = 0usize;
    loop {
        let len = recv_datagram(fd, buf)?;
        match parse_batch(&buf[..len], seq, out, &mut messages)? {
            Batch::Done => return Ok(()),
            Batch::More => {}
        }
    }
}

/// Whether a dump goes on after a datagram.
#[derive(Debug, PartialEq, Eq)]
enum Batch {
    More,
    Done,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses one datagram of a dump answering request `seq`: its sockets go to `out`. Messages of
/// another sequence (left over from an earlier, abandoned dump) are skipped.
fn parse_batch(
    mut data: &[u8],
    seq: u32,
    out: &mut Vec<DiagSocket>,
    messages: &mut usize,
) -> Result<Batch> {
    if data.is_empty() {
        return Err(Error::Malformed("empty datagram".into()));
    }
    while !data.is_empty() {
        let short = || Error::Malformed(format!("{} bytes left, no room for a header", data.len()));
        let len = u32_at(data, 0).ok_or_else(short)? as usize;
        let kind = u16_at(data, 4).ok_or_else(short)?;
        let msg_seq = u32_at(data, 8).ok_or_else(short)?;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Err(Error::Malformed(format!(
                "message length {len} with {} bytes in the datagram",
                data.len()
            )));
        }
        *messages += 1;
        if *messages > MAX_MESSAGES {
            return Err(Error::Malformed(format!(
                "more than {MAX_MESSAGES} messages"
            )));
        }
        let payload = &data[NLMSG_HDRLEN..len];
        if msg_seq == seq {
            match kind {
                NLMSG_DONE => return Ok(Batch::Done),
                NLMSG_ERROR => {
                    let errno = u32_at(payload, 0).ok_or_else(|| {
                        Error::Malformed("NLMSG_ERROR without an error code".into())
                    })? as i32;
                    // 0 is an acknowledgement, which a dump does not ask for: not an answer.
                    return Err(if errno == 0 {
                        Error::Malformed("an acknowledgement instead of a dump".into())
                    } else {
                        Error::Kernel(std::io::Error::from_raw_os_error(-errno))
                    });
                }
                SOCK_DIAG_BY_FAMILY => out.push(parse_socket(payload)?),
                other => return Err(Error::Malformed(format!("unexpected message type {other}"))),
            }
        }
        let aligned = (len + 3) & !3;
        data = data.get(aligned..).unwrap_or_default();
    }
    Ok(Batch::More)
}

/// One `inet_diag_msg`.
fn parse_socket(payload: &[u8]) -> Result<DiagSocket> {
    if payload.len() < INET_DIAG_MSG_LEN {
        return Err(Error::Malformed(format!(
            "inet_diag_msg of {} bytes (expected at least {INET_DIAG_MSG_LEN})",
            payload.len()
        )));
    }
    let family = payload[0];
    let state = payload[1];
    // inet_diag_sockid starts at offset 4: sport (big endian), dport, src[16], ...
    let port = u16::from_be_bytes([payload[4], payload[5]]);
    let remote_port = u16::from_be_bytes([payload[6], payload[7]]);
    let mut src = [0u8; 16];
    src.copy_from_slice(&payload[8..24]);
    let local = match family {
        AF_INET => IpAddr::from([src[0], src[1], src[2], src[3]]),
        AF_INET6 => IpAddr::from(src),
        other => {
            return Err(Error::Malformed(format!(
                "socket of address family {other} in an inet dump"
            )))
        }
    };
    // After the sockid (4..52): idiag_expires (52), idiag_rqueue (56), idiag_wqueue (60).
    let wqueue = u32_at(payload, 60).unwrap_or_default();
    Ok(DiagSocket {
        local,
        port,
        remote_port,
        state,
        wqueue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: u32, kind: u16, seq: u32) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend(len.to_ne_bytes());
        h.extend(kind.to_ne_bytes());
        h.extend(2u16.to_ne_bytes());
        h.extend(seq.to_ne_bytes());
        h.extend(0u32.to_ne_bytes());
        h
    }

    fn socket_msg(seq: u32, family: u8, port: u16, addr: &[u8]) -> Vec<u8> {
        let mut m = header(
            (NLMSG_HDRLEN + INET_DIAG_MSG_LEN) as u32,
            SOCK_DIAG_BY_FAMILY,
            seq,
        );
        let mut p = vec![0u8; INET_DIAG_MSG_LEN];
        p[0] = family;
        p[1] = TCP_LISTEN;
        p[4..6].copy_from_slice(&port.to_be_bytes());
        p[8..8 + addr.len()].copy_from_slice(addr);
        m.extend(p);
        m
    }

    #[test]
    fn request_matches_the_uapi_layout() {
        let r = request(7, AF_INET6, Kind::TcpListen);
        assert_eq!(r.len(), 72);
        assert_eq!(u32_at(&r, 0), Some(72));
        assert_eq!(u16_at(&r, 4), Some(20));
        assert_eq!(u16_at(&r, 6), Some(0x301));
        assert_eq!(u32_at(&r, 8), Some(7));
        assert_eq!((r[16], r[17]), (AF_INET6, 6));
        assert_eq!(u32_at(&r, 20), Some(1 << 10));
        let r = request(8, AF_INET, Kind::UdpBound);
        assert_eq!((r[16], r[17], u32_at(&r, 20)), (AF_INET, 17, Some(1 << 7)));
    }

    #[test]
    fn parses_sockets_and_done_and_skips_stale_sequences() {
        let mut data = socket_msg(5, AF_INET, 15001, &[127, 0, 0, 1]);
        data.extend(socket_msg(4, AF_INET, 9999, &[0; 4])); // an abandoned dump's
        data.extend(socket_msg(5, AF_INET6, 15006, &[0; 16]));
        let mut out = Vec::new();
        let mut n = 0;
        assert_eq!(
            parse_batch(&data, 5, &mut out, &mut n).expect("parse"),
            Batch::More
        );
        let ports: Vec<u16> = out.iter().map(|s| s.port).collect();
        assert_eq!(ports, vec![15001, 15006]);
        assert_eq!(out[0].local, IpAddr::from([127, 0, 0, 1]));
        let mut done = header(20, NLMSG_DONE, 5);
        done.extend(0u32.to_ne_bytes());
        assert_eq!(
            parse_batch(&done, 5, &mut out, &mut n).expect("done"),
            Batch::Done
        );
    }

    #[test]
    fn bad_replies_are_errors_not_panics() {
        let mut out = Vec::new();
        let mut n = 0;
        for (what, data) in [
            ("empty", vec![]),
            ("short header", vec![1, 2, 3]),
            (
                "length beyond the datagram",
                header(400, SOCK_DIAG_BY_FAMILY, 1),
            ),
            ("length below a header", header(8, SOCK_DIAG_BY_FAMILY, 1)),
            ("short inet_diag_msg", {
                let mut m = header(NLMSG_HDRLEN as u32 + 8, SOCK_DIAG_BY_FAMILY, 1);
                m.extend([0u8; 8]);
                m
            }),
            (
                "error without code",
                header(NLMSG_HDRLEN as u32, NLMSG_ERROR, 1),
            ),
            ("unknown type", header(NLMSG_HDRLEN as u32, 99, 1)),
            ("unknown family", {
                let mut m = socket_msg(1, 42, 1, &[]);
                m[16] = 42;
                m
            }),
        ] {
            assert!(parse_batch(&data, 1, &mut out, &mut n).is_err(), "{what}");
        }
        let mut err = header(36, NLMSG_ERROR, 1);
        err.extend((-libc::ENOENT).to_ne_bytes());
        err.extend(header(16, 20, 1));
        match parse_batch(&err, 1, &mut out, &mut n) {
            Err(Error::Kernel(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT)),
            other => panic!("expected a kernel error, got {other:?}"),
        }
    }

    /// A real TCP pair on loopback whose reader does not read: the writer's send queue fills
    /// (the reader's receive buffer, then the writer's send buffer), and the dump sees those
    /// bytes; once the reader has read everything, nothing is queued.
    #[test]
    fn sees_bytes_queued_to_a_peer_that_does_not_read() {
        use std::io::{Read, Write};
        let diag = SockDiag::open_current().expect("sock_diag socket");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut writer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut reader, _) = listener.accept().expect("accept");
        writer.set_nonblocking(true).expect("nonblocking");
        let chunk = [7u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match writer.write(&chunk) {
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("write: {e}"),
            }
        }
        assert!(written > 0);
        let port = writer.local_addr().expect("addr").port();
        let ours = |diag: &SockDiag| -> u64 {
            diag.sockets(Kind::TcpSending)
                .expect("dump")
                .iter()
                .filter(|s| s.port == port)
                .map(|s| u64::from(s.wqueue))
                .sum()
        };
        // What the reader's kernel took in (acknowledged) is no longer in the writer's queue;
        // what fills the writer's own send buffer is.
        let queued = ours(&diag);
        assert!(
            queued > 0 && queued <= written,
            "{written} bytes written to a reader that does not read, {queued} queued by sock_diag"
        );
        // The total over the namespace includes ours (others' sockets can only add).
        assert!(diag.tcp_send_queued(0).expect("dump") >= queued);
        // Read everything: the send queue empties (acknowledged on loopback at once).
        writer.set_nonblocking(false).expect("blocking");
        writer
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        let mut all = Vec::new();
        reader.read_to_end(&mut all).expect("read");
        assert_eq!(all.len() as u64, written);
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while ours(&diag) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(ours(&diag), 0, "the writer's queue is empty once read");
    }

    #[test]
    fn sees_own_listener_and_not_a_closed_one() {
        let diag = SockDiag::open_current().expect("sock_diag socket");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let ports = diag.tcp_listening_ports().expect("dump");
        assert!(ports.contains(&port), "port {port} not in {ports:?}");
        // IPv4 answers without asking IPv6; an IPv6 listener is found by the second dump.
        let v6 = std::net::TcpListener::bind("[::1]:0").ok();
        let v6_port = v6
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port());
        assert!(diag.tcp_listening_all(&[port]).expect("dump"));
        if let Some(p6) = v6_port {
            assert!(diag.tcp_listening_all(&[port, p6]).expect("dump"));
        }
        // The DNS check's UDP lookup: a bound socket is found, a closed one is not.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp bind");
        let udp_port = udp.local_addr().expect("addr").port();
        assert!(
            diag.udp_bound(udp_port).expect("udp lookup"),
            "bound UDP {udp_port}"
        );
        assert!(
            diag.udp_bound_ports().expect("dump").contains(&udp_port),
            "the dump agrees"
        );
        drop(udp);
        assert!(
            crate::effects::procfs::gone_soon(|| diag.udp_bound(udp_port).expect("udp lookup")),
            "closed UDP {udp_port} still bound 5 s after"
        );
        let udp6 = std::net::UdpSocket::bind("[::]:0").ok();
        if let Some(p6) = udp6
            .as_ref()
            .and_then(|u| u.local_addr().ok())
            .map(|a| a.port())
        {
            assert!(
                diag.udp_bound(p6).expect("udp lookup"),
                "dual-stack UDP {p6}"
            );
        }
        assert!(
            !diag.lock().exact_unsupported,
            "the exact lookups were used"
        );
        drop(listener);
        assert!(
            crate::effects::procfs::gone_soon(|| diag
                .tcp_listening_ports()
                .expect("dump")
                .contains(&port)),
            "port {port} still listening 5 s after its listener was closed"
        );
        assert!(!diag.tcp_listening_all(&[port]).expect("dump"));
        drop(v6);
    }
}
