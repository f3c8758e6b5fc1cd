//! The node's pod network: a CNI configuration for Debian's `containernetworking-plugins`
//! (`bridge` with `host-local` addresses), written before the kubelet starts.
//!
//! ```text
//!  pod ── veth ── cni0 (bridge, the pod range's .1, the pods' gateway) ── the node's routes
//! ```
//!
//! The kubelet reports its node `Ready` only once the runtime's network is ready, which for
//! containerd means a configuration in `/etc/cni/net.d` (containerd's `conf_dir` in the
//! image's `config.toml`) whose plugins exist in `/usr/lib/cni`. hawser writes it itself, at
//! every boot (`/etc` is an overlay on tmpfs: every boot starts from the image's `/etc`), and
//! no CNI DaemonSet runs: there is nothing to pull, and a node's pod range is known before the
//! kubelet starts.
//!
//! **Each node's pod range** is a /24 of [`hawser_mesh::pods::POD_NETWORK`] (`10.244.0.0/16`),
//! chosen by the last octet of the node's IPv4 address ([`pod_range`]): every node computes any
//! node's range from that node's address alone, with no allocator and nothing to replicate. The
//! controller manager's own allocation (`--allocate-node-cidrs`) stays off, since hawser does
//! not set kubeadm's `podSubnet`. The limit this sets: node addresses must differ in their
//! last octet (a /24 of node addresses, as the local cluster's LAN and the mesh's default
//! prefix are).
//!
//! **Across nodes** the pods' traffic goes through the WireGuard mesh: the node IP is the
//! node's VPN address, the tunnel routes the pod network and accepts each peer's range from
//! that peer only (`hawser_mesh::pods`, `hawser_mesh_device::TunnelConfig::pod_routes`). The
//! node forwards between `cni0` and the tunnel (`net.ipv4.ip_forward`, which kubeadm's
//! preflight wants anyway). The pods' interfaces have the tunnel's MTU
//! ([`POD_MTU`]), so that what they send fits the tunnel without fragments.
//!
//! No `ipMasq` and no `portmap`: both program iptables, and a pod needs neither to reach
//! another pod; a pod's traffic to addresses outside the cluster leaves unmasqueraded.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use serde_json::json;

/// The MTU of the bridge and the pods' interfaces: the mesh tunnel's on a 1500-byte underlay.
pub const POD_MTU: u32 = 1500 - hawser_mesh::ENCAPSULATION_OVERHEAD;
/// The configuration's file under containerd's `conf_dir`.
pub const CNI_CONFIG: &str = "/etc/cni/net.d/10-hawser.conflist";
/// The bridge the pods of this node hang off.
pub const BRIDGE: &str = "cni0";
/// The resolver configuration the kubelet reads for every pod's sandbox (its
/// `resolvConf`, which it cannot be told to skip: an empty value means this default).
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
/// What a node without a resolver configuration gets: none (hawser's nodes resolve no names;
/// the cluster serves no DNS, see `docs/kubernetes.md`).
const NO_RESOLVER: &str = "# written by hawser's PID 1: this node has no DNS resolver configured\n";

/// Why the node's pod network cannot be configured.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// The node has an IPv6 address: hawser's pod ranges are IPv4.
    #[error(
        "the node's address {0} is not IPv4: hawser's pod ranges are IPv4 /24s of 10.244.0.0/16"
    )]
    NotIpv4(IpAddr),
    /// The node's address ends in .0 or .255, which names no pod range.
    #[error("the node's address {0} ends in .0 or .255: it chooses no pod range")]
    NoRange(Ipv4Addr),
    /// The configuration (or the resolver's) cannot be written.
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The pod range of the node at `node_ip`: `10.244.<last octet>.0/24`
/// ([`hawser_mesh::pods::pod_range`]).
pub fn pod_range(node_ip: IpAddr) -> Result<(Ipv4Addr, u8), CniError> {
    let IpAddr::V4(ip) = node_ip else {
        return Err(CniError::NotIpv4(node_ip));
    };
    let range = hawser_mesh::pods::pod_range(ip).ok_or(CniError::NoRange(ip))?;
    Ok((range.network(), range.prefix_len()))
}

