//! A tiny DNS server for the simulated node: the cluster DNS stand-in in the remote namespace
//! (what a pod's `/etc/resolv.conf` names) and pilot-agent's DNS proxy on `localhost:15053`
//! (`sim-app dns-proxy`, started by the pilot-agent stand-in when DNS capture is on).
//!
//! It answers A and AAAA questions for the names of a static table and NXDOMAIN for any other
//! name (so a resolver's search list moves on), over UDP and TCP (RFC 1035 §4.2.2: two-byte
//! length prefix). Only the subset a stub resolver sends is parsed — one question, no
//! compression in it — with every read bounds-checked; anything else gets FORMERR or is dropped.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use super::netns::{REMOTE_IP, REMOTE_IP6};

/// The remote services' name, as an app in namespace `default` resolves it (`remote`, completed
/// by the search list of the pod's resolv.conf).
pub const REMOTE_SERVICE: &str = "remote.default.svc.cluster.local";
/// The short name apps look up.
pub const REMOTE_SHORT_NAME: &str = "remote";

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_FORMERR: u16 = 1;
const RCODE_NXDOMAIN: u16 = 3;
const RCODE_NOTIMP: u16 = 4;
/// Header length (RFC 1035 §4.1.1).
const HEADER_LEN: usize = 12;

/// Names and their addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameTable {
    entries: Vec<(String, Vec<IpAddr>)>,
}

impl NameTable {
    /// The simulated cluster's names: the remote services, on both families.
    pub fn sim_cluster() -> NameTable {
        NameTable::sim_cluster_at(REMOTE_IP)
    }

    /// The simulated cluster's names with the remote services' IPv4 address `v4` (on the
    /// containerd backend each node has its own).
    pub fn sim_cluster_at(v4: Ipv4Addr) -> NameTable {
        NameTable {
            entries: vec![(
                REMOTE_SERVICE.to_string(),
                vec![IpAddr::V4(v4), IpAddr::V6(REMOTE_IP6)],
            )],
        }
    }

    /// Addresses of `name` (case-insensitive, trailing dot ignored); `None` if unknown.
    pub fn lookup(&self, name: &str) -> Option<&[IpAddr]> {
        let name = name.trim_end_matches('.');
        self.entries
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, a)| a.as_slice())
    }
}

/// The one question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Question {
    name: String,
    qtype: u16,
    qclass: u16,
    /// The question's bytes, echoed in the answer.
    raw: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parses the question section starting at `HEADER_LEN`. `None` on anything malformed or
/// outside the subset (compression pointers, names over 255 bytes).
fn parse_question(msg: &[u8]) -> Option<Question> {
    let mut at = HEADER_LEN;
    let mut labels: Vec<String> = Vec::new();
    let mut name_len = 0usize;
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // 0xC0: a compression pointer (never in a stub resolver's question); 0x40/0x80: reserved.
        if len & 0xC0 != 0 {
            return None;
        }
        name_len += len + 1;
        if name_len > 255 {
            return None;
        }
        let label = msg.get(at..at + len)?;
        labels.push(String::from_utf8_lossy(label).into_owned());
        at += len;
    }
    let qtype = u16_at(msg, at)?;
    let qclass = u16_at(msg, at + 2)?;
    let raw = msg.get(HEADER_LEN..at + 4)?.to_vec();
    Some(Question {
        name: labels.join("."),
        qtype,
        qclass,
        raw,
    })
}

