//! What a join service advertises: its TXT record, encoded and checked field by field.
//!
//! Every value comes from the network, from anyone on the LAN: decoding bounds and checks each
//! field and names the one it refuses. Keys the decoder does not know are ignored, so a later
//! join service can add some without breaking older nodes.

use std::collections::HashMap;
use std::time::Duration;

/// TXT key: the cluster ID (lowercase hex, hyphens allowed, as in a UUID).
pub const KEY_CLUSTER: &str = "cluster";
/// TXT key: the join service's version.
pub const KEY_VERSION: &str = "version";
/// TXT key: the port of the Kubernetes API server next to the join service.
pub const KEY_API_PORT: &str = "api";
/// TXT key: seconds between the join service's announcements (optional).
pub const KEY_INTERVAL: &str = "interval";

/// Bounds of a cluster ID: hawser's is 32 bytes in hex (64 characters); a UUID is 36.
const CLUSTER_ID_LEN: std::ops::RangeInclusive<usize> = 8..=64;
/// Longest version accepted (semver with a pre-release tag fits easily).
const VERSION_LEN_MAX: usize = 32;
/// A DNS label, the most an mDNS instance name can be.
const INSTANCE_LEN_MAX: usize = 63;
/// Announcement intervals accepted, in seconds: an hour at most, so that a stale entry cannot
/// linger for half a day on a typo.
const INTERVAL_SECS: std::ops::RangeInclusive<u64> = 1..=3600;

/// One join service, as its mDNS advert describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinServiceAdvert {
    /// The mDNS instance name (one DNS label), unique on the LAN, e.g. the control plane's name.
    pub instance: String,
    /// The cluster the join service belongs to.
    pub cluster_id: String,
    /// The join service's version.
    pub version: String,
    /// The join service's port (the SRV record's).
    pub port: u16,
    /// The Kubernetes API server's port.
    pub api_port: u16,
    /// How often the join service announces itself; `None` for adverts that do not say (such as
    /// one published with `avahi-publish`), which are then taken to announce every
    /// [`crate::sightings::DEFAULT_INTERVAL`].
    pub interval: Option<Duration>,
}

/// Why an advert was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdvertError {
    /// The TXT record lacks a field every advert must carry.
    #[error("the advert has no `{key}` field")]
    Missing {
        /// The missing TXT key.
        key: &'static str,
    },
    /// A field's value is not what hawser accepts.
    #[error("the advert's `{key}` field {value:?} is not {expected}")]
    Malformed {
        /// The TXT key.
        key: &'static str,
        /// The value as received (lossily decoded if not UTF-8).
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// The instance name cannot be an mDNS instance label.
    #[error("the instance name {instance:?} is not 1 to 63 printable characters without dots")]
    Instance {
        /// The name given.
        instance: String,
    },
    /// The advert names port 0.
    #[error("the advert's port is 0")]
    Port,
}

impl JoinServiceAdvert {
    /// Checks every field, as [`JoinServiceAdvert::from_txt`] does for a received advert.
    pub fn validate(&self) -> Result<(), AdvertError> {
        check_instance(&self.instance)?;
        check_cluster_id(&self.cluster_id)?;
        check_version(&self.version)?;
        if self.port == 0 {
            return Err(AdvertError::Port);
        }
        if self.api_port == 0 {
            return Err(malformed(KEY_API_PORT, "0", "a port from 1 to 65535"));
        }
        if let Some(interval) = self.interval
            && (!INTERVAL_SECS.contains(&interval.as_secs()) || interval.subsec_nanos() != 0)
        {
            let value = format!("{interval:?}");
            return Err(malformed(
                KEY_INTERVAL,
                &value,
                "whole seconds from 1 to 3600",
            ));
        }
        Ok(())
    }

