//! Applying a lease to an interface: the classic `SIOCSIF*` / `SIOCADDRT` ioctls on an
//! `AF_INET` datagram socket, as [`crate::platform::net`] does for its static address, plus
//! the MTU and routes with an output device (on-link routes need one).

use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;

use super::message::Route;
use crate::platform::net::{ifreq, ioctl_socket, raw_ioctl, sockaddr_in};

/// An interface ioctl that failed: what it was for, and the kernel's answer.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what}")]
pub struct LinkError {
    pub what: String,
    #[source]
    pub source: io::Error,
}

fn failed(what: impl Into<String>) -> impl FnOnce(io::Error) -> LinkError {
    let what = what.into();
    move |source| LinkError { what, source }
}

/// The socket the ioctls go through.
pub struct Link {
    socket: OwnedFd,
    name: String,
}

impl Link {
    /// Opens the ioctl socket for interface `name`.
    pub fn open(name: &str) -> Result<Link, LinkError> {
        Ok(Link {
            socket: ioctl_socket().map_err(failed("open a socket to configure the network"))?,
            name: name.to_owned(),
        })
    }

    fn ifreq(&self) -> libc::ifreq {
        ifreq(&self.name)
    }

    /// `arg` points to a live, initialized struct of the type `request` expects (`ifreq` or
    /// `rtentry`), owned by the caller for the duration of the call.
    fn ioctl(&self, request: libc::c_ulong, arg: *mut libc::c_void) -> io::Result<()> {
        raw_ioctl(&self.socket, request, arg)
    }

    /// Sets the interface up (and `RUNNING`).
    pub fn up(&self) -> Result<(), LinkError> {
        let mut req = self.ifreq();
        self.ioctl(libc::SIOCGIFFLAGS, (&raw mut req).cast())
            .map_err(failed(format!("read the flags of {}", self.name)))?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        self.ioctl(libc::SIOCSIFFLAGS, (&raw mut req).cast())
            .map_err(failed(format!("bring up {}", self.name)))
    }

    /// Sets the address and then the netmask.
    pub fn set_address(&self, address: Ipv4Addr, netmask: Ipv4Addr) -> Result<(), LinkError> {
        let mut req = self.ifreq();
        req.ifr_ifru.ifru_addr = sockaddr_in(address);
        self.ioctl(libc::SIOCSIFADDR, (&raw mut req).cast())
            .map_err(failed(format!("set address {address} on {}", self.name)))?;
        let mut req = self.ifreq();
        req.ifr_ifru.ifru_netmask = sockaddr_in(netmask);
        self.ioctl(libc::SIOCSIFNETMASK, (&raw mut req).cast())
            .map_err(failed(format!("set netmask {netmask} on {}", self.name)))
    }

    /// Sets the MTU.
    pub fn set_mtu(&self, mtu: u16) -> Result<(), LinkError> {
        let mut req = self.ifreq();
        req.ifr_ifru.ifru_mtu = libc::c_int::from(mtu);
        self.ioctl(libc::SIOCSIFMTU, (&raw mut req).cast())
            .map_err(failed(format!("set MTU {mtu} on {}", self.name)))
    }

    /// Adds `route` out of this interface; a route the kernel already has is fine.
    pub fn add_route(&self, route: &Route) -> Result<(), LinkError> {
        let what = || match route.gateway {
            Some(gateway) => format!(
                "add route {}/{} via {gateway} on {}",
                route.destination, route.prefix_len, self.name
            ),
            None => format!(
                "add route {}/{} on {}",
                route.destination, route.prefix_len, self.name
            ),
        };
        let device = CString::new(self.name.as_str()).map_err(|_| LinkError {
            what: what(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        let mask = match route.prefix_len {
            0 => 0,
            n => u32::MAX << (32 - u32::from(n.min(32))),
        };
        // SAFETY: rtentry is plain old data; all-zero is a valid value.
        let mut entry: libc::rtentry = unsafe { std::mem::zeroed() };
        entry.rt_dst = sockaddr_in(Ipv4Addr::from(u32::from(route.destination) & mask));
        entry.rt_genmask = sockaddr_in(Ipv4Addr::from(mask));
        entry.rt_flags = libc::RTF_UP;
        if let Some(gateway) = route.gateway {
            entry.rt_gateway = sockaddr_in(gateway);
            entry.rt_flags |= libc::RTF_GATEWAY;
        }
        if route.prefix_len == 32 {
            entry.rt_flags |= libc::RTF_HOST;
        }
        // The kernel only reads the name (`rt_dev` is `char *` for historical reasons);
        // `device` outlives the call.
        entry.rt_dev = device.as_ptr().cast_mut();
        match self.ioctl(libc::SIOCADDRT, (&raw mut entry).cast()) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            result => result.map_err(|source| LinkError {
                what: what(),
                source,
            }),
        }
    }
}
