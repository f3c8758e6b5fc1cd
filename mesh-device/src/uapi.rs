//! The cross-platform WireGuard configuration protocol ("UAPI") as boringtun 0.7 speaks it over
//! the tunnel's control socket: the `set` texts hawser writes and the answers it reads. Pure
//! functions, no I/O.
//!
//! Three quirks of boringtun 0.7 shape what is written here:
//! - it cannot change a peer it already has (it panics in its worker thread), so every peer that
//!   is added or changed is first removed in the same transaction (`remove=true` of an unknown
//!   key does nothing);
//! - within one `set`, a peer section inherits the settings of the one before it (its parser
//!   never resets them), so the order of sections and explicit `remove=false` matter
//!   ([`set_peers`]);
//! - its `last_handshake_time_sec` is the time *since* the last handshake, not a Unix time as
//!   the kernel's WireGuard reports it.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use zeroize::Zeroizing;

use hawser_mesh::{PrivateKey, PublicKey};

/// How often a peer is sent a keepalive (seconds), so that NAT and conntrack entries on the
/// underlay stay open and a handshake is never more than one interval old.
pub const PERSISTENT_KEEPALIVE_SECONDS: u16 = 25;

/// One peer as the tunnel is told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSection {
    /// The peer.
    pub public_key: PublicKey,
    /// Its VPN address: the only source address accepted from it and the only destination
    /// routed to it (`/32`).
    pub vpn_ip: Ipv4Addr,
    /// Where it listens, if known.
    pub endpoint: Option<SocketAddr>,
    /// Its pods' range, accepted from it and routed to it besides its address (a tunnel that
    /// carries the pods' traffic); `None` otherwise.
    pub pod_range: Option<ipnet::Ipv4Net>,
}

/// "set=1\n", "private_key=" + 64 hex digits + "\n", "listen_port=65535\n", "\n".
const SET_INTERFACE_CAPACITY: usize = 6 + 12 + 64 + 1 + 18 + 1;

/// The `set` transaction that gives the device its private key and, unless 0 (boringtun then
/// keeps the port the kernel gave it at creation), its listen port. The text holds the key: it
/// is zeroized when dropped and must never be logged.
pub fn set_interface(private_key: &PrivateKey, listen_port: u16) -> Zeroizing<String> {
    // Room for the whole text up front: a growing String would leave copies of the key behind
    // in memory it freed, which nothing zeroizes.
    let mut text = Zeroizing::new(String::with_capacity(SET_INTERFACE_CAPACITY));
    text.push_str("set=1\nprivate_key=");
    text.push_str(&private_key.to_hex());
    text.push('\n');
    if listen_port != 0 {
        // Writing to a String cannot fail.
        let _ = writeln!(text, "listen_port={listen_port}");
    }
    text.push('\n');
    text
}

/// The `set` transaction that removes `removed` and adds (or replaces) `upserts`; with
/// `replace_peers`, every peer not in `upserts` goes first.
///
/// The order answers boringtun 0.7's parser, which carries a peer section's settings over into
/// the next one (`remove`, `endpoint`, the keepalive): all removals come first, then every added
/// peer says `remove=false` and its keepalive, and the peers without an endpoint come before
/// those with one, so that none inherits another's endpoint.
pub fn set_peers(upserts: &[PeerSection], removed: &[PublicKey], replace_peers: bool) -> String {
    let mut text = String::from("set=1\n");
    if replace_peers {
        text.push_str("replace_peers=true\n");
    }
    let mut removals: Vec<&PublicKey> = removed.iter().collect();
    if !replace_peers {
        // boringtun 0.7 panics on a change to a peer it has: remove it first.
        removals.extend(upserts.iter().map(|peer| &peer.public_key));
    }
    for key in removals {
        let _ = write!(text, "public_key={}\nremove=true\n", key.to_hex());
    }
    let without_endpoint = upserts.iter().filter(|peer| peer.endpoint.is_none());
    let with_endpoint = upserts.iter().filter(|peer| peer.endpoint.is_some());
    for peer in without_endpoint.chain(with_endpoint) {
        let _ = write!(
            text,
            "public_key={}\nremove=false\n",
            peer.public_key.to_hex()
        );
        if let Some(endpoint) = peer.endpoint {
            let _ = writeln!(text, "endpoint={endpoint}");
        }
        let _ = write!(
            text,
            "persistent_keepalive_interval={PERSISTENT_KEEPALIVE_SECONDS}\n\
             replace_allowed_ips=true\nallowed_ip={}/32\n",
            peer.vpn_ip
        );
        if let Some(range) = peer.pod_range {
            let _ = writeln!(text, "allowed_ip={range}");
        }
    }
    text.push('\n');
    text
}

/// The `get` request.
pub const GET: &str = "get=1\n\n";