    /// The TXT record's key/value pairs, in a fixed order.
    pub fn to_txt(&self) -> Vec<(String, String)> {
        let mut txt = vec![
            (KEY_CLUSTER.to_owned(), self.cluster_id.clone()),
            (KEY_VERSION.to_owned(), self.version.clone()),
            (KEY_API_PORT.to_owned(), self.api_port.to_string()),
        ];
        if let Some(interval) = self.interval {
            txt.push((KEY_INTERVAL.to_owned(), interval.as_secs().to_string()));
        }
        txt
    }

    /// Decodes and checks a received advert: the instance name and port from its SRV record,
    /// the rest from its TXT record (keys as received, values as bytes: TXT values need not be
    /// UTF-8). Unknown keys are ignored.
    pub fn from_txt(
        instance: &str,
        port: u16,
        txt: &HashMap<String, Vec<u8>>,
    ) -> Result<Self, AdvertError> {
        let field = |key: &'static str| -> Result<Option<&str>, AdvertError> {
            match txt.get(key) {
                None => Ok(None),
                Some(bytes) => std::str::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| malformed(key, &String::from_utf8_lossy(bytes), "UTF-8 text")),
            }
        };
        let required = |key: &'static str| field(key)?.ok_or(AdvertError::Missing { key });

        let api = required(KEY_API_PORT)?;
        let api_port = parse_port(api)
            .ok_or_else(|| malformed(KEY_API_PORT, api, "a port from 1 to 65535"))?;
        let interval = match field(KEY_INTERVAL)? {
            None => None,
            Some(secs) => Some(
                secs.parse::<u64>()
                    .ok()
                    .filter(|s| INTERVAL_SECS.contains(s) && !secs.starts_with('+'))
                    .map(Duration::from_secs)
                    .ok_or_else(|| malformed(KEY_INTERVAL, secs, "whole seconds from 1 to 3600"))?,
            ),
        };
        let advert = JoinServiceAdvert {
            instance: instance.to_owned(),
            cluster_id: required(KEY_CLUSTER)?.to_owned(),
            version: required(KEY_VERSION)?.to_owned(),
            port,
            api_port,
            interval,
        };
        advert.validate()?;
        Ok(advert)
    }
}

fn malformed(key: &'static str, value: &str, expected: &'static str) -> AdvertError {
    AdvertError::Malformed {
        key,
        value: value.to_owned(),
        expected,
    }
}

fn parse_port(text: &str) -> Option<u16> {
    if text.starts_with('+') {
        return None;
    }
    text.parse::<u16>().ok().filter(|&port| port != 0)
}

fn check_instance(instance: &str) -> Result<(), AdvertError> {
    let fits = !instance.is_empty()
        && instance.len() <= INSTANCE_LEN_MAX
        && !instance.contains('.')
        && !instance.chars().any(char::is_control);
    if fits {
        Ok(())
    } else {
        Err(AdvertError::Instance {
            instance: instance.to_owned(),
        })
    }
}

fn check_cluster_id(cluster_id: &str) -> Result<(), AdvertError> {
    let fits = CLUSTER_ID_LEN.contains(&cluster_id.len())
        && cluster_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
        && !cluster_id.starts_with('-')
        && !cluster_id.ends_with('-');
    if fits {
        Ok(())
    } else {
        Err(malformed(
            KEY_CLUSTER,
            cluster_id,
            "8 to 64 lowercase hex digits (hyphens between them allowed)",
        ))
    }
}

