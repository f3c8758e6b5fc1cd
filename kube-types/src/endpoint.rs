//! `host[:port]` as kubeadm reads it: the API server endpoint of a join, the control-plane
//! endpoint of a cluster.

use std::fmt;
use std::net::{AddrParseError, IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::dns::{DnsSubdomain, DnsSubdomainError};

/// The host of an endpoint: an IP address or a DNS name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Ip(IpAddr),
    Dns(DnsSubdomain),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(ip) => ip.fmt(f),
            Host::Dns(name) => name.fmt(f),
        }
    }
}

/// `host[:port]`, as kubeadm parses `controlPlaneEndpoint`: the host an IP address or a
/// lowercase DNS name, the port 1 to 65535. An IPv6 address stands alone or, with a port, in
/// brackets (`fd00::1`, `[fd00::1]:6443`); `[fd00::1]` without a port is refused, as kubeadm
/// refuses it. `Display` gives the canonical text (IPv6 compressed, in brackets with a port).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    host: Host,
    port: Option<u16>,
}

/// `host:port`: an [`Endpoint`] with a port, as `kubeadm join` needs the API server's
/// (`discovery.bootstrapToken.apiServerEndpoint`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ApiServerEndpoint(Endpoint);

/// Why a text is not an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// A `[` without a `]`, or something other than `:<port>` after the `]`.
    #[error("an IPv6 address in brackets must be followed by :<port> ([fd00::1]:6443)")]
    Brackets,
    /// The host in brackets is not an IPv6 address.
    #[error("the host in brackets is not an IPv6 address")]
    BracketedHost(#[source] AddrParseError),
    /// More than one `:` outside brackets, and the whole is not an IPv6 address.
    #[error("an IPv6 address with a port must be in brackets ([fd00::1]:6443)")]
    UnbracketedIpv6,
    /// The host is neither an IP address nor a DNS name.
    #[error("the host is neither an IP address nor a DNS name")]
    Host(#[source] DnsSubdomainError),
    /// The port is not a decimal number from 1 to 65535.
    #[error("the port is not a number from 1 to 65535")]
    Port,
    /// There is no port where one is required.
    #[error(
        "there is no port: expected <IP or DNS name>:<port>, an IPv6 address in brackets \
         ([fd00::1]:6443)"
    )]
    NoPort,
}

impl Endpoint {
    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port, if there is one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }
}

/// A port as kubeadm takes it: decimal digits only (no sign), 1 to 65535.
fn parse_port(text: &str) -> Result<u16, EndpointError> {
    Some(text)
        .filter(|t| !t.is_empty() && t.len() <= 5 && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u16>().ok())
        .filter(|port| *port != 0)
        .ok_or(EndpointError::Port)
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(text: &str) -> Result<Endpoint, EndpointError> {
        if let Some(rest) = text.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or(EndpointError::Brackets)?;
            let port = after.strip_prefix(':').ok_or(EndpointError::Brackets)?;
            let ip: Ipv6Addr = host.parse().map_err(EndpointError::BracketedHost)?;
            return Ok(Endpoint {
                host: Host::Ip(IpAddr::V6(ip)),
                port: Some(parse_port(port)?),
            });
        }
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Endpoint {
                host: Host::Ip(ip),
                port: None,
            });
        }
        let (host, port) = match text.split_once(':') {
            Some((_, port)) if port.contains(':') => return Err(EndpointError::UnbracketedIpv6),
            Some((host, port)) => (host, Some(parse_port(port)?)),
            None => (text, None),
        };
        let host = match host.parse::<Ipv4Addr>() {
            Ok(v4) => Host::Ip(IpAddr::V4(v4)),
            Err(_) => Host::Dns(host.parse().map_err(EndpointError::Host)?),
        };
        Ok(Endpoint { host, port })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.port) {
            (Host::Ip(IpAddr::V6(v6)), Some(port)) => write!(f, "[{v6}]:{port}"),
            (host, Some(port)) => write!(f, "{host}:{port}"),
            (host, None) => host.fmt(f),
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint({self})")
    }
}

impl ApiServerEndpoint {
    /// The host.
    pub fn host(&self) -> &Host {
        &self.0.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        // Always `Some`: checked when the endpoint was made.
        self.0.port.unwrap_or_default()
    }

    /// The endpoint, port included.
    pub fn endpoint(&self) -> &Endpoint {
        &self.0
    }
}

impl TryFrom<Endpoint> for ApiServerEndpoint {
    type Error = EndpointError;

    fn try_from(endpoint: Endpoint) -> Result<ApiServerEndpoint, EndpointError> {
        match endpoint.port {
            Some(_) => Ok(ApiServerEndpoint(endpoint)),
            None => Err(EndpointError::NoPort),
        }
    }
}

