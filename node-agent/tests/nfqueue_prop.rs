//! Property tests of the NFQUEUE receive path (issue 11, "Fuzz the parsers"): the netlink
//! message walk ([`parse_datagram`]), the attribute walk of a queued packet ([`parse_packet`])
//! and the flow read from its payload. Real datagrams captured from this kernel
//! (`tests/corpus/nfqueue-datagrams.txt`) are replayed first; then arbitrary, generated and
//! mutated datagrams: never a panic, generated packets read back, truncation loses only the
//! messages cut.
//!
//! The wire layout generated here is the kernel's (UAPI headers, checked via the code search of
//! torvalds/linux): `struct nlmsghdr { __u32 nlmsg_len; __u16 nlmsg_type; __u16 nlmsg_flags;
//! __u32 nlmsg_seq; __u32 nlmsg_pid; }` (include/uapi/linux/netlink.h, host byte order, messages
//! 4-byte aligned), `struct nlmsgerr { int error; struct nlmsghdr msg; }` for NLMSG_ERROR (2),
//! `struct nfgenmsg { __u8 nfgen_family; __u8 version; __be16 res_id; }`
//! (include/uapi/linux/netfilter/nfnetlink.h), then `struct nlattr { __u16 nla_len; __u16
//! nla_type; }` attributes; from include/uapi/linux/netfilter/nfnetlink_queue.h: message type
//! `NFQNL_MSG_PACKET` (0) of subsystem `NFNL_SUBSYS_QUEUE` (3), attributes `NFQA_PACKET_HDR`
//! (1: `struct nfqnl_msg_packet_hdr { __be32 packet_id; __be16 hw_protocol; __u8 hook; }
//! __packed`), `NFQA_MARK` (3), `NFQA_TIMESTAMP` (4), `NFQA_IFINDEX_INDEV`/`OUTDEV` (5, 6),
//! `NFQA_HWADDR` (9), `NFQA_PAYLOAD` (10).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use holdfast::effects::hold::nfqueue::{
    parse_datagram, parse_packet, Flow, QueuedPacket, IPPROTO_TCP,
};
use proptest::prelude::*;

const CASES: u32 = 256;
const NFQNL_PACKET: u16 = 3 << 8;
const NLMSG_ERROR: u16 = 2;

/// The datagrams of the corpus, by name.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/nfqueue-datagrams.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, hex) = l.split_once('\t').expect("name<TAB>hex");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (name.to_string(), bytes)
        })
        .collect()
}

fn corpus_entry(name: &str) -> Vec<u8> {
    corpus()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("no {name} in the corpus"))
}

#[test]
fn corpus_bind_ack() {
    let d = parse_datagram(&corpus_entry("bind-ack"));
    assert_eq!(d.acks, vec![(1, 0)], "{d:?}");
    assert!(d.packets.is_empty() && d.malformed_len.is_none());
}

/// The SYN of a connect() to `[lo]:15001` from `src_port`, queued first (id 1).
fn assert_corpus_syn(name: &str, lo: IpAddr, src_port: u16) {
    let d = parse_datagram(&corpus_entry(name));
    let flow = Flow {
        protocol: IPPROTO_TCP,
        src: lo,
        src_port,
        dst: lo,
        dst_port: 15001,
    };
    let want = QueuedPacket {
        id: 1,
        flow: Some(flow),
    };
    assert_eq!(d.packets, vec![want], "{name}: {d:?}");
    assert!(d.acks.is_empty() && d.malformed_len.is_none(), "{name}");
}

#[test]
fn corpus_syn_ipv4() {
    assert_corpus_syn("syn-ipv4", IpAddr::V4(Ipv4Addr::LOCALHOST), 39214);
}

#[test]
fn corpus_syn_ipv6() {
    assert_corpus_syn("syn-ipv6", IpAddr::V6(Ipv6Addr::LOCALHOST), 49188);
}

#[test]
fn corpus_truncated_at_every_length() {
    for (name, bytes) in corpus() {
        for cut in 0..bytes.len() {
            let d = parse_datagram(&bytes[..cut]);
            assert!(
                d.packets.is_empty() && d.acks.is_empty(),
                "{name} cut at {cut}: {d:?}"
            );
        }
    }
}

