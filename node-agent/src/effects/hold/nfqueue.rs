//! A minimal NFQUEUE client over a raw netlink socket (no libnetfilter_queue, no `unsafe`).
//!
//! Owns the wire protocol: bind and configure a queue in ONE config message (so no packet can
//! arrive before the queue is configured), receive queued packets, and give batch verdicts. The
//! socket must be created inside the pod's network namespace (netlink sockets are per netns; see
//! [`crate::effects::netns::PodNetns::run`]); after that any thread may use it.
//!
//! Only the kernel is heard: every datagram's sender (`recvfrom`'s `sockaddr_nl`) must be port
//! id 0, as libnfnetlink checks (`nfnl_recv`: "sender is not kernel"). Any process with
//! `CAP_NET_ADMIN` in the pod's namespace can send netlink messages to this socket's port id
//! (listed in `/proc/net/netfilter/nfnetlink_queue`); such a message is dropped unread and
//! counted (`NfQueue::forged`), and [`crate::effects::hold::HoldQueue`] then fails the pod
//! open. At most `MAX_DATAGRAMS_PER_READ` datagrams are read per call, so a flood can never
//! keep the reader from its stop signal.
//!
//! Configuration: copy 128 bytes of each packet (enough for the IP and TCP headers, from which the
//! flow is read), a large kernel queue, and `NFQA_CFG_F_FAIL_OPEN` so that a full queue or a full
//! socket buffer accepts packets instead of dropping them.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, recvfrom, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr,
    SockFlag, SockProtocol, SockType,
};

// Netlink and nfnetlink_queue constants (linux/netlink.h, linux/netfilter/nfnetlink_queue.h).
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;
const NF_ACCEPT: u32 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Bytes of each packet copied to us: IPv6 (40) + TCP ports, with room for IPv4 options.
const COPY_RANGE: u32 = 128;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open a netfilter netlink socket: {0} (the agent needs CAP_NET_ADMIN)")]
    Socket(Errno),
    #[error("NFQUEUE {queue}: binding failed: {errno} ({hint})")]
    Bind {
        queue: u16,
        errno: Errno,
        hint: &'static str,
    },
    #[error("NFQUEUE {queue}: no answer from the kernel to the bind request within {0:?}", .timeout)]
    BindTimeout { queue: u16, timeout: Duration },
    #[error("NFQUEUE {queue}: netlink I/O failed: {errno}")]
    Io { queue: u16, errno: Errno },
}

/// Result of this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub(crate) const IPPROTO_UDP: u8 = 17;

/// A TCP or UDP flow, read from a queued packet's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// [`IPPROTO_TCP`] or `IPPROTO_UDP`.
    pub protocol: u8,
    pub src: IpAddr,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dst_port: u16,
}

/// A packet the kernel queued to us and that waits for our verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedPacket {
    /// The kernel's id for the verdict (increasing per queue instance).
    pub id: u32,
    /// `None` if the copied bytes are not an IPv4/IPv6 TCP or UDP packet.
    pub flow: Option<Flow>,
}

/// Bytes read per `recv`: one datagram. The kernel sends every queued packet in a datagram of
/// its own (`nfqnl_build_packet_message` allocates one skb per packet, sized for the copy range
/// and the attributes: a few hundred bytes with [`COPY_RANGE`] 128), and acks are smaller still;
/// 8 KiB is what netlink(7) asks readers to allow. It was 64 KiB, one per held pod: up to 7 MiB
/// with 110 pods starting at once (docs/benchmarks.md, "Scale": the peak RSS at 110 pods).
const RECV_BUF: usize = 8 * 1024;

/// Datagrams one [`NfQueue::recv_packets`] reads at most; the caller polls again (and sees its
/// stop signal) before reading more. A burst of 100 SYNs at once is read in one call.
pub(crate) const MAX_DATAGRAMS_PER_READ: usize = 256;

/// What one read from the socket brought.
enum Received {
    /// A datagram from the kernel, of this length, in the buffer.
    Kernel(usize),
    /// A datagram from another socket: dropped (counted in [`NfQueue::forged`]).
    Forged,
}

