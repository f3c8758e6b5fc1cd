//! The cluster's pod network and each member's share of it.
//!
//! Every node's pods get a /24 of [`POD_NETWORK`] (`10.244.0.0/16`), chosen by the last octet
//! of the node's IPv4 address ([`pod_range`]): any member computes any member's range from its
//! address alone, with no allocator and nothing to replicate. PID 1 writes the node's own range
//! into its CNI configuration; the mesh's tunnel accepts each peer's range from that peer and
//! routes it to it (WireGuard's allowed IPs), so a pod reaches a pod on another node through
//! the mesh and nothing else.
//!
//! The limit this sets: node addresses must differ in their last octet (a /24 of node
//! addresses, as the mesh's default prefix and the local cluster's LAN are).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::MeshError;

/// The cluster's pod network; every node has a /24 of it.
pub const POD_NETWORK: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 0, 0), 16);

/// The widest mesh prefix of a cluster whose nodes' pod ranges follow their addresses: in a
/// /24 (or narrower) every node's address has its own last octet, so its own [`pod_range`].
pub const WIDEST_CLUSTER_PREFIX: u8 = 24;

/// Whether `prefix` can be a cluster's mesh: refused, saying why, when wider than
/// [`WIDEST_CLUSTER_PREFIX`] (two nodes would share a pod range).
pub fn check_cluster_prefix(prefix: Ipv4Net) -> Result<(), MeshError> {
    if prefix.prefix_len() < WIDEST_CLUSTER_PREFIX {
        return Err(MeshError::ClusterPrefixTooWide { prefix });
    }
    Ok(())
}

/// The pods' range of the node at `node_ip`: `10.244.<last octet>.0/24`; `None` for an
/// address ending in .0 or .255, which names none.
pub fn pod_range(node_ip: Ipv4Addr) -> Option<Ipv4Net> {
    let last = node_ip.octets()[3];
    if last == 0 || last == 255 {
        return None;
    }
    let [a, b, ..] = POD_NETWORK.network().octets();
    Ipv4Net::new(Ipv4Addr::new(a, b, last, 0), 24).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_mesh_is_at_most_a_24() {
        let check = |p: &str| check_cluster_prefix(p.parse().unwrap());
        assert!(check("10.99.0.0/24").is_ok());
        assert!(check("10.99.0.0/28").is_ok());
        let refused = check("10.99.0.0/16").unwrap_err().to_string();
        assert!(
            refused.contains("at most a /24") && refused.contains("/16"),
            "{refused}"
        );
    }

    #[test]
    fn each_node_has_the_24_of_its_last_octet() {
        let range = |ip: &str| pod_range(ip.parse().unwrap()).map(|r| r.to_string());
        assert_eq!(range("10.99.0.1").as_deref(), Some("10.244.1.0/24"));
        assert_eq!(range("192.168.76.11").as_deref(), Some("10.244.11.0/24"));
        assert_eq!(range("10.99.0.254").as_deref(), Some("10.244.254.0/24"));
        assert_eq!(range("10.99.1.0"), None);
        assert_eq!(range("10.99.0.255"), None);
        assert!(POD_NETWORK.contains(&pod_range("10.99.0.7".parse().unwrap()).unwrap()));
    }
}
