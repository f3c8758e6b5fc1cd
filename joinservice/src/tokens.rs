//! Bootstrap tokens for `kubeadm join`, through a pluggable issuer.
//!
//! One token per join, never shared: a token is what lets its holder register a kubelet, and a
//! node keeps its ticket on its state disk until kubeadm succeeded, so a shared token would let
//! any one node (or whoever reads its disk's ticket) join further machines for the token's whole
//! life. The join service asks for a short lifetime (`--token-ttl-secs`, 30 minutes).
//!
//! Minting costs a `kubeadm token create` (a process and an API-server round trip), so the
//! join service keeps a pool of tokens minted ahead ([`TokenPool`], `--token-pool`): each still
//! goes to one join only, with most of its lifetime left.
//!
//! The real issuer runs `kubeadm token create --print-join-command` with the admin kubeconfig
//! on a control-plane node, and takes the API server endpoint, token and CA-cert hash from the
//! join command kubeadm prints, checking each against kubeadm's formats. Tests use the same
//! issuer against a stand-in `kubeadm` script that says what it is (kubeadm cannot be
//! downloaded on the build machines).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use hawser_kube_types::{ApiServerEndpoint, BootstrapToken, CaCertHash};

mod pool;

pub use pool::{DEFAULT_POOL_SIZE, TokenPool};

/// What a node needs for bootstrap-token discovery. `Debug` shows the token's ID only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinCredentials {
    pub api_server_endpoint: ApiServerEndpoint,
    pub bootstrap_token: BootstrapToken,
    /// Pins of the cluster CA's public key.
    pub discovery_ca_cert_hashes: Vec<CaCertHash>,
}

/// Why no token could be issued.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// kubeadm could not be started.
    #[error("cannot run {command}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// kubeadm ran and exited with an error; its stderr says why.
    #[error("`{command}` failed with {status}: {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    /// kubeadm succeeded but its output is not a join command of the expected shape.
    #[error("kubeadm printed no usable join command ({reason}): {output:?}")]
    Unparsable {
        reason: &'static str,
        output: String,
    },
}

/// Issues bootstrap tokens. Blocking: call from `spawn_blocking`.
pub trait BootstrapTokenIssuer: Send + Sync {
    fn issue(&self, ttl: Duration) -> Result<JoinCredentials, TokenError>;
}

/// The real issuer: `kubeadm token create` with the admin kubeconfig.
#[derive(Debug, Clone)]
pub struct KubeadmTokenIssuer {
    pub kubeadm: PathBuf,
    pub kubeconfig: PathBuf,
}