/// A bound NFQUEUE. Closing it (drop) unbinds the queue, and the kernel then DROPS every packet
/// still waiting for a verdict: accept them first (see [`crate::effects::hold::HoldQueue::release`]).
#[derive(Debug)]
pub(crate) struct NfQueue {
    fd: OwnedFd,
    queue_num: u16,
    seq: u32,
    buf: Vec<u8>,
    /// Packets read while waiting for an ack, handed out by the next `recv_packets`.
    pending: VecDeque<QueuedPacket>,
    /// Datagrams dropped because they were not from the kernel.
    forged: u64,
    /// The port id of the first such sender.
    forged_from: Option<u32>,
}

impl NfQueue {
    /// Opens a netlink socket in the CALLING THREAD's netns and binds queue `queue_num`, with
    /// copy range, max length and fail-open set in the same message.
    pub(crate) fn bind(queue_num: u16, max_len: u32) -> Result<NfQueue> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(Error::Socket)?;
        bind(fd.as_fd().as_raw_fd_compat(), &NetlinkAddr::new(0, 0)).map_err(Error::Socket)?;
        // A large receive buffer so a burst of SYNs is queued, not failed open. Best effort: the
        // forced variant needs CAP_NET_ADMIN, which the agent has.
        if let Err(e) = setsockopt(&fd, sockopt::RcvBufForce, &(4 << 20)) {
            tracing::debug!(error = %e, "SO_RCVBUFFORCE failed, keeping the default buffer");
        }
        let mut queue = NfQueue {
            fd,
            queue_num,
            seq: 0,
            buf: vec![0; RECV_BUF],
            pending: VecDeque::new(),
            forged: 0,
            forged_from: None,
        };

