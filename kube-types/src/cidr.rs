//! IP ranges in CIDR notation: the cluster's Service and Pod subnets.

use std::fmt;
use std::net::{AddrParseError, IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The most host bits a Service range may have: 2^20 addresses, /12 for IPv4 and /108 for IPv6.
/// The API server refuses larger ranges (its allocator keeps a bitmap of the whole range), and
/// kubeadm checks `networking.serviceSubnet` against the same limit.
pub const MAX_SERVICE_HOST_BITS: u8 = 20;

/// An IPv4 or IPv6 network, `<network address>/<prefix length>`, with no host bits set:
/// `10.96.0.0/12`, `fd00:10:96::/108`. `Display` gives the canonical text (IPv6 compressed,
/// no leading zeros in the prefix length).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix_len: u8,
}

/// Why a text is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// There is no `/` between the address and the prefix length.
    #[error("expected <network address>/<prefix length>, e.g. 10.96.0.0/12; there is no '/'")]
    NoSlash,
    /// The part before the `/` is not an IPv4 or IPv6 address.
    #[error("the part before the '/' is not an IPv4 or IPv6 address")]
    Address(#[source] AddrParseError),
    /// The part after the `/` is not a decimal number no larger than the address's bit count.
    #[error("the prefix length after the '/' is not a number from 0 to {max}")]
    PrefixLength {
        /// 32 for IPv4, 128 for IPv6.
        max: u8,
    },
    /// The address has bits set past the prefix: it names a host in the network, not the
    /// network.
    #[error(
        "host bits are set past the /{prefix_len} prefix (the network is {network}/{prefix_len})"
    )]
    HostBits {
        /// The address with the host bits cleared.
        network: IpAddr,
        prefix_len: u8,
    },
}

impl Cidr {
    /// The network address (no host bits set).
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length: 0 to 32 (IPv4) or 0 to 128 (IPv6).
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// The bits past the prefix: the range holds 2^`host_bits` addresses.
    pub fn host_bits(&self) -> u8 {
        address_bits(self.network) - self.prefix_len
    }
}

/// 32 for IPv4, 128 for IPv6.
fn address_bits(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Cidr, CidrError> {
        let (address, prefix) = text.split_once('/').ok_or(CidrError::NoSlash)?;
        let address: IpAddr = address.parse().map_err(CidrError::Address)?;
        let max = address_bits(address);
        // Digits only: `u8::from_str` would also take a sign ("+16").
        let prefix_len = Some(prefix)
            .filter(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u8>().ok())
            .filter(|p| *p <= max)
            .ok_or(CidrError::PrefixLength { max })?;
        let network = mask(address, prefix_len);
        if network != address {
            return Err(CidrError::HostBits {
                network,
                prefix_len,
            });
        }
        Ok(Cidr {
            network,
            prefix_len,
        })
    }
}

/// `address` with the bits past `prefix_len` cleared.
fn mask(address: IpAddr, prefix_len: u8) -> IpAddr {
    let keep = |bits: u32| -> u128 {
        let host_bits = bits - u32::from(prefix_len);
        if host_bits == 128 {
            0
        } else {
            !((1u128 << host_bits) - 1)
        }
    };
    match address {
        IpAddr::V4(v4) => {
            // The mask of a 32-bit address fits in 32 bits.
            let masked = u128::from(u32::from(v4)) & keep(32);
            IpAddr::V4(Ipv4Addr::from(masked as u32))
        }
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & keep(128))),
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cidr({self})")
    }
}

/// The cluster's Service IP range (`networking.serviceSubnet`, the API server's
/// `--service-cluster-ip-range`): a [`Cidr`] of at most 2^[`MAX_SERVICE_HOST_BITS`] addresses.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServiceCidr(Cidr);

/// Why a text is not a Service range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceCidrError {
    /// The text is not a CIDR.
    #[error(transparent)]
    Cidr(#[from] CidrError),
    /// The range has more addresses than the API server allows for Services.
    #[error(
        "too large: /{prefix_len} holds 2^{host_bits} addresses, and Services may have at most \
         2^20 (/12 for IPv4, /108 for IPv6)"
    )]
    TooLarge { prefix_len: u8, host_bits: u8 },
}

impl ServiceCidr {
    /// The range as a plain CIDR.
    pub fn cidr(&self) -> Cidr {
        self.0
    }
}

impl TryFrom<Cidr> for ServiceCidr {
    type Error = ServiceCidrError;

    fn try_from(cidr: Cidr) -> Result<ServiceCidr, ServiceCidrError> {
        if cidr.host_bits() > MAX_SERVICE_HOST_BITS {
            return Err(ServiceCidrError::TooLarge {
                prefix_len: cidr.prefix_len(),
                host_bits: cidr.host_bits(),
            });
        }
        Ok(ServiceCidr(cidr))
    }
}

impl FromStr for ServiceCidr {
    type Err = ServiceCidrError;

