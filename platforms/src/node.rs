//! The node side: gathering a platform's evidence where the platform keeps it.
//!
//! - vTPM profiles (`gather_nv`, feature `tpm`): each NV index of [`Platform::nv_layout`], read whole through
//!   the node's TPM (`hawser_attestation::tpm::Tpm::read_nv`, chunked, up to 16 KiB). A required
//!   index that is not defined fails naming the index, what belongs there and the profile: the
//!   image was booted on another platform than its cluster's measurements select.
//! - bare SEV-SNP and TDX ([`tsm_report`]): Linux's configfs-tsm
//!   (`/sys/kernel/config/tsm/report`, Linux ≥ 6.7): a report directory is made, the 64-byte
//!   REPORT_DATA written to `inblob`, the report read from `outblob` (an SNP attestation report,
//!   or a TD quote the host's quoting service signed), the certificates (SNP's extended report)
//!   from `auxblob`, and `generation` read before and after: another writer in between makes
//!   the report someone else's, and the read is refused.
//!
//! PID 1 does not call these yet: its evidence carries the qemu profile only (the aTLS
//! evidence's `variant`). `docs/platforms.md` says how the evidence grows.

use std::path::{Path, PathBuf};

use crate::profile::{HardwareSource, Platform};

/// Why a node cannot gather its platform's evidence.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "NV index {index:#010x} ({what}) is not defined on this TPM: is this a {platform} VM? The cluster's measurements select {platform}"
    )]
    Missing {
        index: u32,
        what: &'static str,
        platform: Platform,
    },
    #[cfg(feature = "tpm")]
    #[error("reading NV index {index:#010x} ({what})")]
    Tpm {
        index: u32,
        what: &'static str,
        #[source]
        source: Box<hawser_attestation::tpm::TpmError>,
    },
    #[error(
        "{path} does not exist: the kernel has no configfs-tsm (Linux 6.7 or later, configfs mounted at /sys/kernel/config) or no TSM provider; {platform} needs the {provider} driver"
    )]
    NoTsm {
        path: PathBuf,
        platform: Platform,
        provider: &'static str,
    },
    #[error("configfs-tsm's provider is {found}, the {platform} profile needs {expected}")]
    Provider {
        platform: Platform,
        expected: &'static str,
        found: String,
    },
    #[error("{platform} evidence does not come from configfs-tsm")]
    NotTsm { platform: Platform },
    #[error(
        "another report was requested through {path} while this one was made (generation {before} then {after}): refused, ask again"
    )]
    Raced {
        path: PathBuf,
        before: u64,
        after: u64,
    },
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Reads every NV index of `platform`'s layout from `tpm`: the defined ones by index, a missing
/// optional one left out, a missing required one refused.
#[cfg(feature = "tpm")]
pub fn gather_nv(
    tpm: &hawser_attestation::tpm::Tpm,
    platform: Platform,
) -> Result<std::collections::BTreeMap<u32, Vec<u8>>, NodeError> {
    use hawser_attestation::tpm::TpmError;
    let mut found = std::collections::BTreeMap::new();
    for nv in platform.nv_layout() {
        match tpm.read_nv(nv.index) {
            Ok(data) => {
                found.insert(nv.index, data);
            }
            Err(TpmError::NvIndexMissing { .. }) if !nv.required => {}
            Err(TpmError::NvIndexMissing { .. }) => {
                return Err(NodeError::Missing {
                    index: nv.index,
                    what: nv.what,
                    platform,
                });
            }
            Err(source) => {
                return Err(NodeError::Tpm {
                    index: nv.index,
                    what: nv.what,
                    source: Box::new(source),
                });
            }
        }
    }
    Ok(found)
}

/// A report configfs-tsm made.
#[derive(Debug, Clone)]
pub struct TsmReport {
    /// The SNP attestation report or the TD quote.
    pub outblob: Vec<u8>,
    /// SNP's certificate table (VCEK/VLEK and chain) when the host supplies it; empty otherwise.
    pub auxblob: Vec<u8>,
    pub provider: String,
}

/// Asks configfs-tsm under `tsm_root` (`/sys/kernel/config/tsm` on a guest) for a report binding
/// `report_data`, in a report directory named `name` (made, and removed afterwards).
pub fn tsm_report(
    tsm_root: &Path,
    platform: Platform,
    name: &str,
    report_data: &[u8; 64],
) -> Result<TsmReport, NodeError> {
    let HardwareSource::ConfigfsTsm { provider: expected } = platform.hardware_source() else {
        return Err(NodeError::NotTsm { platform });
    };
    let reports = tsm_root.join("report");
    if !reports.is_dir() {
        return Err(NodeError::NoTsm {
            path: reports,
            platform,
            provider: expected,
        });
    }
    let dir = reports.join(name);
    let io = |action: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| NodeError::Io {
            action,
            path,
            source,
        }
    };
    std::fs::create_dir(&dir).map_err(io("making the report directory", &dir))?;
    let result = (|| {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(io("reading", &path))
        };
        let generation = || -> Result<u64, NodeError> {
            let path = dir.join("generation");
            let text = std::fs::read_to_string(&path).map_err(io("reading", &path))?;
            text.trim().parse().map_err(|_| NodeError::Io {
                action: "parsing the generation counter of",
                path,
                source: std::io::Error::from(std::io::ErrorKind::InvalidData),
            })
        };
        let provider = String::from_utf8_lossy(&read("provider")?)
            .trim()
            .to_owned();
        if provider != expected {
            return Err(NodeError::Provider {
                platform,
                expected,
                found: provider,
            });
        }
        let inblob = dir.join("inblob");
        std::fs::write(&inblob, report_data).map_err(io("writing", &inblob))?;
        let before = generation()?;
        let outblob = read("outblob")?;
        let auxblob = match std::fs::read(dir.join("auxblob")) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io("reading", &dir.join("auxblob"))(e)),
        };
        let after = generation()?;
        if before != after {
            return Err(NodeError::Raced {
                path: dir.clone(),
                before,
                after,
            });
        }
        Ok(TsmReport {
            outblob,
            auxblob,
            provider,
        })
    })();
    // configfs removes the directory with its attribute files.
    if let Err(err) = std::fs::remove_dir(&dir) {
        tracing::warn!(path = %dir.display(), %err, "removing the configfs-tsm report directory failed");
    }
    result
}