/// The conflist for a node whose pod range is `range`.
pub fn conflist(range: (Ipv4Addr, u8)) -> String {
    let (network, len) = range;
    let gateway = Ipv4Addr::from(u32::from(network) | 1);
    let config = json!({
        "cniVersion": "0.4.0",
        "name": "hawser",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "hairpinMode": true,
            "ipMasq": false,
            "mtu": POD_MTU,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": format!("{network}/{len}"), "gateway": gateway.to_string()}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    });
    let mut text = serde_json::to_string_pretty(&config).unwrap_or_default();
    text.push('\n');
    text
}

/// Writes the node's CNI configuration under `root` (`/` on a node); returns its pod range.
pub fn write(root: &Path, node_ip: IpAddr) -> Result<(Ipv4Addr, u8), CniError> {
    let range = pod_range(node_ip)?;
    let path = root.join(CNI_CONFIG.trim_start_matches('/'));
    let write = |path: &Path| -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, conflist(range))
    };
    write(&path).map_err(|source| CniError::Write { path, source })?;
    Ok(range)
}

/// Writes [`RESOLV_CONF`] under `root` if the image and the platform left none: the kubelet
/// creates no pod sandbox without one. Returns whether it wrote it.
pub fn ensure_resolv_conf(root: &Path) -> Result<bool, CniError> {
    let path = root.join(RESOLV_CONF.trim_start_matches('/'));
    // A dangling symlink (systemd-resolved's stub in some images) counts as absent.
    if path.exists() {
        return Ok(false);
    }
    let write = |path: &Path| -> std::io::Result<()> {
        if path.is_symlink() {
            std::fs::remove_file(path)?;
        }
        std::fs::write(path, NO_RESOLVER)
    };
    write(&path).map_err(|source| CniError::Write { path, source })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_has_the_24_of_its_last_octet() {
        let ip: IpAddr = "192.168.76.11".parse().unwrap();
        assert_eq!(pod_range(ip).unwrap(), (Ipv4Addr::new(10, 244, 11, 0), 24));
        let ip: IpAddr = "10.123.0.2".parse().unwrap();
        assert_eq!(pod_range(ip).unwrap(), (Ipv4Addr::new(10, 244, 2, 0), 24));
    }

    #[test]
    fn addresses_that_choose_no_range_are_refused_by_name() {
        let err = pod_range("10.0.0.0".parse().unwrap()).unwrap_err();
        assert!(err.to_string().contains("10.0.0.0"), "{err}");
        assert!(matches!(
            pod_range("10.0.0.255".parse().unwrap()),
            Err(CniError::NoRange(_))
        ));
        let err = pod_range("fd00::1".parse().unwrap()).unwrap_err();
        assert!(err.to_string().contains("not IPv4"), "{err}");
    }

    #[test]
    fn the_conflist_is_a_bridge_with_host_local_addresses_of_the_range() {
        let text = conflist((Ipv4Addr::new(10, 244, 11, 0), 24));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["name"], "hawser");
        let plugin = &value["plugins"][0];
        assert_eq!(plugin["type"], "bridge");
        assert_eq!(plugin["bridge"], "cni0");
        assert_eq!(plugin["ipMasq"], false);
        assert_eq!(plugin["mtu"], 1420);
        assert_eq!(plugin["ipam"]["type"], "host-local");
        assert_eq!(plugin["ipam"]["ranges"][0][0]["subnet"], "10.244.11.0/24");
        assert_eq!(plugin["ipam"]["ranges"][0][0]["gateway"], "10.244.11.1");
        assert_eq!(value["plugins"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_missing_resolv_conf_is_written_and_an_existing_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        assert!(ensure_resolv_conf(dir.path()).unwrap());
        let path = dir.path().join("etc/resolv.conf");
        assert!(std::fs::read_to_string(&path).unwrap().starts_with('#'));
        std::fs::write(&path, "nameserver 10.0.2.3\n").unwrap();
        assert!(!ensure_resolv_conf(dir.path()).unwrap());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "nameserver 10.0.2.3\n"
        );
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/run/systemd/resolve/stub-resolv.conf", &path).unwrap();
        assert!(ensure_resolv_conf(dir.path()).unwrap());
        assert!(std::fs::read_to_string(&path).unwrap().starts_with('#'));
    }

    #[test]
    fn it_is_written_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let range = write(dir.path(), "192.168.76.10".parse().unwrap()).unwrap();
        assert_eq!(range, (Ipv4Addr::new(10, 244, 10, 0), 24));
        let text =
            std::fs::read_to_string(dir.path().join("etc/cni/net.d/10-hawser.conflist")).unwrap();
        assert!(text.contains("10.244.10.0/24"), "{text}");
    }
}
