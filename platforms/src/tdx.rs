//! Intel TDX quotes, verified offline with Intel's DCAP collateral, then judged by a policy.
//!
//! The quote (version 4 or 5) is verified by `dcap-qvl` (Phala Network's pure-Rust DCAP quote
//! verification, on ring): the PCK certificate chain in the quote to Intel's SGX Root CA (built
//! into dcap-qvl; its SHA-256 is [`INTEL_SGX_ROOT_CA`], which the tests check the collateral's
//! chains end in), the root CA's and the
//! PCK CRLs, the quoting enclave's report and identity, the quote's signature, and the
//! platform's TCB level in Intel's signed TCB info: every item of the collateral valid at the
//! verification time. What the quote says about the TD is then hawser's to judge
//! ([`TdxPolicy`]): the TCB status (only `UpToDate` unless the policy accepts more), the debug
//! attribute, MRTD (the TD's initial memory: the firmware), the RTMRs (what the firmware and
//! the kernel measured at runtime), MRCONFIGID/MROWNER, and `REPORTDATA`, the verifier's binding.
//!
//! The collateral comes from Intel's PCS or a caching service (PCCS); this crate never fetches
//! it. It is valid for about a month: a verifier refreshes it, and a test pins its time.

use dcap_qvl::QuoteCollateralV3;
use dcap_qvl::quote::{Report, TDReport10};
use dcap_qvl::verify::QuoteVerifier;

use crate::chain::VerificationTime;

/// The SHA-256 of Intel's SGX Root CA certificate (DER), the root of every PCK, TCB-signing and
/// CRL chain.
pub const INTEL_SGX_ROOT_CA: &str =
    "44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3";

/// `TDATTRIBUTES.DEBUG`: the VMM can read and write the TD's memory and state.
const TD_ATTRIBUTES_DEBUG: u8 = 0x01;

/// What a TD's quote must show beyond a valid signature from a genuine, current platform.
#[derive(Debug, Clone)]
pub struct TdxPolicy {
    /// Accept a debug TD (never for production).
    pub allow_debug: bool,
    /// The TCB statuses accepted (Intel's names: `UpToDate`, `SWHardeningNeeded`,
    /// `ConfigurationNeeded`, `ConfigurationAndSWHardeningNeeded`, `OutOfDate`, …).
    pub accepted_statuses: Vec<String>,
    /// MRTD: the measurement of the TD's initial memory (its firmware).
    pub mr_td: Option<[u8; 48]>,
    /// RTMR 0 to 3, each where given.
    pub rtmrs: [Option<[u8; 48]>; 4],
    pub mr_config_id: Option<[u8; 48]>,
    pub mr_owner: Option<[u8; 48]>,
    /// `REPORTDATA`: the binding the verifier expects (a nonce, a key's hash).
    pub report_data: Option<[u8; 64]>,
}

impl Default for TdxPolicy {
    fn default() -> Self {
        Self {
            allow_debug: false,
            accepted_statuses: vec!["UpToDate".into()],
            mr_td: None,
            rtmrs: [None; 4],
            mr_config_id: None,
            mr_owner: None,
            report_data: None,
        }
    }
}

/// A quote that passed every check.
#[derive(Debug, Clone)]
pub struct VerifiedTdx {
    /// The TD's report body (TDX 1.0 fields; a 1.5 quote's base).
    pub report: TDReport10,
    /// Intel's TCB status for the platform and the quoting enclave.
    pub status: String,
    /// Intel security advisories that apply at that TCB level.
    pub advisory_ids: Vec<String>,
}

/// Why a TDX quote is refused.
#[derive(Debug, thiserror::Error)]
pub enum TdxError {
    #[error("the verification time {0} is before 1970")]
    Time(i64),
    #[error("the quote does not verify against Intel's collateral at {at}: {reason}")]
    Dcap { at: String, reason: String },
    #[error("the quote is an SGX enclave's, not a TD's")]
    NotTd,
    #[error(
        "the platform's TCB status is {status} (advisories: {advisories}); the policy accepts {accepted}"
    )]
    Status {
        status: String,
        advisories: String,
        accepted: String,
    },
    #[error("the TD is a debug TD (TDATTRIBUTES {0}): the VMM can read its memory")]
    Debug(String),
    #[error("the quote's {field} is {quote}, the policy expects {expected}")]
    Field {
        field: &'static str,
        expected: String,
        quote: String,
    },
}

/// Verifies `quote` with `collateral` at `at`, then judges it by `policy`.
pub fn verify(
    quote: &[u8],
    collateral: &QuoteCollateralV3,
    policy: &TdxPolicy,
    at: VerificationTime,
) -> Result<VerifiedTdx, TdxError> {
    let now = u64::try_from(at.0).map_err(|_| TdxError::Time(at.0))?;
    // dcap-qvl's own debug check is off: the policy below names the attribute.
    let verified = QuoteVerifier::new_prod()
        .allow_debug(true)
        .with_config::<dcap_qvl::configs::RingConfig>()
        .verify(quote, collateral, now)
        .map_err(|e| TdxError::Dcap {
            at: at.rfc3339(),
            reason: format!("{e:#}"),
        })?;
    let report = match verified.report {
        Report::TD10(report) => report,
        Report::TD15(report) => report.base,
        Report::TD15Ex(report) => report.base.base,
        Report::SgxEnclave(_) => return Err(TdxError::NotTd),
    };
    if !policy.accepted_statuses.contains(&verified.status) {
        return Err(TdxError::Status {
            status: verified.status,
            advisories: if verified.advisory_ids.is_empty() {
                "none".into()
            } else {
                verified.advisory_ids.join(", ")
            },
            accepted: policy.accepted_statuses.join(", "),
        });
    }
    if report.td_attributes[0] & TD_ATTRIBUTES_DEBUG != 0 && !policy.allow_debug {
        return Err(TdxError::Debug(hex::encode(report.td_attributes)));
    }
    let field = |field: &'static str, expected: Option<&[u8]>, actual: &[u8]| match expected {
        Some(expected) if expected != actual => Err(TdxError::Field {
            field,
            expected: hex::encode(expected),
            quote: hex::encode(actual),
        }),
        _ => Ok(()),
    };
    field(
        "MRTD",
        policy.mr_td.as_ref().map(|m| m.as_slice()),
        &report.mr_td,
    )?;
    let rtmrs = [
        &report.rt_mr0,
        &report.rt_mr1,
        &report.rt_mr2,
        &report.rt_mr3,
    ];
    for ((name, expected), actual) in ["RTMR0", "RTMR1", "RTMR2", "RTMR3"]
        .into_iter()
        .zip(&policy.rtmrs)
        .zip(rtmrs)
    {
        field(name, expected.as_ref().map(|m| m.as_slice()), actual)?;
    }
    field(
        "MRCONFIGID",
        policy.mr_config_id.as_ref().map(|m| m.as_slice()),
        &report.mr_config_id,
    )?;
    field(
        "MROWNER",
        policy.mr_owner.as_ref().map(|m| m.as_slice()),
        &report.mr_owner,
    )?;
    field(
        "REPORTDATA",
        policy.report_data.as_ref().map(|m| m.as_slice()),
        &report.report_data,
    )?;
    Ok(VerifiedTdx {
        report,
        status: verified.status,
        advisory_ids: verified.advisory_ids,
    })
}