/// What a `get` answer says of the device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    /// The UDP port the device listens on.
    pub listen_port: Option<u16>,
    /// Its peers, in the order of the answer.
    pub peers: Vec<PeerState>,
}

/// What a `get` answer says of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    /// The peer.
    pub public_key: PublicKey,
    /// Where its packets last came from (or where it was configured to be).
    pub endpoint: Option<SocketAddr>,
    /// The addresses it is allowed to use, as `address/length`.
    pub allowed_ips: Vec<String>,
    /// How long ago the last handshake completed; `None` if never.
    pub since_last_handshake: Option<Duration>,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
}

/// Why an answer from the device was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The device answered with an error number.
    #[error("the tunnel answered errno={errno}")]
    Errno {
        /// The error number (a Linux errno: 22 EINVAL, 71 EPROTO, 98 EADDRINUSE, 5 EIO).
        errno: i32,
    },
    /// A line is not `key=value`.
    #[error("line {line} of the tunnel's answer is not `key=value`: {text:?}")]
    NotKeyValue {
        /// The line's number (1-based).
        line: usize,
        /// The line.
        text: String,
    },
    /// A value does not parse as its key requires.
    #[error("line {line} of the tunnel's answer has a malformed {key}: {value:?}")]
    Value {
        /// The line's number (1-based).
        line: usize,
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// A peer attribute before any `public_key`.
    #[error("line {line} of the tunnel's answer gives {key} before any peer's public_key")]
    OutsidePeer {
        /// The line's number (1-based).
        line: usize,
        /// The key.
        key: String,
    },
    /// The answer is not UTF-8 text.
    #[error("the tunnel's answer is not UTF-8 text")]
    NotText,
    /// The answer does not end with `errno=N` and an empty line.
    #[error("the tunnel's answer does not end with errno=N and an empty line")]
    Unterminated,
    /// Something follows the closing `errno=N`.
    #[error("the tunnel's answer goes on after its errno line (line {line})")]
    AfterErrno {
        /// The line's number (1-based).
        line: usize,
    },
}

/// Parses a whole answer given as bytes off the socket: see [`parse_answer`].
pub fn parse_answer_bytes(bytes: &[u8]) -> Result<DeviceState, AnswerError> {
    let text = std::str::from_utf8(bytes).map_err(|_| AnswerError::NotText)?;
    parse_answer(text)
}

/// Parses a whole answer (to `get` or `set`): `key=value` lines, then `errno=N` and an empty
/// line. Keys this module does not know are ignored; a known key with a malformed value, a line
/// that is not `key=value`, or a missing end is an error. A non-zero errno is
/// [`AnswerError::Errno`].
pub fn parse_answer(text: &str) -> Result<DeviceState, AnswerError> {
    let body = text.strip_suffix("\n\n").ok_or(AnswerError::Unterminated)?;
    let mut state = DeviceState::default();
    let mut errno = None;
    for (index, line) in body.split('\n').enumerate() {
        let line_number = index + 1;
        if errno.is_some() {
            return Err(AnswerError::AfterErrno { line: line_number });
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| AnswerError::NotKeyValue {
                line: line_number,
                text: line.to_owned(),
            })?;
        let malformed = || AnswerError::Value {
            line: line_number,
            key: key.to_owned(),
            value: value.to_owned(),
        };
        match key {
            "errno" => errno = Some(value.parse::<i32>().map_err(|_| malformed())?),
            "listen_port" => {
                state.listen_port = Some(value.parse().map_err(|_| malformed())?);
            }
            "public_key" => {
                let public_key = PublicKey::from_hex(value).map_err(|_| malformed())?;
                state.peers.push(PeerState {
                    public_key,
                    endpoint: None,
                    allowed_ips: Vec::new(),
                    since_last_handshake: None,
                    rx_bytes: 0,
                    tx_bytes: 0,
                });
            }
            "endpoint" => {
                let endpoint = value.parse().map_err(|_| malformed())?;
                last_peer(&mut state, line_number, key)?.endpoint = Some(endpoint);
            }
            "allowed_ip" => {
                if value.parse::<ipnet::IpNet>().is_err() {
                    return Err(malformed());
                }
                last_peer(&mut state, line_number, key)?
                    .allowed_ips
                    .push(value.to_owned());
            }
            "last_handshake_time_sec" => {
                let seconds: u64 = value.parse().map_err(|_| malformed())?;
                let peer = last_peer(&mut state, line_number, key)?;
                let nanos = peer.since_last_handshake.map_or(0, |d| d.subsec_nanos());
                peer.since_last_handshake = Some(Duration::new(seconds, nanos));
            }
            "last_handshake_time_nsec" => {
                let nanos: u32 = value.parse().map_err(|_| malformed())?;
                if nanos >= 1_000_000_000 {
                    return Err(malformed());
                }
                let peer = last_peer(&mut state, line_number, key)?;
                let seconds = peer.since_last_handshake.map_or(0, |d| d.as_secs());
                peer.since_last_handshake = Some(Duration::new(seconds, nanos));
            }
            "rx_bytes" => {
                last_peer(&mut state, line_number, key)?.rx_bytes =
                    value.parse().map_err(|_| malformed())?
            }
            "tx_bytes" => {
                last_peer(&mut state, line_number, key)?.tx_bytes =
                    value.parse().map_err(|_| malformed())?
            }
            // own_public_key, fwmark, preshared_key, persistent_keepalive_interval,
            // protocol_version and whatever a later boringtun adds.
            _ => {}
        }
    }
    match errno {
        Some(0) => Ok(state),
        Some(errno) => Err(AnswerError::Errno { errno }),
        None => Err(AnswerError::Unterminated),
    }
}

