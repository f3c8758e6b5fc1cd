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
//! - [`issuer_for`] (feature `tpm`): the evidence issuer PID 1 attests with, per profile;
//!   [`issuer_for_azure`] on Azure, whose evidence also needs Azure's metadata service.
//! - [`azure_evidence_parts`]: what an Azure node's evidence carries besides the TPM quote,
//!   assembled from what the TPM's NV and the metadata service gave (no TPM access: the
//!   captured vectors go through it in the tests).
//! - [`TsmIssuer`]: bare SEV-SNP and TDX evidence through configfs-tsm.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use hawser_attestation::evidence::{
    Binding, EVIDENCE_VERSION, Evidence, EvidenceIssuer, IssueError, Variant,
    split_certificate_chain,
};

use crate::azure::{AzureError, HardwareReport, HclReport};
use crate::profile::{HardwareSource, Platform};

/// Azure's vTPM attestation key: persistent at this handle, made by the paravisor at boot (an
/// RSA-2048 restricted signing primary of the endorsement hierarchy, RSASSA-SHA256).
pub const AZURE_AK_HANDLE: u32 = 0x8100_0003;

/// The TDREPORT's size: the start of an Azure TDX HCL report's hardware report slot.
const TDREPORT_LEN: usize = 1024;

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
    #[cfg(feature = "tpm")]
    #[error("the {platform} attestation key cannot be made")]
    Issuer {
        platform: Platform,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "the {0} profile's evidence does not come from the TPM: its issuer is node::TsmIssuer (configfs-tsm)"
    )]
    NoIssuer(Platform),
    #[error(
        "the {0} profile's evidence needs Azure's metadata service (the VCEK chain or the TD quote): its issuer is node::issuer_for_azure"
    )]
    NeedsMetadata(Platform),
    #[error("the {0} profile is not an Azure confidential VM's")]
    NotAzure(Platform),
    #[error("the HCL report in NV 0x01400001 is unusable for the {platform} profile")]
    Hcl {
        platform: Platform,
        #[source]
        source: Box<AzureError>,
    },
    #[error("asking Azure's metadata service for {what} failed")]
    Metadata {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "Azure's metadata service gave no {what}: {platform} evidence cannot be verified without it"
    )]
    NoAux {
        platform: Platform,
        what: &'static str,
    },
    #[cfg(feature = "tpm")]
    #[error(
        "the key persistent at {handle:#010x} (AK {ak_name}) is not the HCL report's HCLAkPub: its quotes would be refused"
    )]
    AkNotHcl { handle: u32, ak_name: String },
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

/// The evidence issuer of a node of `platform`, over its TPM (feature `tpm`):
///
/// - `qemu`: hawser's fixed ECC AK, certified by the provider CA in NV 0x01C10002;
/// - `gce`: the RSA AK created from Google's template (NV 0x01C10001), certified by Google in
///   NV 0x01C10000 (the intermediate is the verifier's: Google's NV holds the leaf only).
///
/// Azure's profiles are refused naming [`issuer_for_azure`] (their evidence needs the metadata
/// service), bare SEV-SNP and TDX naming [`TsmIssuer`].
#[cfg(feature = "tpm")]
pub fn issuer_for(
    platform: Platform,
    tpm: std::sync::Arc<hawser_attestation::tpm::Tpm>,
) -> Result<hawser_attestation::TpmIssuer, NodeError> {
    use hawser_attestation::TpmIssuer;
    match platform {
        Platform::Qemu => TpmIssuer::new(tpm).map_err(|source| NodeError::Issuer {
            platform,
            source: Box::new(source),
        }),
        Platform::Gce => {
            let nv = gather_nv(&tpm, platform)?;
            let template = nv
                .get(&crate::gce::AK_TEMPLATE_NV_INDEX_RSA)
                .cloned()
                .unwrap_or_default();
            let certificate = nv
                .get(&crate::gce::AK_CERT_NV_INDEX_RSA)
                .cloned()
                .unwrap_or_default();
            let ak = tpm
                .create_attestation_key_from_template(&template)
                .map_err(|source| NodeError::Issuer {
                    platform,
                    source: Box::new(source),
                })?;
            tracing::info!(
                ak_name = %hex::encode(ak.name()),
                "attestation key from GCE's template, certified by the platform in NV 0x01c10000"
            );
            Ok(TpmIssuer::with_ak(
                tpm,
                ak,
                vec![certificate],
                Variant::GceVtpm,
            ))
        }
        Platform::AzureSnp | Platform::AzureTdx => Err(NodeError::NeedsMetadata(platform)),
        Platform::SevSnp | Platform::Tdx => Err(NodeError::NoIssuer(platform)),
    }
}