fn check_version(version: &str) -> Result<(), AdvertError> {
    let fits = !version.is_empty()
        && version.len() <= VERSION_LEN_MAX
        && version.bytes().all(|b| b.is_ascii_graphic());
    if fits {
        Ok(())
    } else {
        Err(malformed(
            KEY_VERSION,
            version,
            "1 to 32 printable ASCII characters without spaces",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "5f1c0de0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c";

    fn advert() -> JoinServiceAdvert {
        JoinServiceAdvert {
            instance: "cp-0".into(),
            cluster_id: CLUSTER.into(),
            version: "0.1.0".into(),
            port: 9090,
            api_port: 6443,
            interval: Some(Duration::from_secs(30)),
        }
    }

    fn txt_of(advert: &JoinServiceAdvert) -> HashMap<String, Vec<u8>> {
        advert
            .to_txt()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect()
    }

    fn decode(txt: &HashMap<String, Vec<u8>>) -> Result<JoinServiceAdvert, AdvertError> {
        JoinServiceAdvert::from_txt("cp-0", 9090, txt)
    }

    fn with(key: &str, value: &[u8]) -> HashMap<String, Vec<u8>> {
        let mut txt = txt_of(&advert());
        txt.insert(key.into(), value.to_vec());
        txt
    }

    fn refused_field(result: Result<JoinServiceAdvert, AdvertError>) -> &'static str {
        match result {
            Err(AdvertError::Malformed { key, .. } | AdvertError::Missing { key }) => key,
            other => panic!("expected a refused field, got {other:?}"),
        }
    }

    #[test]
    fn round_trip() {
        assert_eq!(decode(&txt_of(&advert())), Ok(advert()));
        let without_interval = JoinServiceAdvert {
            interval: None,
            ..advert()
        };
        assert_eq!(decode(&txt_of(&without_interval)), Ok(without_interval));
    }

    #[test]
    fn uuid_cluster_ids_are_accepted() {
        let txt = with(KEY_CLUSTER, b"0b6f3e1a-94c4-4b8e-9a53-2d5c7e0f1a2b");
        assert!(decode(&txt).is_ok());
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let txt = with("seq", b"17");
        assert_eq!(decode(&txt), Ok(advert()));
    }

    #[test]
    fn every_missing_field_is_named() {
        for key in [KEY_CLUSTER, KEY_VERSION, KEY_API_PORT] {
            let mut txt = txt_of(&advert());
            txt.remove(key);
            assert_eq!(decode(&txt), Err(AdvertError::Missing { key }));
        }
    }

    #[test]
    fn malformed_cluster_ids_are_refused() {
        let long = "a".repeat(65);
        for bad in [
            &b"ABCDEF0123"[..],
            b"short",
            long.as_bytes(),
            b"-abcdef0123",
            b"abcdef0123-",
            b"abcdef 0123",
            b"",
            b"\xff\xfe0123456789",
        ] {
            assert_eq!(refused_field(decode(&with(KEY_CLUSTER, bad))), KEY_CLUSTER);
        }
    }

    #[test]
    fn malformed_versions_are_refused() {
        let long = "1".repeat(33);
        for bad in [&b""[..], b"1.0 beta", long.as_bytes(), b"1.0\n"] {
            assert_eq!(refused_field(decode(&with(KEY_VERSION, bad))), KEY_VERSION);
        }
    }

    #[test]
    fn malformed_api_ports_are_refused() {
        for bad in [&b"0"[..], b"65536", b"-1", b"+6443", b"https", b""] {
            assert_eq!(
                refused_field(decode(&with(KEY_API_PORT, bad))),
                KEY_API_PORT
            );
        }
    }

    #[test]
    fn malformed_intervals_are_refused() {
        for bad in [&b"0"[..], b"3601", b"1.5", b"+5", b"soon"] {
            assert_eq!(
                refused_field(decode(&with(KEY_INTERVAL, bad))),
                KEY_INTERVAL
            );
        }
    }

    #[test]
    fn bad_instances_and_ports_are_refused() {
        let txt = txt_of(&advert());
        for bad in ["", "cp.0", &"x".repeat(64), "cp\n0"] {
            assert!(matches!(
                JoinServiceAdvert::from_txt(bad, 9090, &txt),
                Err(AdvertError::Instance { .. })
            ));
        }
        assert_eq!(
            JoinServiceAdvert::from_txt("cp-0", 0, &txt),
            Err(AdvertError::Port)
        );
    }

    #[test]
    fn messages_name_the_field() {
        let error = decode(&with(KEY_API_PORT, b"https")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the advert's `api` field \"https\" is not a port from 1 to 65535"
        );
    }
}