/// An error message whose code is `i32::MIN`: negating it overflowed (a panic in a debug
/// build) before the walk became `parse_datagram`.
#[test]
fn error_code_i32_min_does_not_overflow() {
    let mut bytes = Vec::new();
    let mut err = i32::MIN.to_ne_bytes().to_vec();
    err.extend_from_slice(&[0u8; 16]);
    message(&mut bytes, NLMSG_ERROR, 9, &err);
    assert_eq!(parse_datagram(&bytes).acks, vec![(9, i32::MIN)]);
}

// ---- builders ------------------------------------------------------------------------------

fn attr(out: &mut Vec<u8>, attr_type: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&attr_type.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + (4 - len % 4) % 4, 0);
}

/// One netlink message; returns where it ends unpadded (the walk reads it whole from there).
fn message(out: &mut Vec<u8>, msg_type: u16, seq: u32, body: &[u8]) -> usize {
    let len = 16 + body.len();
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&msg_type.to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(body);
    let end = out.len();
    out.resize(out.len() + (4 - len % 4) % 4, 0);
    end
}

/// A TCP SYN's first bytes (IPv4 with `opts` option words, or IPv6) for `flow`.
fn syn_bytes(flow: &Flow, opts: usize) -> Vec<u8> {
    let mut p = match (flow.src, flow.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ihl = 5 + opts;
            let mut p = vec![0u8; ihl * 4];
            p[0] = 0x40 | ihl as u8;
            p[9] = flow.protocol;
            p[12..16].copy_from_slice(&s.octets());
            p[16..20].copy_from_slice(&d.octets());
            p
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut p = vec![0u8; 40];
            p[0] = 0x60;
            p[6] = flow.protocol;
            p[8..24].copy_from_slice(&s.octets());
            p[24..40].copy_from_slice(&d.octets());
            p
        }
        _ => unreachable!("flows are generated with one family"),
    };
    p.extend_from_slice(&flow.src_port.to_be_bytes());
    p.extend_from_slice(&flow.dst_port.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0xa0, 0x02, 0xff, 0xff]);
    p
}

/// What a generated packet message carries.
#[derive(Debug, Clone)]
struct Queued {
    id: u32,
    flow: Flow,
    ip_opts: usize,
    /// Attributes the parser skips, before and after the ones it reads: (type, value).
    others: Vec<(u16, Vec<u8>)>,
}

impl Queued {
    fn body(&self) -> Vec<u8> {
        let family = if self.flow.src.is_ipv4() { 2 } else { 10 };
        let mut b = vec![family, 0, 0x3a, 0x97];
        let (before, after) = self.others.split_at(self.others.len() / 2);
        for (t, v) in before {
            attr(&mut b, *t, v);
        }
        let mut hdr = self.id.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[0x08, 0x00, 3]);
        attr(&mut b, 1, &hdr);
        attr(&mut b, 10, &syn_bytes(&self.flow, self.ip_opts));
        for (t, v) in after {
            attr(&mut b, *t, v);
        }
        b
    }

    fn expected(&self) -> QueuedPacket {
        QueuedPacket {
            id: self.id,
            flow: Some(self.flow),
        }
    }
}

fn flow() -> impl Strategy<Value = Flow> {
    let addrs = prop_oneof![
        (any::<[u8; 4]>(), any::<[u8; 4]>()).prop_map(|(s, d)| (IpAddr::from(s), IpAddr::from(d))),
        (any::<[u8; 16]>(), any::<[u8; 16]>())
            .prop_map(|(s, d)| (IpAddr::from(s), IpAddr::from(d))),
    ];
    (
        addrs,
        any::<u16>(),
        any::<u16>(),
        prop_oneof![Just(6u8), Just(17u8)],
    )
        .prop_map(|((src, dst), src_port, dst_port, protocol)| Flow {
            protocol,
            src,
            src_port,
            dst,
            dst_port,
        })
}