        let mut attrs = Vec::new();
        // struct nfqnl_msg_config_cmd { u8 command; u8 _pad; __be16 pf; }
        put_attr(&mut attrs, NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]);
        // struct nfqnl_msg_config_params { __be32 copy_range; u8 copy_mode; } __packed
        let mut params = COPY_RANGE.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_PACKET);
        put_attr(&mut attrs, NFQA_CFG_PARAMS, &params);
        put_attr(&mut attrs, NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes());
        put_attr(
            &mut attrs,
            NFQA_CFG_MASK,
            &NFQA_CFG_F_FAIL_OPEN.to_be_bytes(),
        );
        put_attr(
            &mut attrs,
            NFQA_CFG_FLAGS,
            &NFQA_CFG_F_FAIL_OPEN.to_be_bytes(),
        );
        let seq = queue.send(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, &attrs)?;
        queue.wait_ack(seq, Duration::from_secs(2))?;
        Ok(queue)
    }

    pub(crate) fn queue_num(&self) -> u16 {
        self.queue_num
    }

    /// Reads the packets available now (non-blocking, at most [`MAX_DATAGRAMS_PER_READ`]
    /// datagrams) into `out`; returns how many were added. Datagrams not from the kernel are
    /// dropped and counted ([`NfQueue::forged`]).
    pub(crate) fn recv_packets(&mut self, out: &mut Vec<QueuedPacket>) -> Result<usize> {
        let before = out.len();
        out.extend(self.pending.drain(..));
        for _ in 0..MAX_DATAGRAMS_PER_READ {
            match self.recv_datagram()? {
                None => break,
                Some(Received::Forged) => {}
                Some(Received::Kernel(len)) => {
                    let mut packets = Vec::new();
                    self.parse_datagram(len, &mut packets, None);
                    out.extend(packets);
                }
            }
        }
        Ok(out.len() - before)
    }

    /// Datagrams dropped so far because their sender was not the kernel, and the first
    /// sender's port id.
    pub(crate) fn forged(&self) -> (u64, Option<u32>) {
        (self.forged, self.forged_from)
    }

    /// Accepts every waiting packet with an id up to and including `max_id` (one batch verdict).
    pub(crate) fn accept_up_to(&mut self, max_id: u32) -> Result<()> {
        let mut attrs = Vec::new();
        // struct nfqnl_msg_verdict_hdr { __be32 verdict; __be32 id; }
        let mut verdict = NF_ACCEPT.to_be_bytes().to_vec();
        verdict.extend_from_slice(&max_id.to_be_bytes());
        put_attr(&mut attrs, NFQA_VERDICT_HDR, &verdict);
        self.send(NFQNL_MSG_VERDICT_BATCH, NLM_F_REQUEST, &attrs)?;
        Ok(())
    }

    /// Waits until the socket is readable or `timeout` passes; `true` if readable.
    pub(crate) fn wait_readable(&self, timeout: Duration) -> Result<bool> {
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(n) => Ok(n > 0),
            Err(Errno::EINTR) => Ok(false),
            Err(errno) => Err(self.io(errno)),
        }
    }

    fn io(&self, errno: Errno) -> Error {
        Error::Io {
            queue: self.queue_num,
            errno,
        }
    }

    /// Sends one nfnetlink message for our queue; returns its sequence number.
    fn send(&mut self, msg_type: u16, flags: u16, attrs: &[u8]) -> Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + 4 + attrs.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | msg_type).to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        // struct nfgenmsg { u8 nfgen_family; u8 version; __be16 res_id; }
        msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
        msg.extend_from_slice(&self.queue_num.to_be_bytes());
        msg.extend_from_slice(attrs);
        loop {
            match sendto(
                self.fd.as_fd().as_raw_fd_compat(),
                &msg,
                &NetlinkAddr::new(0, 0),
                MsgFlags::empty(),
            ) {
                Ok(_) => return Ok(self.seq),
                Err(Errno::EINTR) => continue,
                // The socket is non-blocking; a full send buffer is momentary.
                Err(Errno::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
                Err(errno) => return Err(self.io(errno)),
            }
        }
    }

    /// One datagram into `self.buf`; `None` when nothing is waiting. A datagram whose sender
    /// is not the kernel (port id 0) is counted and reported as forged.
    fn recv_datagram(&mut self) -> Result<Option<Received>> {
        loop {
            // MSG_DONTWAIT as the socket is non-blocking; the address says who sent it.
            match recvfrom::<NetlinkAddr>(self.fd.as_fd().as_raw_fd_compat(), &mut self.buf) {
                Ok((len, from)) => {
                    let sender = from.map_or(0, |a| a.pid());
                    if sender != 0 {
                        self.forged += 1;
                        if self.forged_from.is_none() {
                            self.forged_from = Some(sender);
                            tracing::warn!(
                                queue = self.queue_num,
                                sender,
                                "a netlink message not from the kernel on the hold's queue socket; dropped"
                            );
                        }
                        return Ok(Some(Received::Forged));
                    }
                    return Ok(Some(Received::Kernel(len)));
                }
                Err(Errno::EAGAIN) => return Ok(None),
                Err(Errno::EINTR) => continue,
                // The socket buffer overflowed: those packets were failed open by the kernel.
                Err(Errno::ENOBUFS) => {
                    tracing::warn!(
                        queue = self.queue_num,
                        "NFQUEUE socket overflowed; the kernel accepted the overflow (fail-open)"
                    );
                    continue;
                }
                Err(errno) => return Err(self.io(errno)),
            }
        }
    }

    /// Reads until the ack (or error) for `seq`, keeping packets that arrive meanwhile.
    fn wait_ack(&mut self, seq: u32, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut read = 0usize;
            while let Some(datagram) = self.recv_datagram()? {
                read += 1;
                if read.is_multiple_of(MAX_DATAGRAMS_PER_READ) && Instant::now() >= deadline {
                    // A flood (forged datagrams) must not keep the bind waiting forever.
                    break;
                }
                let Received::Kernel(len) = datagram else {
                    continue;
                };
                let mut packets = Vec::new();
                let mut ack = None;
                self.parse_datagram(len, &mut packets, Some((seq, &mut ack)));
                self.pending.extend(packets);
                if let Some(errno) = ack {
                    if errno == 0 {
                        return Ok(());
                    }
                    let errno = Errno::from_raw(errno);
                    let hint = match errno {
                        Errno::EBUSY | Errno::EPERM => "missing CAP_NET_ADMIN (nfnetlink refuses queue configuration without it: the DaemonSet must add NET_ADMIN), or another process has this queue bound in this netns (another agent, or pick another queue number)",
                        Errno::EINVAL | Errno::EOPNOTSUPP => "the kernel rejected the queue configuration",
                        _ => "is nfnetlink_queue available in this kernel?",
                    };
                    return Err(Error::Bind {
                        queue: self.queue_num,
                        errno,
                        hint,
                    });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::BindTimeout {
                    queue: self.queue_num,
                    timeout,
                });
            }
            self.wait_readable(deadline - now)?;
        }
    }

    /// Parses the netlink messages of one datagram ([`parse_datagram`]). Packets go to
    /// `packets`; an error/ack message matching `ack.0` sets `ack.1` to its errno (0 = success).
    fn parse_datagram(
        &self,
        len: usize,
        packets: &mut Vec<QueuedPacket>,
        mut ack: Option<(u32, &mut Option<i32>)>,
    ) {
        let parsed = parse_datagram(&self.buf[..len.min(self.buf.len())]);
        packets.extend(parsed.packets);
        for (seq, errno) in parsed.acks {
            match ack.as_mut() {
                Some((want, slot)) if *want == seq => **slot = Some(errno),
                _ if errno != 0 => tracing::warn!(
                    queue = self.queue_num,
                    seq,
                    error = %Errno::from_raw(errno),
                    "the kernel reported an error for a netlink request"
                ),
                _ => {}
            }
        }
        if let Some(msg_len) = parsed.malformed_len {
            tracing::warn!(
                queue = self.queue_num,
                msg_len,
                "malformed netlink message, rest of datagram skipped"
            );
        }
    }
}

