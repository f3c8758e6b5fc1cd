//! A LAN attacker's mDNS: raw responses written byte by byte (RFC 1035 §4, RFC 6762 §10.2 for
//! the cache-flush bit), so that a test can send what no well-behaved responder would: hundreds
//! of fake `_hawser-join._tcp` adverts, an A record for another host's name, a goodbye for
//! another responder's instance.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use hawser_mesh_device::netns::{self, must};

const GROUP: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    Ipv4Addr::new(224, 0, 0, 251),
    5353,
));
const SERVICE: &str = "_hawser-join._tcp.local.";
const TYPE_A: u16 = 1;
const TYPE_PTR: u16 = 12;
const TYPE_TXT: u16 = 16;
const TYPE_SRV: u16 = 33;
const CLASS_IN: u16 = 1;
/// Class IN with the cache-flush bit: this record replaces the cached ones of its name.
const CLASS_IN_FLUSH: u16 = 0x8001;

/// A fake advert: instance, host name, address, port, TXT strings.
pub struct Fake {
    pub instance: String,
    pub host: String,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub txt: Vec<String>,
}

/// mDNS port 5353 of an attacker's namespace, sending to the group or to one node.
pub struct Forger {
    socket: UdpSocket,
    to: SocketAddr,
}

impl Forger {
    /// A socket in namespace `ns` sending to one node's port 5353 only (unicast, which mDNS
    /// receivers take in too): the responder whose records it forges never hears it, and so
    /// cannot defend them.
    pub fn aimed_at(ns: &str, node: Ipv4Addr) -> Forger {
        let mut forger = Forger::new_in(ns);
        forger.to = SocketAddr::from((node, 5353));
        forger
    }

    /// A socket in namespace `ns` (which gets a multicast route on its `eth0`).
    pub fn new_in(ns: &str) -> Forger {
        must(&["ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0"]);
        let socket = netns::in_namespace(ns, || {
            let socket = UdpSocket::bind("0.0.0.0:5353").unwrap();
            socket.set_multicast_ttl_v4(255).unwrap();
            socket
        });
        Forger { socket, to: GROUP }
    }

    /// Announces `fake` (PTR, SRV, TXT, A), with record TTL `ttl` seconds.
    pub fn advertise(&self, fake: &Fake, ttl: u32) {
        let fullname = format!("{}.{SERVICE}", fake.instance);
        let mut ptr = Vec::new();
        name(&mut ptr, &fullname);
        let mut srv = vec![0, 0, 0, 0];
        srv.extend(fake.port.to_be_bytes());
        name(&mut srv, &fake.host);
        let mut txt = Vec::new();
        for string in &fake.txt {
            txt.push(u8::try_from(string.len()).unwrap());
            txt.extend(string.as_bytes());
        }
        self.send(&[
            (SERVICE, TYPE_PTR, CLASS_IN, ttl, ptr),
            (&fullname, TYPE_SRV, CLASS_IN_FLUSH, ttl, srv),
            (&fullname, TYPE_TXT, CLASS_IN_FLUSH, ttl, txt),
            (
                &fake.host,
                TYPE_A,
                CLASS_IN_FLUSH,
                ttl,
                fake.ip.octets().to_vec(),
            ),
        ]);
    }

    /// An A record for `host` (someone else's), replacing what caches hold for it.
    pub fn address(&self, host: &str, ip: Ipv4Addr) {
        self.send(&[(host, TYPE_A, CLASS_IN_FLUSH, 120, ip.octets().to_vec())]);
    }

    /// A goodbye for `host`'s address `ip` (the A record with TTL 0; someone else's).
    pub fn address_goodbye(&self, host: &str, ip: Ipv4Addr) {
        self.send(&[(host, TYPE_A, CLASS_IN, 0, ip.octets().to_vec())]);
    }

    /// A goodbye (the PTR record with TTL 0) for `instance` (someone else's).
    pub fn goodbye(&self, instance: &str) {
        let mut ptr = Vec::new();
        name(&mut ptr, &format!("{instance}.{SERVICE}"));
        self.send(&[(SERVICE, TYPE_PTR, CLASS_IN, 0, ptr)]);
    }

    fn send(&self, records: &[(&str, u16, u16, u32, Vec<u8>)]) {
        // Header: id 0, a response (QR) with authority (AA), answers only.
        let count = u16::try_from(records.len()).unwrap();
        let mut packet = vec![0, 0, 0x84, 0, 0, 0];
        packet.extend(count.to_be_bytes());
        packet.extend([0, 0, 0, 0]);
        for (owner, rtype, class, ttl, rdata) in records {
            name(&mut packet, owner);
            packet.extend(rtype.to_be_bytes());
            packet.extend(class.to_be_bytes());
            packet.extend(ttl.to_be_bytes());
            packet.extend(u16::try_from(rdata.len()).unwrap().to_be_bytes());
            packet.extend(rdata);
        }
        self.socket.send_to(&packet, self.to).unwrap();
    }
}

/// A domain name, uncompressed.
fn name(out: &mut Vec<u8>, dotted: &str) {
    for label in dotted.trim_end_matches('.').split('.') {
        out.push(u8::try_from(label.len()).unwrap());
        out.extend(label.as_bytes());
    }
    out.push(0);
}