/// What an Azure node asks Azure's metadata service (IMDS, `169.254.169.254`, reachable from
/// the VM only) for, to send beside its HCL report. The HTTP client is the caller's; its
/// answer becomes the evidence's `platform_aux`, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AzureAuxRequest {
    /// `azure-snp`: the chip's VCEK and AMD's chain above it. `GET
    /// http://169.254.169.254/metadata/THIM/amd/certification` with the header `Metadata: true`
    /// answers JSON `{"vcekCert": PEM, "certificateChain": PEM (ASK then ARK), "tcbm": …}`;
    /// the answer to give back is the PEM text `vcekCert` then `certificateChain`
    /// ([`thim_vcek_chain`] makes it from the JSON). The VCEK is for the host's current TCB:
    /// a host whose TCB moved since the guest booted gives a VCEK the boot-time report does not
    /// match, and the verifier refuses naming the TCB component.
    VcekChain,
    /// `azure-tdx`: the TD quote of this TDREPORT (the first 1024 bytes of the HCL report's
    /// hardware report). `POST http://169.254.169.254/acc/tdquote` with the JSON body
    /// `{"report": base64url(td_report)}` answers `{"quote": base64url}`; the answer to give
    /// back is the quote, decoded.
    TdQuote { td_report: Vec<u8> },
}

impl AzureAuxRequest {
    /// What is asked for, for messages.
    pub fn what(&self) -> &'static str {
        match self {
            AzureAuxRequest::VcekChain => "the VCEK chain (/metadata/THIM/amd/certification)",
            AzureAuxRequest::TdQuote { .. } => "the TD quote of the HCL report (/acc/tdquote)",
        }
    }
}

/// The HCL report of an Azure node's NV contents, parsed, of the kind `platform` needs.
fn hcl_of(platform: Platform, hcl_report: &[u8]) -> Result<HclReport, NodeError> {
    let expected = match platform {
        Platform::AzureSnp => HardwareReport::SevSnp,
        Platform::AzureTdx => HardwareReport::Tdx,
        other => return Err(NodeError::NotAzure(other)),
    };
    let bad = |source: AzureError| NodeError::Hcl {
        platform,
        source: Box::new(source),
    };
    let hcl = HclReport::parse(hcl_report).map_err(bad)?;
    if hcl.kind != expected {
        return Err(bad(AzureError::Kind {
            expected,
            found: hcl.kind,
        }));
    }
    Ok(hcl)
}

/// What an Azure node of `platform` asks the metadata service for, given its HCL report.
pub fn azure_aux_request(
    platform: Platform,
    hcl_report: &[u8],
) -> Result<AzureAuxRequest, NodeError> {
    let hcl = hcl_of(platform, hcl_report)?;
    Ok(match hcl.kind {
        HardwareReport::SevSnp => AzureAuxRequest::VcekChain,
        HardwareReport::Tdx => AzureAuxRequest::TdQuote {
            td_report: hcl.hardware_report[..TDREPORT_LEN].to_vec(),
        },
    })
}

/// The PEM text an `azure-snp` node sends as `platform_aux`, from THIM's JSON answer (see
/// [`AzureAuxRequest::VcekChain`]): `vcekCert` then `certificateChain`.
pub fn thim_vcek_chain(json: &[u8]) -> Result<Vec<u8>, NodeError> {
    let bad = |detail: &str| NodeError::Metadata {
        what: "the VCEK chain (/metadata/THIM/amd/certification)",
        source: detail.to_owned().into(),
    };
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let field = |name: &str| {
        value[name]
            .as_str()
            .filter(|pem| pem.contains("-----BEGIN CERTIFICATE-----"))
            .ok_or_else(|| bad(&format!("no PEM certificate in \"{name}\"")))
    };
    let mut pem = field("vcekCert")?.trim_end().to_owned();
    pem.push('\n');
    pem.push_str(field("certificateChain")?.trim_end());
    pem.push('\n');
    Ok(pem.into_bytes())
}

/// What an Azure node's evidence carries besides the TPM's quote, PCRs and AK public area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureParts {
    pub variant: Variant,
    /// The HCL report, as read from NV 0x01400001.
    pub platform_report: Vec<u8>,
    /// The metadata service's answer ([`AzureAuxRequest`]).
    pub platform_aux: Vec<u8>,
    /// The AK certificate from NV 0x01C101D0, where the platform stored one (the leaf only:
    /// its intermediates are the verifier's); empty otherwise.
    pub ak_cert_chain: Vec<Vec<u8>>,
}