fn queued() -> impl Strategy<Value = Queued> {
    // Skipped attributes: mark, timestamp, in/out ifindex, hwaddr, and types the parser does not
    // know, some with the NLA_F_NESTED / NLA_F_NET_BYTEORDER flag bits set.
    let other = (
        prop_oneof![Just(3u16), Just(4), Just(5), Just(6), Just(9), 11u16..40],
        prop_oneof![Just(0u16), Just(0x4000), Just(0x8000)],
        proptest::collection::vec(any::<u8>(), 0..20),
    )
        .prop_map(|(t, flags, v)| (t | flags, v));
    (
        any::<u32>(),
        flow(),
        0usize..11,
        proptest::collection::vec(other, 0..5),
    )
        .prop_map(|(id, flow, ip_opts, others)| Queued {
            id,
            flow,
            ip_opts: if flow.src.is_ipv4() { ip_opts } else { 0 },
            others,
        })
}

/// A datagram of packets, with an ack (seq, errno) somewhere among them; returns the bytes and
/// where each message ends.
fn datagram(packets: &[Queued], ack: Option<(usize, u32, i32)>) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::new();
    let mut ends = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        if let Some((_, seq, errno)) = ack.filter(|a| a.0 == i) {
            let mut err = errno.wrapping_neg().to_ne_bytes().to_vec();
            err.extend_from_slice(&[0u8; 16]);
            ends.push(message(&mut out, NLMSG_ERROR, seq, &err));
        }
        ends.push(message(&mut out, NFQNL_PACKET, 0, &p.body()));
    }
    (out, ends)
}

// ---- properties ----------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn datagram_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let d = parse_datagram(&bytes);
        prop_assert!(d.packets.len() + d.acks.len() <= bytes.len() / 16);
    }

    #[test]
    fn packet_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_packet(&bytes);
    }

    #[test]
    fn generated_datagrams_read_back(packets in proptest::collection::vec(queued(), 1..6),
                                     ack in proptest::option::of((0usize..6, any::<u32>(), any::<i32>()))) {
        let ack = ack.map(|(at, seq, errno)| (at % packets.len(), seq, errno));
        let (bytes, _) = datagram(&packets, ack);
        let d = parse_datagram(&bytes);
        let want: Vec<QueuedPacket> = packets.iter().map(Queued::expected).collect();
        prop_assert_eq!(d.packets, want);
        prop_assert_eq!(d.acks, ack.map(|(_, seq, errno)| (seq, errno)).into_iter().collect::<Vec<_>>());
        prop_assert_eq!(d.malformed_len, None);
    }

    #[test]
    fn truncation_loses_only_the_messages_cut(packets in proptest::collection::vec(queued(), 1..5),
                                              cut in any::<prop::sample::Index>()) {
        let (bytes, ends) = datagram(&packets, None);
        let cut = cut.index(bytes.len());
        let d = parse_datagram(&bytes[..cut]);
        let whole = ends.iter().filter(|e| **e <= cut).count();
        let want: Vec<QueuedPacket> = packets[..whole].iter().map(Queued::expected).collect();
        prop_assert_eq!(d.packets, want);
    }

    #[test]
    fn mutated_datagrams_never_panic(packets in proptest::collection::vec(queued(), 1..4),
                                     flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let (mut bytes, _) = datagram(&packets, None);
        for (at, b) in &flips {
            let i = at.index(bytes.len());
            bytes[i] = *b;
        }
        let d = parse_datagram(&bytes);
        // Whatever is read, its id is four bytes of the datagram (nothing made up).
        for p in &d.packets {
            let id = p.id.to_be_bytes();
            prop_assert!(bytes.windows(4).any(|w| w == id), "{:?}", p);
        }
    }

    #[test]
    fn a_packet_without_its_id_is_not_returned(q in queued()) {
        // The same message without NFQA_PACKET_HDR: no verdict could be given, so no packet.
        let mut body = q.body();
        let family = body[0];
        body.truncate(4);
        body[0] = family;
        attr(&mut body, 10, &syn_bytes(&q.flow, q.ip_opts));
        prop_assert_eq!(parse_packet(&body), None);
    }
}