/// The answer to one query message, or `None` when it should be dropped (not a query, too
/// short to carry an id).
pub fn answer(table: &NameTable, query: &[u8]) -> Option<Vec<u8>> {
    let id = u16_at(query, 0)?;
    let flags = u16_at(query, 2)?;
    if flags & 0x8000 != 0 {
        return None; // a response, not a query
    }
    let opcode = flags & 0x7800;
    let rd = flags & 0x0100;
    // QR=1, the query's opcode and RD, RA=1.
    let reply_flags = |rcode: u16| 0x8000 | opcode | rd | 0x0080 | rcode;
    let header = |flags: u16, qd: u16, an: u16| {
        let mut h = Vec::with_capacity(HEADER_LEN);
        for v in [id, flags, qd, an, 0, 0] {
            h.extend_from_slice(&v.to_be_bytes());
        }
        h
    };
    if opcode != 0 {
        return Some(header(reply_flags(RCODE_NOTIMP), 0, 0));
    }
    let question = match (u16_at(query, 4), parse_question(query)) {
        (Some(1), Some(q)) => q,
        _ => return Some(header(reply_flags(RCODE_FORMERR), 0, 0)),
    };
    let Some(addrs) = table.lookup(&question.name) else {
        let mut out = header(reply_flags(RCODE_NXDOMAIN), 1, 0);
        out.extend_from_slice(&question.raw);
        return Some(out);
    };
    // A known name: the addresses of the asked family (none is NODATA: NOERROR, no answer).
    let rdatas: Vec<Vec<u8>> = if question.qclass != CLASS_IN {
        Vec::new()
    } else {
        addrs
            .iter()
            .filter_map(|a| match (a, question.qtype) {
                (IpAddr::V4(v4), TYPE_A) => Some(v4.octets().to_vec()),
                (IpAddr::V6(v6), TYPE_AAAA) => Some(v6.octets().to_vec()),
                _ => None,
            })
            .collect()
    };
    let mut out = header(reply_flags(0), 1, rdatas.len() as u16);
    out.extend_from_slice(&question.raw);
    for rdata in rdatas {
        out.extend_from_slice(&0xC00Cu16.to_be_bytes()); // the name: pointer to the question
        out.extend_from_slice(&question.qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&30u32.to_be_bytes()); // TTL, as Istio's DNS proxy uses
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&rdata);
    }
    Some(out)
}

/// Serves UDP queries on `socket` until it fails.
pub fn serve_udp(socket: UdpSocket, table: Arc<NameTable>) {
    let mut buf = [0u8; 1500];
    loop {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if let Some(reply) = answer(&table, &buf[..n]) {
            let _ = socket.send_to(&reply, from);
        }
    }
}

/// Serves TCP queries (length-prefixed, several per connection) on `listener` until it fails.
pub fn serve_tcp(listener: TcpListener, table: Arc<NameTable>) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let table = table.clone();
        let _ = std::thread::Builder::new()
            .name("dns-tcp".into())
            .spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                loop {
                    let mut len = [0u8; 2];
                    if conn.read_exact(&mut len).is_err() {
                        return;
                    }
                    let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    if conn.read_exact(&mut query).is_err() {
                        return;
                    }
                    let Some(reply) = answer(&table, &query) else {
                        return;
                    };
                    let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&reply);
                    if conn.write_all(&framed).is_err() {
                        return;
                    }
                }
            });
    }
}

/// Binds UDP and TCP on `addr` and serves `table` on both from background threads.
pub fn serve(addr: std::net::SocketAddr, table: Arc<NameTable>) -> io::Result<()> {
    let udp = UdpSocket::bind(addr)?;
    let tcp = TcpListener::bind(addr)?;
    let t = table.clone();
    std::thread::Builder::new()
        .name(format!("dns-udp-{addr}"))
        .spawn(move || serve_udp(udp, t))?;
    std::thread::Builder::new()
        .name(format!("dns-tcp-{addr}"))
        .spawn(move || serve_tcp(tcp, table))?;
    Ok(())
}

/// Binds UDP only on `addr` and serves `table` from a background thread: kuma-dp's embedded DNS
/// proxy (kumahq/kuma v2.14.3 app/kuma-dp/pkg/dataplane/dnsproxy/component.go: one
/// `dns.Server{..., Net: "udp"}` per address; no TCP listener).
pub fn serve_udp_only(addr: std::net::SocketAddr, table: Arc<NameTable>) -> io::Result<()> {
    let udp = UdpSocket::bind(addr)?;
    std::thread::Builder::new()
        .name(format!("dns-udp-{addr}"))
        .spawn(move || serve_udp(udp, table))?;
    Ok(())
}

