//! A LAN between local VMs without a bridge, a tap device or root: each VM's second NIC is a
//! QEMU `dgram` netdev on a Unix datagram socket, and a hub in `hawser local up` repeats every
//! Ethernet frame one VM sends to all the others (as an Ethernet hub does). Multicast, and so
//! mDNS, works on it as on any LAN; nothing on it reaches the host's own network.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The LAN's IPv4 prefix; member `i` (from 0) is `192.168.76.(10 + i)`.
pub const LAN_PREFIX: &str = "192.168.76";
/// The prefix length of the LAN's addresses.
pub const LAN_PREFIX_LEN: u8 = 24;
/// The largest frame QEMU's dgram netdev sends (a whole 64 KiB datagram).
const MAX_FRAME: usize = 65536;

/// One member's end of the hub: where QEMU's netdev binds (`node.sock`) and where the hub
/// listens for its frames (`hub.sock`).
#[derive(Debug, Clone)]
pub struct Port {
    pub node: PathBuf,
    pub hub: PathBuf,
}

/// The hub: a thread per member, each repeating its member's frames to every other member.
/// Runs until the process ends.
pub struct Hub {
    pub ports: Vec<Port>,
}

impl Hub {
    /// Binds the hub's sockets for `members` members in `dir` (old sockets removed first) and
    /// starts repeating.
    pub fn start(dir: &Path, members: usize) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ports: Vec<Port> = (0..members)
            .map(|i| Port {
                node: dir.join(format!("node-{}.sock", i + 1)),
                hub: dir.join(format!("hub-{}.sock", i + 1)),
            })
            .collect();
        for port in &ports {
            for path in [&port.node, &port.hub] {
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(e).with_context(|| format!("removing {}", path.display()));
                    }
                }
            }
        }
        for (i, port) in ports.iter().enumerate() {
            let socket = UnixDatagram::bind(&port.hub)
                .with_context(|| format!("binding the LAN hub's socket {}", port.hub.display()))?;
            let others: Vec<PathBuf> = ports
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, p)| p.node.clone())
                .collect();
            std::thread::Builder::new()
                .name(format!("lan-hub-{}", i + 1))
                .spawn(move || repeat(&socket, &others))
                .context("starting the LAN hub")?;
        }
        Ok(Hub { ports })
    }
}

/// Repeats every frame arriving on `socket` to each of `others` (a member whose QEMU is not
/// up yet, or gone, misses it, as on a real LAN).
fn repeat(socket: &UnixDatagram, others: &[PathBuf]) {
    let mut frame = vec![0u8; MAX_FRAME];
    while let Ok(len) = socket.recv(&mut frame) {
        for other in others {
            let _ = socket.send_to(&frame[..len], other);
        }
    }
}

/// QEMU arguments for a member's LAN NIC on `port`, with a MAC address of its own (QEMU's
/// default would be the same on every VM).
pub fn nic_args(port: &Port, member: usize) -> Vec<String> {
    vec![
        "-netdev".to_owned(),
        format!(
            "dgram,id=lan,local.type=unix,local.path={},remote.type=unix,remote.path={}",
            port.node.display(),
            port.hub.display()
        ),
        "-device".to_owned(),
        format!(
            "virtio-net-pci,netdev=lan,mac=52:54:00:4c:00:{:02x}",
            member + 1
        ),
    ]
}

/// Member `member`'s LAN address as PID 1 takes it (fw_cfg `lan_net`).
pub fn address(member: usize) -> String {
    format!("{}/{LAN_PREFIX_LEN}", host(member))
}

/// Member `member`'s IP address on the LAN: its Kubernetes node IP (PID 1 prefers it to the
/// user network's, where every VM is 10.0.2.15).
pub fn host(member: usize) -> String {
    format!("{LAN_PREFIX}.{}", 10 + member)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hub_repeats_a_frame_to_every_other_member_only() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::start(dir.path(), 3).unwrap();
        let members: Vec<UnixDatagram> = hub
            .ports
            .iter()
            .map(|p| {
                let socket = UnixDatagram::bind(&p.node).unwrap();
                socket
                    .set_read_timeout(Some(std::time::Duration::from_millis(300)))
                    .unwrap();
                socket
            })
            .collect();
        let frame = b"\x01\x00\x5e\x00\x00\xfb an mDNS frame";
        members[0].send_to(frame, &hub.ports[0].hub).unwrap();
        let mut buf = [0u8; 64];
        for member in &members[1..] {
            let len = member.recv(&mut buf).unwrap();
            assert_eq!(&buf[..len], frame);
        }
        assert!(
            members[0].recv(&mut buf).is_err(),
            "the sender got its own frame back"
        );
        // A member that is not up loses frames; the others still get them.
        std::fs::remove_file(&hub.ports[2].node).unwrap();
        members[1].send_to(b"again", &hub.ports[1].hub).unwrap();
        let len = members[0].recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"again");
    }

    #[test]
    fn members_get_their_own_mac_and_address() {
        let port = Port {
            node: "/x/node-2.sock".into(),
            hub: "/x/hub-2.sock".into(),
        };
        let args = nic_args(&port, 1);
        assert_eq!(
            args[1],
            "dgram,id=lan,local.type=unix,local.path=/x/node-2.sock,remote.type=unix,remote.path=/x/hub-2.sock"
        );
        assert!(args[3].ends_with("mac=52:54:00:4c:00:02"), "{args:?}");
        assert_eq!(address(1), "192.168.76.11/24");
        assert_eq!(host(0), "192.168.76.10");
    }
}
