//! The evidence issuer of a hawser node: a TPM quote bound to one connection, the PCR values
//! it covers and the AK certificate the provider stored in NV.
//!
//! A [`TpmIssuer`] creates the AK once (the fixed template of [`crate::tpm`]) and keeps it
//! loaded, and reads the AK certificate chain from NV index [`AK_CERT_NV_INDEX`] once, so an
//! attested handshake costs one TPM2_Quote. The PCR values are cached as well: after each quote
//! the issuer recomputes the quoted digest from the cache, and only if the PCRs moved since
//! (a phase was extended) it reads them again, so a quote and its values always agree.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::evidence::{
    Binding, ChainError, EVIDENCE_VERSION, Evidence, EvidenceIssuer, IssueError, Variant,
    split_certificate_chain,
};
use crate::tpm::{AttestationKey, Tpm, TpmError};
use crate::tpm_types::{AK_CERT_NV_INDEX, Attest};
use crate::validator::certified_p256_point_of;

/// The sha256 PCRs a [`TpmIssuer`] quotes by default: all of them.
pub const DEFAULT_QUOTED_PCRS: std::ops::RangeInclusive<u8> = 0..=23;

/// How often the issuer re-reads PCRs that keep changing under a quote before it gives up.
const QUOTE_ATTEMPTS: usize = 3;

/// A [`TpmIssuer`] that cannot be set up.
#[derive(Debug, Error)]
pub enum IssuerError {
    /// A TPM command failed.
    #[error(transparent)]
    Tpm(#[from] TpmError),
    /// The AK certificate NV index does not hold certificates.
    #[error("the AK certificate in NV index {index:#010x} is unusable")]
    Chain {
        index: u32,
        #[source]
        source: ChainError,
    },
    /// The provider certified another key than the AK this TPM derives.
    #[error(
        "the AK certificate in NV index {index:#010x} certifies another key than this TPM's AK {ak_name} (was the TPM provisioned with another AK template?)"
    )]
    CertificateForAnotherKey { index: u32, ak_name: String },
}

/// Issues evidence from a TPM (see the module docs). `Send + Sync`: aTLS calls it from
/// blocking threads, one quote at a time through the TPM connection's lock.
pub struct TpmIssuer {
    tpm: Arc<Tpm>,
    ak: AttestationKey,
    ak_cert_chain: Vec<Vec<u8>>,
    /// The platform profile the evidence is of (QEMU's provider CA unless a platform's).
    variant: Variant,
    /// The platform's own report and what it needs (Azure's HCL report; empty elsewhere).
    platform_report: Vec<u8>,
    platform_aux: Vec<u8>,
    quoted_pcrs: Vec<u8>,
    pcr_cache: Mutex<Option<BTreeMap<u8, [u8; 32]>>>,
}

impl std::fmt::Debug for TpmIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmIssuer")
            .field("tpm", &self.tpm)
            .field("ak", &self.ak)
            .field("ak_cert_chain_len", &self.ak_cert_chain.len())
            .field("variant", &self.variant)
            .field("quoted_pcrs", &self.quoted_pcrs)
            .finish()
    }
}

impl TpmIssuer {
    /// Creates the AK and reads its certificate chain from [`AK_CERT_NV_INDEX`], checking that
    /// the certificate is for this AK.
    pub fn new(tpm: Arc<Tpm>) -> Result<Self, IssuerError> {
        Self::from_nv_index(tpm, AK_CERT_NV_INDEX)
    }

    /// As [`TpmIssuer::new`] with the certificate in NV index `index`.
    pub fn from_nv_index(tpm: Arc<Tpm>, index: u32) -> Result<Self, IssuerError> {
        let data = tpm.read_nv(index)?;
        let chain = split_certificate_chain(&data)
            .map_err(|source| IssuerError::Chain { index, source })?;
        let issuer = Self::with_ak_cert_chain(tpm, chain)?;
        let ak_point = crate::tpm_types::EccPublic::parse(issuer.ak.public_tpm2b())
            .ok()
            .and_then(|ak| ak.p256_sec1_point());
        let certified = issuer
            .ak_cert_chain
            .first()
            .and_then(|leaf| certified_p256_point_of(leaf));
        if ak_point.is_none() || certified != ak_point {
            return Err(IssuerError::CertificateForAnotherKey {
                index,
                ak_name: hex::encode(issuer.ak.name()),
            });
        }
        tracing::info!(
            ak_name = %hex::encode(issuer.ak.name()),
            nv_index = format_args!("{index:#010x}"),
            certificates = issuer.ak_cert_chain.len(),
            "attestation key and its provider certificate ready"
        );
        Ok(issuer)
    }

    /// Creates the AK and uses `ak_cert_chain` (DER, AK certificate first) as its certificate
    /// chain, for platforms that deliver it elsewhere than in NV. Not checked here: a verifier
    /// refuses a chain that does not certify the AK.
    pub fn with_ak_cert_chain(
        tpm: Arc<Tpm>,
        ak_cert_chain: Vec<Vec<u8>>,
    ) -> Result<Self, IssuerError> {
        let ak = tpm.create_attestation_key()?;
        Ok(Self::with_ak(tpm, ak, ak_cert_chain, Variant::QemuVtpm))
    }

