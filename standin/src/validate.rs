//! The formats kubeadm checks, as pure predicates: bootstrap tokens, CA pins, DNS names,
//! endpoints, CIDRs, Go durations, Kubernetes versions.
//!
//! Each follows the rule kubeadm (or the Kubernetes API machinery it calls) applies; where the
//! stand-in is stricter, the caller's error message says so.

use std::net::IpAddr;
use std::time::Duration;

/// `[a-z0-9]{6}.[a-z0-9]{16}`: kubeadm's bootstrap token (`BootstrapTokenPattern`).
pub fn is_bootstrap_token(token: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    };
    matches!(token.split_once('.'), Some((id, secret)) if ok(id, 6) && ok(secret, 16))
}

/// `sha256:<64 hex>`: a pin of the cluster CA's SubjectPublicKeyInfo.
pub fn is_ca_cert_hash(hash: &str) -> bool {
    hash.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A DNS-1123 label: at most 63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters. Node names must be one.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A TCP port kubeadm accepts: 1..=65535.
pub fn is_port(port: i64) -> bool {
    (1..=65535).contains(&port)
}

/// An IP address or a DNS-1123 subdomain (what kubeadm accepts as an endpoint host).
pub fn is_host(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok() || is_dns1123_subdomain(host)
}

/// Splits `host:port` / `[v6]:port`; `Err` says what is wrong.
pub fn split_host_port(endpoint: &str) -> Result<(&str, u16), String> {
    let (host, port) = if let Some(rest) = endpoint.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{endpoint:?} opens [ but never closes it"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("{endpoint:?} has no :port after the IPv6 address"))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        (host, port)
    } else {
        let (host, port) = endpoint
            .rsplit_once(':')
            .ok_or_else(|| format!("{endpoint:?} is not host:port"))?;
        if host.contains(':') {
            return Err(format!(
                "{endpoint:?}: write an IPv6 address in brackets, [addr]:port"
            ));
        }
        if !is_host(host) {
            return Err(format!(
                "{host:?} is neither an IP address nor a DNS-1123 subdomain"
            ));
        }
        (host, port)
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{port:?} is not a port number between 1 and 65535"))?;
    Ok((host, port))
}

/// `host` or `host:port` (ClusterConfiguration.controlPlaneEndpoint: the port is optional).
pub fn check_optional_port_endpoint(endpoint: &str) -> Result<(), String> {
    if is_host(endpoint) {
        return Ok(());
    }
    split_host_port(endpoint).map(|_| ())
}

/// One CIDR, `10.96.0.0/12` or `fd00::/108`.
pub fn is_cidr(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => bits <= 32,
        Ok(IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

/// kubeadm's subnets: one CIDR, or two (one per IP family) separated by a comma for dual stack.
pub fn check_subnets(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() > 2 {
        return Err(format!(
            "{s:?} lists {} subnets; at most two (one IPv4, one IPv6)",
            parts.len()
        ));
    }
    for p in &parts {
        if !is_cidr(p) {
            return Err(format!("{p:?} is not a CIDR such as 10.96.0.0/12"));
        }
    }
    if let [a, b] = parts.as_slice() {
        let v4 = |c: &str| c.contains('.');
        if v4(a) == v4(b) {
            return Err(format!(
                "{s:?}: a dual-stack pair needs one IPv4 and one IPv6 subnet"
            ));
        }
    }
    Ok(())
}

/// `v1.X.Y`, optionally with a pre-release suffix (`v1.33.0-rc.1`).
pub fn is_kubernetes_version(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("v1.") else {
        return false;
    };
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    let number = |n: &str| {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'))
    };
    let mut parts = core.split('.');
    let ok = matches!((parts.next(), parts.next(), parts.next()), (Some(minor), Some(patch), None) if number(minor) && number(patch));
    ok && pre.is_none_or(|p| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    })
}

/// A Go `time.Duration` string (`24h0m0s`, `5m`, `1.5h`, `300ms`, `0`), as metav1.Duration
/// parses it. Negative durations are refused: no kubeadm field means anything by them.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_len = tail
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(tail.len(), |(i, _)| i);
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * seconds;
        rest = tail;
    }
    Some(Duration::from_secs_f64(total))
}

/// A bootstrap token's extra group: `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]`.
pub fn is_bootstrap_group(group: &str) -> bool {
    group
        .strip_prefix("system:bootstrappers:")
        .is_some_and(|g| {
            !g.is_empty()
                && g.len() <= 256
                && g.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
                && g.bytes()
                    .last()
                    .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// A Kubernetes qualified name (taint keys): `[prefix/]name`, the prefix a DNS subdomain, the
/// name at most 63 of `[A-Za-z0-9-_.]`, alphanumeric at both ends.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    name_ok && prefix.is_none_or(is_dns1123_subdomain)
}

/// kubeadm's certificate key: 32 bytes, hex (an AES-256 key).
pub fn is_certificate_key(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_tokens() {
        assert!(is_bootstrap_token("abcdef.0123456789abcdef"));
        for bad in [
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef0123456789abcdef",
            "abcdef.0123456789abcdeg_",
            "",
        ] {
            assert!(!is_bootstrap_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(split_host_port("10.0.0.1:6443"), Ok(("10.0.0.1", 6443)));
        assert_eq!(split_host_port("[fd00::1]:6443"), Ok(("fd00::1", 6443)));
        assert_eq!(
            split_host_port("cp.example.com:443"),
            Ok(("cp.example.com", 443))
        );
        for bad in [
            "10.0.0.1",
            "10.0.0.1:0",
            "10.0.0.1:65536",
            "fd00::1:6443",
            "Bad_Host:6443",
            "[fd00::1]",
            ":6443",
        ] {
            assert!(split_host_port(bad).is_err(), "{bad:?}");
        }
        assert!(check_optional_port_endpoint("cp.example.com").is_ok());
        assert!(check_optional_port_endpoint("10.0.0.1:6443").is_ok());
        assert!(check_optional_port_endpoint("10.0.0.1:x").is_err());
    }

    #[test]
    fn subnets() {
        assert!(check_subnets("10.96.0.0/12").is_ok());
        assert!(check_subnets("10.244.0.0/16,fd00:10:244::/56").is_ok());
        assert!(check_subnets("10.96.0.0/33").is_err());
        assert!(check_subnets("10.96.0.0").is_err());
        assert!(check_subnets("10.0.0.0/8,10.1.0.0/16").is_err());
        assert!(check_subnets("a,b,c").is_err());
    }

    #[test]
    fn versions() {
        for good in ["v1.33.0", "v1.31.12", "v1.34.0-rc.1"] {
            assert!(is_kubernetes_version(good), "{good}");
        }
        for bad in [
            "1.33.0", "v1.33", "v2.0.0", "v1.033.0", "stable", "v1.33.0-",
        ] {
            assert!(!is_kubernetes_version(bad), "{bad}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(
            parse_go_duration("24h0m0s"),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_secs(5_400)));
        assert_eq!(parse_go_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "5", "5x", "-5m", "h", "1..5s"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("node-1.cluster.local"));
        assert!(!is_dns1123_subdomain("Node-1"));
        assert!(!is_dns1123_subdomain("node_1"));
        assert!(!is_dns1123_subdomain("-node"));
        assert!(is_qualified_name("node-role.kubernetes.io/control-plane"));
        assert!(!is_qualified_name("node-role.kubernetes.io/"));
        assert!(is_bootstrap_group(
            "system:bootstrappers:kubeadm:default-node-token"
        ));
        assert!(!is_bootstrap_group("system:masters"));
        assert!(is_ca_cert_hash(&format!("sha256:{}", "ab".repeat(32))));
        assert!(!is_ca_cert_hash(&format!("sha1:{}", "ab".repeat(32))));
    }
}