impl BootstrapTokenIssuer for KubeadmTokenIssuer {
    fn issue(&self, ttl: Duration) -> Result<JoinCredentials, TokenError> {
        let ttl = format!("{}s", ttl.as_secs().max(1));
        let command = format!(
            "{} token create --print-join-command",
            self.kubeadm.display()
        );
        let output = Command::new(&self.kubeadm)
            .arg("token")
            .arg("create")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--ttl", &ttl, "--print-join-command"])
            .output()
            .map_err(|source| TokenError::Spawn {
                command: command.clone(),
                source,
            })?;
        if !output.status.success() {
            return Err(TokenError::Failed {
                command,
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        parse_join_command(&String::from_utf8_lossy(&output.stdout))
    }
}

/// Parses `kubeadm join <endpoint> --token <t> --discovery-token-ca-cert-hash sha256:<h> …`.
pub fn parse_join_command(output: &str) -> Result<JoinCredentials, TokenError> {
    let unparsable = |reason| TokenError::Unparsable {
        reason,
        // The output holds the secret token: show only its shape.
        output: redact_tokens(output.trim()),
    };
    let line = output
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("kubeadm join "))
        .ok_or_else(|| unparsable("no `kubeadm join` line"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let endpoint: ApiServerEndpoint = words
        .get(2)
        .ok_or_else(|| unparsable("no endpoint"))?
        .parse()
        .map_err(|_| unparsable("the endpoint is not host:port"))?;
    let mut token = None;
    let mut hashes = Vec::new();
    let mut i = 3;
    while i < words.len() {
        match (words[i], words.get(i + 1)) {
            ("--token", Some(v)) => token = Some(*v),
            ("--discovery-token-ca-cert-hash", Some(v)) => hashes.push(*v),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    let token: BootstrapToken = token
        .ok_or_else(|| unparsable("no --token"))?
        .parse()
        .map_err(|_| unparsable("the token is not [a-z0-9]{6}.[a-z0-9]{16}"))?;
    let hashes = hashes
        .iter()
        .map(|h| h.parse::<CaCertHash>())
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| unparsable("no well-formed --discovery-token-ca-cert-hash sha256:<hex>"))?;
    Ok(JoinCredentials {
        api_server_endpoint: endpoint,
        bootstrap_token: token,
        discovery_ca_cert_hashes: hashes,
    })
}

fn redact_tokens(text: &str) -> String {
    text.split_whitespace()
        .map(|w| {
            if w.parse::<BootstrapToken>().is_ok() {
                "<token>"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_kubeadms_join_command() {
        let out = format!(
            "kubeadm join 10.42.0.1:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash {HASH} \n"
        );
        let creds = parse_join_command(&out).unwrap();
        assert_eq!(creds.api_server_endpoint.to_string(), "10.42.0.1:6443");
        assert_eq!(
            creds.bootstrap_token.expose_secret(),
            "abcdef.0123456789abcdef"
        );
        assert_eq!(creds.discovery_ca_cert_hashes, [HASH.parse().unwrap()]);
        let debug = format!("{creds:?}");
        assert!(debug.contains("abcdef.<redacted>") && !debug.contains("0123456789abcdef --"));
        assert!(!debug.contains("abcdef.0123456789abcdef"), "{debug}");
        assert!(
            debug.contains("10.42.0.1:6443") && debug.contains(HASH),
            "{debug}"
        );
    }

    #[test]
    fn refuses_malformed_join_commands_without_echoing_the_token() {
        for (out, reason) in [
            ("nothing useful", "no `kubeadm join` line"),
            (
                "kubeadm join --token abcdef.0123456789abcdef",
                "the endpoint is not host:port",
            ),
            (
                &format!("kubeadm join h:1 --discovery-token-ca-cert-hash {HASH}") as &str,
                "no --token",
            ),
            (
                &format!(
                    "kubeadm join h:1 --token ABCDEF.0123456789abcdef --discovery-token-ca-cert-hash {HASH}"
                ) as &str,
                "the token is not [a-z0-9]{6}.[a-z0-9]{16}",
            ),
            (
                "kubeadm join h:1 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash sha256:xyz",
                "no well-formed --discovery-token-ca-cert-hash sha256:<hex>",
            ),
        ] {
            match parse_join_command(out) {
                Err(TokenError::Unparsable { reason: r, output }) => {
                    assert_eq!(r, reason, "{out}");
                    assert!(
                        !output.contains("abcdef.0123456789abcdef"),
                        "token leaked: {output}"
                    );
                }
                other => panic!("{out}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_endpoint_must_be_host_and_port_as_kubeadm_join_takes_it() {
        for endpoint in [
            "10.42.0.1",
            "fd00::1:6443",
            "[fd00::1]",
            "10.42.0.1:0",
            "Bad_Host:6443",
        ] {
            let out = format!(
                "kubeadm join {endpoint} --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash {HASH}"
            );
            match parse_join_command(&out) {
                Err(TokenError::Unparsable { reason, .. }) => {
                    assert_eq!(reason, "the endpoint is not host:port", "{endpoint}")
                }
                other => panic!("{endpoint}: {other:?}"),
            }
        }
        let out = format!(
            "kubeadm join [fd00::1]:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash {HASH} --discovery-token-ca-cert-hash {}",
            HASH.replace('0', "f")
        );
        let creds = parse_join_command(&out).unwrap();
        assert_eq!(creds.api_server_endpoint.to_string(), "[fd00::1]:6443");
        assert_eq!(creds.discovery_ca_cert_hashes.len(), 2);
    }

    #[test]
    fn the_kubeadm_issuer_honours_the_contract_of_the_stand_in() {
        let standin =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubeadm-standin");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("admin.conf");
        std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
        let issuer = KubeadmTokenIssuer {
            kubeadm: standin.clone(),
            kubeconfig: kubeconfig.clone(),
        };
        let creds = issuer.issue(Duration::from_secs(3600)).unwrap();
        // The token is a `BootstrapToken`: well-formed, or the issuer would have failed.
        assert_eq!(creds.api_server_endpoint.to_string(), "10.42.0.1:6443");
        // Each call is a new token.
        assert_ne!(
            issuer
                .issue(Duration::from_secs(60))
                .unwrap()
                .bootstrap_token,
            creds.bootstrap_token
        );
        // The stand-in refuses what real kubeadm refuses: a missing kubeconfig.
        let broken = KubeadmTokenIssuer {
            kubeadm: standin,
            kubeconfig: dir.path().join("missing.conf"),
        };
        let err = broken.issue(Duration::from_secs(60)).unwrap_err();
        assert!(err.to_string().contains("missing.conf"), "{err}");
    }
}