/// The peer the answer is describing: the last `public_key` so far.
fn last_peer<'a>(
    state: &'a mut DeviceState,
    line: usize,
    key: &str,
) -> Result<&'a mut PeerState, AnswerError> {
    state
        .peers
        .last_mut()
        .ok_or_else(|| AnswerError::OutsidePeer {
            line,
            key: key.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> PublicKey {
        PublicKey::from_slice(&[byte; 32]).unwrap()
    }

    #[test]
    fn interface_set_holds_the_key_in_hex_and_the_port() {
        let private_key = PrivateKey::from_random([7; 32]);
        let text = set_interface(&private_key, 51820);
        assert_eq!(
            text.as_str(),
            format!(
                "set=1\nprivate_key={}\nlisten_port=51820\n\n",
                private_key.to_hex().as_str()
            )
        );
        assert_eq!(
            text.capacity(),
            SET_INTERFACE_CAPACITY,
            "the text grew (and moved)"
        );
        // Port 0: boringtun keeps the port the kernel chose.
        let text = set_interface(&private_key, 0);
        assert!(!text.contains("listen_port"), "{}", text.as_str());
        assert!(text.ends_with("\n\n"));
    }

    #[test]
    fn peer_set_removes_first_then_adds_peers_without_an_endpoint_first() {
        let upserts = [
            PeerSection {
                public_key: key(1),
                vpn_ip: Ipv4Addr::new(10, 99, 0, 2),
                endpoint: Some("192.0.2.1:51820".parse().unwrap()),
                pod_range: None,
            },
            PeerSection {
                public_key: key(2),
                vpn_ip: Ipv4Addr::new(10, 99, 0, 3),
                endpoint: None,
                pod_range: None,
            },
        ];
        let text = set_peers(&upserts, &[key(3)], false);
        let k1 = "01".repeat(32);
        let k2 = "02".repeat(32);
        let k3 = "03".repeat(32);
        assert_eq!(
            text,
            format!(
                "set=1\n\
                 public_key={k3}\nremove=true\n\
                 public_key={k1}\nremove=true\n\
                 public_key={k2}\nremove=true\n\
                 public_key={k2}\nremove=false\npersistent_keepalive_interval=25\n\
                 replace_allowed_ips=true\nallowed_ip=10.99.0.3/32\n\
                 public_key={k1}\nremove=false\nendpoint=192.0.2.1:51820\n\
                 persistent_keepalive_interval=25\n\
                 replace_allowed_ips=true\nallowed_ip=10.99.0.2/32\n\
                 \n"
            )
        );
    }

    #[test]
    fn replace_peers_clears_first_and_needs_no_removes() {
        let upserts = [PeerSection {
            public_key: key(1),
            vpn_ip: Ipv4Addr::new(10, 99, 0, 2),
            endpoint: Some("[2001:db8::1]:4000".parse().unwrap()),
            pod_range: Some("10.244.2.0/24".parse().unwrap()),
        }];
        let text = set_peers(&upserts, &[], true);
        let k1 = "01".repeat(32);
        assert_eq!(
            text,
            format!(
                "set=1\nreplace_peers=true\n\
                 public_key={k1}\nremove=false\nendpoint=[2001:db8::1]:4000\n\
                 persistent_keepalive_interval=25\n\
                 replace_allowed_ips=true\nallowed_ip=10.99.0.2/32\n\
                 allowed_ip=10.244.2.0/24\n\n"
            )
        );
        assert_eq!(set_peers(&[], &[], true), "set=1\nreplace_peers=true\n\n");
    }

    #[test]
    fn get_answer_with_several_peers() {
        let k1 = "01".repeat(32);
        let k2 = "AB".repeat(32);
        let answer = format!(
            "own_public_key={k1}\nlisten_port=51820\nfwmark=0\n\
             public_key={k1}\npersistent_keepalive_interval=25\nendpoint=192.0.2.1:51820\n\
             allowed_ip=10.99.0.2/32\nlast_handshake_time_sec=3\nlast_handshake_time_nsec=500\n\
             rx_bytes=1184\ntx_bytes=1248\n\
             public_key={k2}\nallowed_ip=10.99.0.3/32\nrx_bytes=0\ntx_bytes=148\n\
             errno=0\n\n"
        );
        let state = parse_answer(&answer).unwrap();
        assert_eq!(state.listen_port, Some(51820));
        assert_eq!(
            state.peers,
            vec![
                PeerState {
                    public_key: key(1),
                    endpoint: Some("192.0.2.1:51820".parse().unwrap()),
                    allowed_ips: vec!["10.99.0.2/32".into()],
                    since_last_handshake: Some(Duration::new(3, 500)),
                    rx_bytes: 1184,
                    tx_bytes: 1248,
                },
                PeerState {
                    public_key: key(0xab),
                    endpoint: None,
                    allowed_ips: vec!["10.99.0.3/32".into()],
                    since_last_handshake: None,
                    rx_bytes: 0,
                    tx_bytes: 148,
                },
            ]
        );
    }

    #[test]
    fn set_answer_and_errno() {
        assert_eq!(parse_answer("errno=0\n\n").unwrap(), DeviceState::default());
        assert_eq!(
            parse_answer("errno=22\n\n"),
            Err(AnswerError::Errno { errno: 22 })
        );
        let message = parse_answer("errno=98\n\n").unwrap_err().to_string();
        assert!(message.contains("errno=98"), "{message}");
    }

    #[test]
    fn malformed_answers_are_refused() {
        let k1 = "01".repeat(32);
        let cases: Vec<(String, AnswerError)> = vec![
            ("errno=0\n".into(), AnswerError::Unterminated),
            ("listen_port=1\n\n".into(), AnswerError::Unterminated),
            (
                "listen_port=99999\nerrno=0\n\n".into(),
                AnswerError::Value {
                    line: 1,
                    key: "listen_port".into(),
                    value: "99999".into(),
                },
            ),
            (
                "garbage\nerrno=0\n\n".into(),
                AnswerError::NotKeyValue {
                    line: 1,
                    text: "garbage".into(),
                },
            ),
            (
                "rx_bytes=5\nerrno=0\n\n".into(),
                AnswerError::OutsidePeer {
                    line: 1,
                    key: "rx_bytes".into(),
                },
            ),
            (
                "public_key=xyz\nerrno=0\n\n".into(),
                AnswerError::Value {
                    line: 1,
                    key: "public_key".into(),
                    value: "xyz".into(),
                },
            ),
            (
                format!("public_key={k1}\nendpoint=nowhere\nerrno=0\n\n"),
                AnswerError::Value {
                    line: 2,
                    key: "endpoint".into(),
                    value: "nowhere".into(),
                },
            ),
            (
                format!("public_key={k1}\nallowed_ip=10.0.0.1/40\nerrno=0\n\n"),
                AnswerError::Value {
                    line: 2,
                    key: "allowed_ip".into(),
                    value: "10.0.0.1/40".into(),
                },
            ),
            (
                format!("public_key={k1}\ntx_bytes=-1\nerrno=0\n\n"),
                AnswerError::Value {
                    line: 2,
                    key: "tx_bytes".into(),
                    value: "-1".into(),
                },
            ),
            (
                format!("public_key={k1}\nlast_handshake_time_nsec=1000000000\nerrno=0\n\n"),
                AnswerError::Value {
                    line: 2,
                    key: "last_handshake_time_nsec".into(),
                    value: "1000000000".into(),
                },
            ),
            (
                "errno=zero\n\n".into(),
                AnswerError::Value {
                    line: 1,
                    key: "errno".into(),
                    value: "zero".into(),
                },
            ),
            (
                "errno=0\nlisten_port=1\n\n".into(),
                AnswerError::AfterErrno { line: 2 },
            ),
            (
                "listen_port=1\n\nerrno=0\n\n".into(),
                AnswerError::NotKeyValue {
                    line: 2,
                    text: String::new(),
                },
            ),
        ];
        for (answer, expected) in cases {
            assert_eq!(parse_answer(&answer), Err(expected), "answer {answer:?}");
        }
    }

    #[test]
    fn answers_that_are_not_text_are_refused() {
        assert_eq!(
            parse_answer_bytes(b"listen_port=\xff\nerrno=0\n\n"),
            Err(AnswerError::NotText)
        );
        assert_eq!(
            parse_answer_bytes(b"listen_port=7\nerrno=0\n\n")
                .unwrap()
                .listen_port,
            Some(7)
        );
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let state = parse_answer("protocol_version=1\nsomething_new=x\nerrno=0\n\n").unwrap();
        assert_eq!(state, DeviceState::default());
    }
}