/// `OwnedFd` → the `AsFd` nix's socket functions take; kept as one helper so the call sites read
/// the same whichever nix signature is in use.
trait AsRawFdCompat {
    fn as_raw_fd_compat(&self) -> std::os::fd::RawFd;
}
impl AsRawFdCompat for BorrowedFd<'_> {
    fn as_raw_fd_compat(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(self)
    }
}

impl AsFd for NfQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What one datagram read from an NFQUEUE socket carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Datagram {
    /// The queued packets, in order.
    pub packets: Vec<QueuedPacket>,
    /// `(nlmsg_seq, errno)` of each `NLMSG_ERROR` message (errno 0: an ack).
    pub acks: Vec<(u32, i32)>,
    /// The length field of a message that did not fit (shorter than a header or longer than
    /// what was left): it and the rest of the datagram were skipped.
    pub malformed_len: Option<usize>,
}

/// Walks the netlink messages of one datagram as the kernel sends them to a queue's socket.
///
/// Layout (the kernel's UAPI headers): each message is a `struct nlmsghdr { __u32 nlmsg_len;
/// __u16 nlmsg_type; __u16 nlmsg_flags; __u32 nlmsg_seq; __u32 nlmsg_pid; }` in host byte order
/// (include/uapi/linux/netlink.h), its length counting the header, the next one at
/// `NLMSG_ALIGN(nlmsg_len)` (4 bytes). `NLMSG_ERROR` carries `struct nlmsgerr { int error; ... }`
/// (negative errno, 0 for an ack); a queued packet is `(NFNL_SUBSYS_QUEUE << 8) |
/// NFQNL_MSG_PACKET` and carries `struct nfgenmsg` then attributes ([`parse_packet`]).
/// Never panics; a message whose length is impossible ends the walk.
pub fn parse_datagram(mut data: &[u8]) -> Datagram {
    let mut out = Datagram::default();
    while data.len() >= NLMSG_HDRLEN {
        let msg_len = read_u32_ne(data, 0) as usize;
        if msg_len < NLMSG_HDRLEN || msg_len > data.len() {
            out.malformed_len = Some(msg_len);
            break;
        }
        let msg_type = read_u16_ne(data, 4);
        let seq = read_u32_ne(data, 8);
        let body = &data[NLMSG_HDRLEN..msg_len];
        match msg_type {
            NLMSG_ERROR if body.len() >= 4 => {
                let code = i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
                // `wrapping_neg`: a negated i32::MIN must not overflow (a panic in debug).
                out.acks.push((seq, code.wrapping_neg()));
            }
            NLMSG_DONE => {}
            t if t == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET => {
                if let Some(packet) = parse_packet(body) {
                    out.packets.push(packet);
                }
            }
            _ => {}
        }
        let aligned = align4(msg_len);
        if aligned >= data.len() {
            break;
        }
        data = &data[aligned..];
    }
    out
}

