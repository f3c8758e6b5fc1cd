//! The captured vectors (`tests/vectors/`, origin and licence in its README) and their loaders,
//! shared by the tests of this crate.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test uses a part

use std::collections::BTreeMap;
use std::path::PathBuf;

use hawser_platforms::VerificationTime;
use hawser_platforms::gce::{self, GceError, GceEvidence, VtpmQuote};

pub fn vector(path: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(path);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn pem_ders(text: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .map(|pem| pem.unwrap().contents)
        .collect()
}

/// go-tpm-tools' `attest.Attestation` (proto/attest.proto), the fields its GCE vectors carry.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GoTpmAttestation {
    #[prost(bytes = "vec", tag = "1")]
    pub ak_pub: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub quotes: Vec<GoTpmQuote>,
    #[prost(bytes = "vec", tag = "3")]
    pub event_log: Vec<u8>,
    #[prost(bytes = "vec", tag = "6")]
    pub ak_cert: Vec<u8>,
}

/// `tpm.Quote`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GoTpmQuote {
    #[prost(bytes = "vec", tag = "1")]
    pub quote: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub raw_sig: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    pub pcrs: Option<GoTpmPcrs>,
}

/// `tpm.PCRs`: the bank (a TPM_ALG_ID) and its values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GoTpmPcrs {
    #[prost(int32, tag = "1")]
    pub hash: i32,
    #[prost(btree_map = "uint32, bytes", tag = "2")]
    pub pcrs: BTreeMap<u32, Vec<u8>>,
}

/// 2024-01-01T00:00:00Z: Google's AK certificate is valid 2021-08-31 to 2051-08-24.
pub const GCE_AT: VerificationTime = VerificationTime(1_704_067_200);
/// The vector's nonce (its name: `nonce9009`).
pub const GCE_NONCE: [u8; 2] = [0x90, 0x09];

pub struct GceVector {
    pub attestation: GoTpmAttestation,
    /// The SHA-256 bank's quote and values.
    pub quote: GoTpmQuote,
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    pub intermediate: Vec<u8>,
    pub root: Vec<u8>,
}

impl GceVector {
    pub fn load() -> Self {
        use prost::Message as _;
        let attestation =
            GoTpmAttestation::decode(vector("gce/gce-cos-85-nonce9009.pb").as_slice()).unwrap();
        assert!(
            !attestation.event_log.is_empty(),
            "the vector has an event log"
        );
        let quote = attestation
            .quotes
            .iter()
            .find(|q| q.pcrs.as_ref().is_some_and(|p| p.hash == 0x000b))
            .expect("a SHA-256 quote")
            .clone();
        let pcrs = quote
            .pcrs
            .as_ref()
            .unwrap()
            .pcrs
            .iter()
            .map(|(k, v)| (u8::try_from(*k).unwrap(), v.clone()))
            .collect();
        Self {
            attestation,
            quote,
            pcrs,
            intermediate: vector("gce/tpm_ek_intermediate_2.crt"),
            root: vector("gce/tpm_ek_root_1.cer"),
        }
    }

    pub fn verify(
        &self,
        pcrs: &BTreeMap<u8, Vec<u8>>,
        nonce: &[u8],
        at: VerificationTime,
    ) -> Result<gce::VerifiedGce, GceError> {
        let intermediates = [self.intermediate.as_slice()];
        gce::verify(
            &GceEvidence {
                ak_public: &self.attestation.ak_pub,
                ak_certificate: &self.attestation.ak_cert,
                intermediates: &intermediates,
                quote: VtpmQuote {
                    attest: &self.quote.quote,
                    signature: &self.quote.raw_sig,
                    pcrs,
                },
            },
            &[&self.root],
            nonce,
            at,
        )
    }
}

pub fn yaml(path: &str) -> serde_norway::Value {
    serde_norway::from_slice(&vector(path)).unwrap()
}

pub fn yaml_bytes(value: &serde_norway::Value) -> Vec<u8> {
    value
        .as_sequence()
        .unwrap()
        .iter()
        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
        .collect()
}