/// Assembles the platform part of an Azure node's evidence from its NV contents (as
/// [`gather_nv`] reads them: the HCL report required, the AK certificate optional) and the
/// metadata service's answer `aux`. No TPM access: [`issuer_for_azure`] reads, this assembles.
///
/// Refused: an HCL report that does not parse or holds another CPU's report than `platform`'s;
/// an empty `aux` on `azure-tdx` (the TD quote is the only signature over a TDREPORT). An empty
/// `aux` on `azure-snp` passes (a verifier may hold the chip's VCEK itself). An AK certificate
/// index that holds no DER certificate is left out with a warning: it is optional, and a
/// verifier that requires it refuses naming it.
pub fn azure_evidence_parts(
    platform: Platform,
    nv: &BTreeMap<u32, Vec<u8>>,
    aux: Vec<u8>,
) -> Result<AzureParts, NodeError> {
    let hcl_index = platform
        .nv_layout()
        .iter()
        .find(|nv| nv.index == crate::azure::HCL_REPORT_NV_INDEX)
        .ok_or(NodeError::NotAzure(platform))?;
    let report = nv.get(&hcl_index.index).ok_or(NodeError::Missing {
        index: hcl_index.index,
        what: hcl_index.what,
        platform,
    })?;
    let hcl = hcl_of(platform, report)?;
    let variant = match hcl.kind {
        HardwareReport::SevSnp => Variant::AzureSevSnp,
        HardwareReport::Tdx => Variant::AzureTdx,
    };
    if aux.is_empty() && hcl.kind == HardwareReport::Tdx {
        return Err(NodeError::NoAux {
            platform,
            what: "TD quote",
        });
    }
    let ak_cert_chain = match nv.get(&crate::azure::AK_CERT_NV_INDEX) {
        None => Vec::new(),
        Some(data) => match split_certificate_chain(data) {
            // Azure's index holds the leaf; anything after it is not sent.
            Ok(mut certificates) => {
                certificates.truncate(1);
                certificates
            }
            Err(err) => {
                tracing::warn!(%err, "NV 0x01c101d0 holds no AK certificate; sending none");
                Vec::new()
            }
        },
    };
    Ok(AzureParts {
        variant,
        platform_report: report.clone(),
        platform_aux: aux,
        ak_cert_chain,
    })
}

/// The evidence issuer of an Azure confidential VM (`azure-snp`, `azure-tdx`), over its vTPM
/// (feature `tpm`): [`gather_nv`] (the HCL report, the AK certificate if there is one), then
/// `fetch_aux` asked once for what [`AzureAuxRequest`] names (the caller's metadata client; its
/// error fails the issuer), [`azure_evidence_parts`], and the AK persistent at
/// [`AZURE_AK_HANDLE`], which must be the HCL report's `HCLAkPub`. Every evidence then carries
/// the HCL report in `platform_report` and the metadata answer in `platform_aux`, and its quote
/// binds the connection in `extraData`.
///
/// The HCL report is the one the paravisor wrote at boot: it vouches for the AK, which does
/// not change while the VM runs, and the quote's `extraData` binds each connection, so the node
/// does not ask for a fresh one (by writing user data to NV 0x01400002): that would add an NV
/// write and a report per handshake, and concurrent handshakes would race on the index.
#[cfg(feature = "tpm")]
pub fn issuer_for_azure(
    platform: Platform,
    tpm: std::sync::Arc<hawser_attestation::tpm::Tpm>,
    fetch_aux: impl FnOnce(
        &AzureAuxRequest,
    ) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>>,
) -> Result<hawser_attestation::TpmIssuer, NodeError> {
    use hawser_attestation::TpmIssuer;
    let nv = gather_nv(&tpm, platform)?;
    let report = nv
        .get(&crate::azure::HCL_REPORT_NV_INDEX)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let request = azure_aux_request(platform, report)?;
    let aux = fetch_aux(&request).map_err(|source| NodeError::Metadata {
        what: request.what(),
        source,
    })?;
    let parts = azure_evidence_parts(platform, &nv, aux)?;
    let ak = tpm
        .load_persistent_attestation_key(AZURE_AK_HANDLE)
        .map_err(|source| NodeError::Issuer {
            platform,
            source: Box::new(source),
        })?;
    let (hcl_modulus, _) = hcl_of(platform, &parts.platform_report)?
        .ak_public()
        .map_err(|source| NodeError::Hcl {
            platform,
            source: Box::new(source),
        })?;
    let ak_modulus = ak
        .public_tpm2b()
        .get(2..)
        .and_then(|tpmt| crate::tpm_rsa::RsaPublic::parse_tpmt(tpmt).ok())
        .map(|public| public.modulus);
    if ak_modulus.as_deref().map(trim_zeros) != Some(trim_zeros(&hcl_modulus)) {
        return Err(NodeError::AkNotHcl {
            handle: AZURE_AK_HANDLE,
            ak_name: hex::encode(ak.name()),
        });
    }
    tracing::info!(
        ak_name = %hex::encode(ak.name()),
        %platform,
        ak_certificate = !parts.ak_cert_chain.is_empty(),
        "Azure's attestation key, vouched for by the HCL report in NV 0x01400001"
    );
    Ok(
        TpmIssuer::with_ak(tpm, ak, parts.ak_cert_chain, parts.variant)
            .with_platform_report(parts.platform_report, parts.platform_aux),
    )
}