    /// An issuer quoting with `ak`, a key the platform of `variant` made or described (GCE's
    /// AK from its NV template: [`Tpm::create_attestation_key_from_template`]) and certified in
    /// `ak_cert_chain`. Not checked here: the platform's verifier refuses a chain that does not
    /// certify the AK.
    pub fn with_ak(
        tpm: Arc<Tpm>,
        ak: AttestationKey,
        ak_cert_chain: Vec<Vec<u8>>,
        variant: Variant,
    ) -> Self {
        tracing::debug!(
            ak_name = %hex::encode(ak.name()),
            platform = crate::platform::profile_name(variant),
            certificates = ak_cert_chain.len(),
            "attestation key ready"
        );
        Self {
            tpm,
            ak,
            ak_cert_chain,
            variant,
            platform_report: Vec::new(),
            platform_aux: Vec::new(),
            quoted_pcrs: DEFAULT_QUOTED_PCRS.collect(),
            pcr_cache: Mutex::new(None),
        }
    }

    /// Sends the platform's own report (and what it needs beside it) with every evidence: the
    /// HCL report of an Azure confidential VM, say.
    pub fn with_platform_report(mut self, report: Vec<u8>, aux: Vec<u8>) -> Self {
        self.platform_report = report;
        self.platform_aux = aux;
        self
    }

    /// The platform profile of the evidence.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Quotes only `pcrs` (sha256 bank) instead of all 24.
    pub fn quoting(mut self, pcrs: impl IntoIterator<Item = u8>) -> Self {
        let mut pcrs: Vec<u8> = pcrs.into_iter().collect();
        pcrs.sort_unstable();
        pcrs.dedup();
        self.quoted_pcrs = pcrs;
        self
    }

    /// The AK's TPM name.
    pub fn ak_name(&self) -> &[u8] {
        self.ak.name()
    }

    /// The AK's marshalled `TPM2B_PUBLIC`.
    pub fn ak_public(&self) -> &[u8] {
        self.ak.public_tpm2b()
    }

    /// The AK certificate chain put into the evidence.
    pub fn ak_cert_chain(&self) -> &[Vec<u8>] {
        &self.ak_cert_chain
    }

    /// The TPM connection.
    pub fn tpm(&self) -> &Arc<Tpm> {
        &self.tpm
    }

    /// Evidence whose quote's qualifying data is `binding.qualifying_data(user_data)`.
    pub fn issue_evidence(
        &self,
        binding: &Binding<'_>,
        user_data: &[u8],
    ) -> Result<Evidence, TpmError> {
        let qualifying_data = binding.qualifying_data(user_data);
        let mut cache = self
            .pcr_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut quote = self
            .tpm
            .quote_marshalled(&self.ak, &qualifying_data, &self.quoted_pcrs)?;
        for attempt in 1..=QUOTE_ATTEMPTS {
            let quoted_digest = Attest::parse(&quote.attest)
                .map(|attest| attest.pcr_digest)
                .map_err(|source| TpmError::Attest {
                    call: "TPM2_Quote",
                    tcti: self.tpm.tcti().to_string(),
                    source,
                })?;
            if let Some(values) = cache.as_ref()
                && digest_of(values) == quoted_digest.as_slice()
            {
                break;
            }
            // The cache is empty or the PCRs moved: read them and compare with this quote.
            let values = self
                .tpm
                .read_pcrs_sha256(self.quoted_pcrs.iter().copied())?;
            let matches = digest_of(&values) == quoted_digest.as_slice();
            *cache = Some(values);
            if matches {
                break;
            }
            if attempt == QUOTE_ATTEMPTS {
                return Err(TpmError::Unexpected {
                    call: "TPM2_Quote",
                    tcti: self.tpm.tcti().to_string(),
                    detail: format!(
                        "the PCRs changed under {QUOTE_ATTEMPTS} quotes in a row; cannot produce consistent evidence"
                    ),
                });
            }
            tracing::debug!(
                attempt,
                "PCRs changed between read and quote; quoting again"
            );
            quote = self
                .tpm
                .quote_marshalled(&self.ak, &qualifying_data, &self.quoted_pcrs)?;
        }
        let pcrs = cache
            .as_ref()
            .map(|values| {
                values
                    .iter()
                    .map(|(pcr, value)| (u32::from(*pcr), value.to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Evidence {
            version: EVIDENCE_VERSION,
            variant: self.variant as i32,
            ak_public: self.ak.public_tpm2b().to_vec(),
            quote: quote.attest,
            signature: quote.signature,
            pcrs_sha256: pcrs,
            ak_cert_chain: self.ak_cert_chain.clone(),
            user_data: user_data.to_vec(),
            nonce: binding.nonce.to_vec(),
            tls_key_hash: binding.tls_key_hash().to_vec(),
            platform_report: self.platform_report.clone(),
            platform_aux: self.platform_aux.clone(),
        })
    }
}

impl EvidenceIssuer for TpmIssuer {
    fn issue(&self, binding: &Binding<'_>, user_data: &[u8]) -> Result<Evidence, IssueError> {
        self.issue_evidence(binding, user_data).map_err(|err| {
            IssueError::new(
                format!("quoting with the TPM for a {} binding", binding.role),
                err,
            )
        })
    }
}

/// SHA-256 over PCR values in ascending index order: a sha256-bank quote's pcrDigest.
fn digest_of(values: &BTreeMap<u8, [u8; 32]>) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for value in values.values() {
        hasher.update(value);
    }
    hasher.finalize().into()
}