/// A queued packet's message body: `struct nfgenmsg` (4 bytes) then netlink attributes, each
/// `struct nlattr { __u16 nla_len; __u16 nla_type; }` (host order, length counting the header,
/// the next at a 4-byte boundary; the top two bits of the type are flags). Of nfnetlink_queue's
/// attributes (include/uapi/linux/netfilter/nfnetlink_queue.h, `enum nfqnl_attr_type`) two are
/// read: `NFQA_PACKET_HDR` (1), `struct nfqnl_msg_packet_hdr { __be32 packet_id; __be16
/// hw_protocol; __u8 hook; } __packed`, and `NFQA_PAYLOAD` (10), the packet's first bytes (the
/// copy range). `None` without a packet id (no verdict could be given). Never panics.
pub fn parse_packet(body: &[u8]) -> Option<QueuedPacket> {
    let mut attrs = body.get(4..)?;
    let mut id = None;
    let mut flow = None;
    while attrs.len() >= 4 {
        let attr_len = read_u16_ne(attrs, 0) as usize;
        let attr_type = read_u16_ne(attrs, 2) & NLA_TYPE_MASK;
        if attr_len < 4 || attr_len > attrs.len() {
            break;
        }
        let value = &attrs[4..attr_len];
        match attr_type {
            // struct nfqnl_msg_packet_hdr { __be32 packet_id; __be16 hw_protocol; u8 hook; }
            NFQA_PACKET_HDR if value.len() >= 4 => {
                id = Some(u32::from_be_bytes([value[0], value[1], value[2], value[3]]));
            }
            NFQA_PAYLOAD => flow = parse_flow(value),
            _ => {}
        }
        let aligned = align4(attr_len);
        if aligned >= attrs.len() {
            break;
        }
        attrs = &attrs[aligned..];
    }
    id.map(|id| QueuedPacket { id, flow })
}

/// The TCP or UDP flow of an IPv4 or IPv6 packet (IPv6 without extension headers, as SYNs and
/// DNS queries are).
pub fn parse_flow(packet: &[u8]) -> Option<Flow> {
    let version = packet.first()? >> 4;
    let is_held_protocol = |p: u8| p == IPPROTO_TCP || p == IPPROTO_UDP;
    let (protocol, src, dst, tcp) = match version {
        4 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let protocol = *packet.get(9)?;
            if ihl < 20 || !is_held_protocol(protocol) {
                return None;
            }
            let src: [u8; 4] = packet.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
            (
                protocol,
                IpAddr::V4(Ipv4Addr::from(src)),
                IpAddr::V4(Ipv4Addr::from(dst)),
                packet.get(ihl..)?,
            )
        }
        6 => {
            let protocol = *packet.get(6)?;
            if !is_held_protocol(protocol) {
                return None;
            }
            let src: [u8; 16] = packet.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = packet.get(24..40)?.try_into().ok()?;
            (
                protocol,
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                packet.get(40..)?,
            )
        }
        _ => return None,
    };
    // TCP and UDP headers both start with the source and destination ports.
    let ports = tcp.get(..4)?;
    Some(Flow {
        protocol,
        src,
        src_port: u16::from_be_bytes([ports[0], ports[1]]),
        dst,
        dst_port: u16::from_be_bytes([ports[2], ports[3]]),
    })
}

fn put_attr(out: &mut Vec<u8>, attr_type: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&attr_type.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + (align4(len) - len), 0);
}

fn align4(len: usize) -> usize {
    (len + 3) & !3
}