/// A pod's `/etc/resolv.conf` as kubelet writes it for `dnsPolicy: ClusterFirst`
/// (pkg/kubelet/network/dns/dns.go: the cluster DNS servers, the namespace's search list,
/// `options ndots:5`).
pub fn pod_resolv_conf(namespace: &str, nameserver: IpAddr) -> String {
    format!(
        "search {namespace}.svc.cluster.local svc.cluster.local cluster.local\nnameserver {nameserver}\noptions ndots:5\n"
    )
}

/// The loopback address of an address's family (where Istio's REDIRECT sends it).
pub fn loopback_of(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut q = Vec::new();
        for v in [id, 0x0100, 1, 0, 0, 0] {
            q.extend_from_slice(&v.to_be_bytes());
        }
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    #[test]
    fn answers_a_and_aaaa_for_known_names() {
        let t = NameTable::sim_cluster();
        let q = query(0xbeef, "Remote.default.svc.cluster.local", TYPE_A);
        let a = answer(&t, &q).expect("answer");
        assert_eq!(&a[..2], &[0xbe, 0xef]);
        assert_eq!(u16_at(&a, 2), Some(0x8180)); // QR RD RA, NOERROR
        assert_eq!(u16_at(&a, 6), Some(1)); // one answer
        assert_eq!(&a[a.len() - 4..], &REMOTE_IP.octets());
        let q6 = query(2, REMOTE_SERVICE, TYPE_AAAA);
        let a6 = answer(&t, &q6).expect("answer");
        assert_eq!(&a6[a6.len() - 16..], &REMOTE_IP6.octets());
    }

    #[test]
    fn unknown_names_get_nxdomain_with_the_question() {
        let t = NameTable::sim_cluster();
        let q = query(7, "remote.svc.cluster.local", TYPE_A);
        let a = answer(&t, &q).expect("answer");
        assert_eq!(u16_at(&a, 2).map(|f| f & 0xf), Some(RCODE_NXDOMAIN));
        assert_eq!(&a[HEADER_LEN..], &q[HEADER_LEN..]);
    }

    #[test]
    fn malformed_queries_never_panic() {
        let t = NameTable::sim_cluster();
        assert_eq!(answer(&t, &[]), None);
        assert_eq!(answer(&t, &[1]), None);
        let mut q = query(1, REMOTE_SERVICE, TYPE_A);
        for cut in 0..q.len() {
            let _ = answer(&t, &q[..cut]);
        }
        // A label length past the end, a compression pointer: FORMERR.
        q[HEADER_LEN] = 63;
        q.truncate(HEADER_LEN + 5);
        let a = answer(&t, &q).expect("formerr");
        assert_eq!(u16_at(&a, 2).map(|f| f & 0xf), Some(RCODE_FORMERR));
        let mut p = query(1, "x", TYPE_A);
        p[HEADER_LEN] = 0xC0;
        let a = answer(&t, &p).expect("formerr");
        assert_eq!(u16_at(&a, 2).map(|f| f & 0xf), Some(RCODE_FORMERR));
        // A response is dropped, not answered.
        let mut r = query(1, "x", TYPE_A);
        r[2] |= 0x80;
        assert_eq!(answer(&t, &r), None);
    }

    #[test]
    fn resolv_conf_has_kubelets_shape() {
        let text = pod_resolv_conf("default", IpAddr::V4(REMOTE_IP));
        assert!(text.contains("search default.svc.cluster.local svc.cluster.local cluster.local"));
        assert!(text.contains("nameserver 198.18.0.1\n"));
        assert!(text.contains("options ndots:5"));
    }
}