impl FromStr for ApiServerEndpoint {
    type Err = EndpointError;

    fn from_str(text: &str) -> Result<ApiServerEndpoint, EndpointError> {
        ApiServerEndpoint::try_from(text.parse::<Endpoint>()?)
    }
}

impl fmt::Display for ApiServerEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for ApiServerEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiServerEndpoint({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(text: &str) -> Result<Endpoint, EndpointError> {
        text.parse()
    }

    fn api_server(text: &str) -> Result<ApiServerEndpoint, EndpointError> {
        text.parse()
    }

    #[test]
    fn endpoints_parse_and_print_canonically() {
        for (text, canonical, port) in [
            ("10.0.2.15:6443", "10.0.2.15:6443", Some(6443)),
            ("10.0.2.15", "10.0.2.15", None),
            ("api.hawser.example", "api.hawser.example", None),
            (
                "api.hawser.example:6443",
                "api.hawser.example:6443",
                Some(6443),
            ),
            ("[fd00::1]:6443", "[fd00::1]:6443", Some(6443)),
            ("[FD00:0::1]:1", "[fd00::1]:1", Some(1)),
            ("fd00::1", "fd00::1", None),
            // A bare IPv6 address takes no port: the last group is part of the address.
            ("fd00::1:6443", "fd00::1:6443", None),
            ("10.0.2.15:65535", "10.0.2.15:65535", Some(65535)),
            ("10.0.2.15:06443", "10.0.2.15:6443", Some(6443)),
        ] {
            let parsed = endpoint(text).unwrap();
            assert_eq!(parsed.to_string(), canonical, "{text}");
            assert_eq!(parsed.port(), port, "{text}");
            assert_eq!(endpoint(canonical), Ok(parsed));
        }
        assert_eq!(
            format!("{:?}", api_server("[fd00::1]:6443").unwrap()),
            "ApiServerEndpoint([fd00::1]:6443)"
        );
        assert_eq!(
            format!("{:?}", endpoint("fd00::1").unwrap()),
            "Endpoint(fd00::1)"
        );
        assert_eq!(
            endpoint("10.0.2.15:6443").unwrap().host(),
            &Host::Ip("10.0.2.15".parse().unwrap())
        );
        assert_eq!(
            endpoint("api.hawser.example").unwrap().host(),
            &Host::Dns("api.hawser.example".parse().unwrap())
        );
    }

    #[test]
    fn malformed_endpoints_are_refused_with_the_reason() {
        for (bad, expected) in [
            ("10.0.2.15:0", EndpointError::Port),
            ("10.0.2.15:99999", EndpointError::Port),
            ("10.0.2.15:65536", EndpointError::Port),
            ("10.0.2.15:", EndpointError::Port),
            ("10.0.2.15:+6443", EndpointError::Port),
            ("10.0.2.15:x", EndpointError::Port),
            ("[fd00::1]", EndpointError::Brackets),
            ("[fd00::1", EndpointError::Brackets),
            ("[fd00::1]6443", EndpointError::Brackets),
            ("[fd00::1]:", EndpointError::Port),
            ("fd00::1::6443", EndpointError::UnbracketedIpv6),
            ("a:b:c", EndpointError::UnbracketedIpv6),
            ("", EndpointError::Host(DnsSubdomainError::EmptyLabel)),
            (":6443", EndpointError::Host(DnsSubdomainError::EmptyLabel)),
            (
                "Bad_Host:6443",
                EndpointError::Host(DnsSubdomainError::Character { character: 'B' }),
            ),
            ("-node:6443", EndpointError::Host(DnsSubdomainError::Hyphen)),
        ] {
            assert_eq!(endpoint(bad), Err(expected), "{bad:?}");
        }
        assert!(matches!(
            endpoint("[10.0.2.15]:6443"),
            Err(EndpointError::BracketedHost(_))
        ));
    }

    #[test]
    fn an_api_server_endpoint_needs_a_port() {
        for good in [
            "[fd00::1]:6443",
            "api.hawser.example:6443",
            "10.0.2.15:6443",
        ] {
            let parsed = api_server(good).unwrap();
            assert_eq!(parsed.to_string(), good);
            assert_eq!(parsed.port(), 6443);
            assert_eq!(parsed.endpoint(), &endpoint(good).unwrap());
            assert_eq!(parsed.host(), endpoint(good).unwrap().host());
        }
        for (bad, expected) in [
            ("10.0.2.15", EndpointError::NoPort),
            ("api.hawser.example", EndpointError::NoPort),
            ("fd00::1:6443", EndpointError::NoPort),
            ("10.0.2.15:99999", EndpointError::Port),
            ("--token", EndpointError::Host(DnsSubdomainError::Hyphen)),
        ] {
            assert_eq!(api_server(bad), Err(expected), "{bad:?}");
        }
    }
}