#[cfg(feature = "tpm")]
fn trim_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// The evidence issuer of a bare SEV-SNP or TDX guest: each evidence is a fresh report from
/// configfs-tsm ([`tsm_report`], report directory [`TsmIssuer::REPORT_NAME`]) whose
/// REPORT_DATA is the binding's qualifying data followed by 32 zero bytes
/// ([`crate::verifier_cloud::bare_report_data`]); the evidence carries the report (SNP's
/// attestation report, or the TD quote) in `platform_report`, SNP's certificate table
/// (`auxblob`, where the host supplies it) in `platform_aux`, and no TPM fields.
///
/// This is the gathering code of the bare profiles' evidence; PID 1 does not boot bare SNP or
/// TDX nodes today, because it needs a TPM for the state disk's key and its boot PCRs.
/// Requests through one issuer are serialised: concurrent ones would race on the report
/// directory (and [`tsm_report`] would refuse them).
#[derive(Debug)]
pub struct TsmIssuer {
    tsm_root: PathBuf,
    platform: Platform,
    lock: Mutex<()>,
}

impl TsmIssuer {
    /// The configfs-tsm report directory the issuer uses.
    pub const REPORT_NAME: &'static str = "hawser";

    /// An issuer for `platform` (`sev-snp` or `tdx`) over configfs-tsm at `tsm_root`
    /// (`/sys/kernel/config/tsm` on a guest).
    pub fn new(tsm_root: impl Into<PathBuf>, platform: Platform) -> Result<Self, NodeError> {
        let HardwareSource::ConfigfsTsm { .. } = platform.hardware_source() else {
            return Err(NodeError::NotTsm { platform });
        };
        Ok(Self {
            tsm_root: tsm_root.into(),
            platform,
            lock: Mutex::new(()),
        })
    }

    /// The profile of the evidence.
    pub fn platform(&self) -> Platform {
        self.platform
    }
}

impl EvidenceIssuer for TsmIssuer {
    fn issue(&self, binding: &Binding<'_>, user_data: &[u8]) -> Result<Evidence, IssueError> {
        let report_data =
            crate::verifier_cloud::bare_report_data(&binding.qualifying_data(user_data));
        let report = {
            let _serialised = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            tsm_report(
                &self.tsm_root,
                self.platform,
                Self::REPORT_NAME,
                &report_data,
            )
        }
        .map_err(|err| {
            IssueError::new(
                format!(
                    "asking configfs-tsm for a {} report for a {} binding",
                    self.platform, binding.role
                ),
                err,
            )
        })?;
        let variant = match self.platform {
            Platform::SevSnp => Variant::SevSnp,
            _ => Variant::Tdx,
        };
        Ok(Evidence {
            version: EVIDENCE_VERSION,
            variant: variant as i32,
            platform_report: report.outblob,
            platform_aux: report.auxblob,
            user_data: user_data.to_vec(),
            nonce: binding.nonce.to_vec(),
            tls_key_hash: binding.tls_key_hash().to_vec(),
            ..Evidence::default()
        })
    }
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
/// `report_data`, in a report directory named `name` (made, and removed afterwards). A report
/// directory that exists already (another process's, or one a crashed run left) is used as it
/// is and left in place: the generation check refuses a report another writer changed.
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
    let made = match std::fs::create_dir(&dir) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(io("making the report directory", &dir)(e)),
    };
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
    if made && let Err(err) = std::fs::remove_dir(&dir) {
        tracing::warn!(path = %dir.display(), %err, "removing the configfs-tsm report directory failed");
    }
    result
}