    fn from_str(text: &str) -> Result<ServiceCidr, ServiceCidrError> {
        ServiceCidr::try_from(text.parse::<Cidr>()?)
    }
}

impl fmt::Display for ServiceCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for ServiceCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceCidr({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Result<Cidr, CidrError> {
        text.parse()
    }

    #[test]
    fn networks_parse_and_print_canonically() {
        for (text, canonical, host_bits) in [
            ("10.96.0.0/12", "10.96.0.0/12", 20),
            ("10.244.0.0/16", "10.244.0.0/16", 16),
            ("0.0.0.0/0", "0.0.0.0/0", 32),
            ("10.0.2.15/32", "10.0.2.15/32", 0),
            ("fd00:10:96::/108", "fd00:10:96::/108", 20),
            ("FD00:0010:0096:0000::/108", "fd00:10:96::/108", 20),
            ("::/0", "::/0", 128),
            ("fd00::1/128", "fd00::1/128", 0),
            ("10.96.0.0/012", "10.96.0.0/12", 20),
        ] {
            let parsed = cidr(text).unwrap();
            assert_eq!(parsed.to_string(), canonical, "{text}");
            assert_eq!(parsed.host_bits(), host_bits, "{text}");
            assert_eq!(cidr(canonical), Ok(parsed));
        }
        let v6 = cidr("fd00:10:96::/108").unwrap();
        assert_eq!(v6.network(), "fd00:10:96::".parse::<IpAddr>().unwrap());
        assert_eq!(v6.prefix_len(), 108);
        assert_eq!(format!("{v6:?}"), "Cidr(fd00:10:96::/108)");
    }

    #[test]
    fn malformed_cidrs_are_refused_with_the_reason() {
        let host_bits = |network: &str, prefix_len| CidrError::HostBits {
            network: network.parse().unwrap(),
            prefix_len,
        };
        for (text, expected) in [
            ("10.96.0.0", CidrError::NoSlash),
            ("", CidrError::NoSlash),
            ("10.96.0.1/12", host_bits("10.96.0.0", 12)),
            ("10.96.0.0/8", host_bits("10.0.0.0", 8)),
            ("0.0.0.1/0", host_bits("0.0.0.0", 0)),
            ("fd00::1/64", host_bits("fd00::", 64)),
            ("10.96.0.0/33", CidrError::PrefixLength { max: 32 }),
            ("fd00::/129", CidrError::PrefixLength { max: 128 }),
            ("10.244.0.0/+16", CidrError::PrefixLength { max: 32 }),
            ("10.244.0.0/", CidrError::PrefixLength { max: 32 }),
            ("10.244.0.0/0016", CidrError::PrefixLength { max: 32 }),
            ("10.244.0.0/16/16", CidrError::PrefixLength { max: 32 }),
            ("10.244.0.0/ 16", CidrError::PrefixLength { max: 32 }),
            (
                "10.244.0.0/16,fd00::/56",
                CidrError::PrefixLength { max: 32 },
            ),
        ] {
            assert_eq!(cidr(text), Err(expected), "{text:?}");
        }
        for text in [
            "10.96.0/12",
            "10.96.0.256/24",
            " 10.96.0.0/12",
            "fe80::1%eth0/64",
            "/12",
        ] {
            assert!(
                matches!(cidr(text), Err(CidrError::Address(_))),
                "{text:?}: {:?}",
                cidr(text)
            );
        }
        let err = cidr("10.96.0.1/12").unwrap_err().to_string();
        assert_eq!(
            err,
            "host bits are set past the /12 prefix (the network is 10.96.0.0/12)"
        );
    }

    #[test]
    fn a_service_range_has_at_most_2_to_the_20_addresses() {
        for good in [
            "10.96.0.0/12",
            "10.96.0.0/24",
            "fd00:10:96::/108",
            "fd00:10:96::1/128",
        ] {
            let service: ServiceCidr = good.parse().unwrap();
            assert_eq!(service.to_string(), good);
            assert_eq!(service.cidr(), cidr(good).unwrap());
        }
        assert_eq!(
            "10.0.0.0/8".parse::<ServiceCidr>(),
            Err(ServiceCidrError::TooLarge {
                prefix_len: 8,
                host_bits: 24
            })
        );
        let err = "fd00:10::/107".parse::<ServiceCidr>().unwrap_err();
        assert_eq!(
            err,
            ServiceCidrError::TooLarge {
                prefix_len: 107,
                host_bits: 21
            }
        );
        assert!(err.to_string().contains("too large"), "{err}");
        // Not a CIDR: the CIDR's own reason.
        assert_eq!(
            "10.96.0.0/33".parse::<ServiceCidr>(),
            Err(ServiceCidrError::Cidr(CidrError::PrefixLength { max: 32 }))
        );
        assert_eq!(
            "10.96.0.1/12"
                .parse::<ServiceCidr>()
                .unwrap_err()
                .to_string(),
            cidr("10.96.0.1/12").unwrap_err().to_string()
        );
    }
}