fn read_u16_ne(data: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([data[at], data[at + 1]])
}

fn read_u32_ne(data: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

/// Packets waiting in one queue of the calling thread's netns, from
/// `/proc/thread-self/net/netfilter/nfnetlink_queue` (`queue_total`, third column). `None` when
/// the queue is not bound (no line for it) or the file is unreadable.
pub fn kernel_queue_waiting(queue_num: u16) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue").ok()?;
    parse_queue_waiting(&text, queue_num)
}

/// Parses the `nfnetlink_queue` proc file: `queue_num peer_portid queue_total copy_mode ...`.
pub fn parse_queue_waiting(text: &str, queue_num: u16) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let num: u16 = fields.next()?.parse().ok()?;
        let _portid = fields.next()?;
        let total: u64 = fields.next()?.parse().ok()?;
        (num == queue_num).then_some(total)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_of_ipv4_syn() {
        let mut packet = vec![0u8; 40];
        packet[0] = 0x45;
        packet[9] = 6;
        packet[12..16].copy_from_slice(&[127, 0, 0, 1]);
        packet[16..20].copy_from_slice(&[127, 0, 0, 1]);
        packet[20..22].copy_from_slice(&40000u16.to_be_bytes());
        packet[22..24].copy_from_slice(&15001u16.to_be_bytes());
        let flow = parse_flow(&packet).expect("flow");
        assert_eq!(flow.src_port, 40000);
        assert_eq!(flow.dst_port, 15001);
        assert_eq!(flow.dst, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(parse_flow(&packet[..21]), None);
        assert_eq!(parse_flow(&[]), None);
        packet[9] = IPPROTO_UDP;
        let udp = parse_flow(&packet).expect("udp flow");
        assert_eq!((udp.protocol, udp.dst_port), (IPPROTO_UDP, 15001));
        packet[9] = 1; // ICMP
        assert_eq!(parse_flow(&packet), None);
        packet[0] = 0x4f; // IHL past the copied bytes
        packet[9] = IPPROTO_TCP;
        assert_eq!(parse_flow(&packet), None);
    }

    #[test]
    fn flow_of_ipv6_dns_query() {
        let mut packet = vec![0u8; 48];
        packet[0] = 0x60;
        packet[6] = IPPROTO_UDP;
        packet[23] = 1; // src ::1
        packet[39] = 1; // dst ::1
        packet[40..42].copy_from_slice(&51000u16.to_be_bytes());
        packet[42..44].copy_from_slice(&15053u16.to_be_bytes());
        let flow = parse_flow(&packet).expect("flow");
        assert_eq!(flow.protocol, IPPROTO_UDP);
        assert_eq!(flow.dst, IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!((flow.src_port, flow.dst_port), (51000, 15053));
        assert_eq!(parse_flow(&packet[..42]), None);
        packet[6] = 58; // ICMPv6
        assert_eq!(parse_flow(&packet), None);
    }

    #[test]
    fn packet_message_round_trip() {
        let mut body = vec![0u8, 0, 0x3a, 0x97];
        let mut hdr = 7u32.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[0x08, 0x00, 3]);
        put_attr(&mut body, NFQA_PACKET_HDR, &hdr);
        let parsed = parse_packet(&body).expect("packet");
        assert_eq!(parsed.id, 7);
        assert_eq!(parsed.flow, None);
        assert_eq!(parse_packet(&[1, 2]), None);
        // A lying attribute length stops parsing without panicking.
        assert_eq!(parse_packet(&[0, 0, 0, 0, 0xff, 0xff, 1, 0]), None);
    }

    #[test]
    fn queue_proc_file() {
        let text = "15015  12345     3 2   128     0     0       17  1\n    0    999     0 2 65535     0     0        0  1\n";
        assert_eq!(parse_queue_waiting(text, 15015), Some(3));
        assert_eq!(parse_queue_waiting(text, 0), Some(0));
        assert_eq!(parse_queue_waiting(text, 1), None);
        assert_eq!(parse_queue_waiting("garbage", 1), None);
    }
}
