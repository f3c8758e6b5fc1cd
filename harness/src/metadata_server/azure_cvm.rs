//! The Azure flavor's confidential-VM endpoints: THIM's AMD certification (an SEV-SNP VM's
//! VCEK chain) and the TD quote service (a TDX VM's quote of its TDREPORT), as PID 1's client
//! reads them (`hawser_init::platform::metadata::{azure_vcek_chain, azure_td_quote}`).
//!
//! - `GET /metadata/THIM/amd/certification` answers JSON `{"vcekCert": PEM, "tcbm": …,
//!   "certificateChain": PEM, "cacheControl": …}` (the keys Azure's answer has; Microsoft
//!   documents the endpoint, the `Metadata: true` header and `vcekCert`/`tcbm`/
//!   `certificateChain` in "Trusted Hardware Identity Management"), or 404 when
//!   [`AzureCvm::thim`] is `None` (a VM that is not SEV-SNP).
//! - `POST /acc/tdquote` with the JSON body `{"report": base64url(TDREPORT)}` (padding
//!   optional, as the service takes either) answers `{"quote": base64url without padding}` of
//!   [`AzureCvm::td_quote`]; 400 when the body is not that JSON or the report is not 1024 bytes;
//!   404 when there is no quote to give (a VM that is not TDX); 405 for another method.
//!
//! Like the user data, both need `Metadata: true` (else 400, Azure's answer to an IMDS request
//! without it). Azure's own TD quote clients do not send that header on `/acc/tdquote`, so the
//! real service appears not to require it; the emulator does, which PID 1's client (sending it
//! on every request) meets.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use super::{Answer, Request, text};

/// The THIM endpoint.
pub const THIM_PATH: &str = "/metadata/THIM/amd/certification";
/// The TD quote endpoint.
pub const TD_QUOTE_PATH: &str = "/acc/tdquote";
/// A TDREPORT's size: what the quote service takes.
pub const TD_REPORT_LEN: usize = 1024;

/// THIM's answer for the chip a VM runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThimCertification {
    /// The chip's VCEK, PEM.
    pub vcek_cert: String,
    /// AMD's ASK then ARK, PEM.
    pub certificate_chain: String,
    /// The TCB the VCEK is for (hex, as THIM gives it).
    pub tcbm: String,
}

/// What an Azure confidential VM's host serves besides user data. The default serves neither
/// endpoint (404), as for a VM that is not confidential.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AzureCvm {
    /// THIM's answer (an SEV-SNP VM), or `None`.
    pub thim: Option<ThimCertification>,
    /// The quote the TD quote service answers any well-formed TDREPORT with (a TDX VM), or
    /// `None`.
    pub td_quote: Option<Vec<u8>>,
}

/// base64url with or without padding: what the quote service is sent by the clients that use it.
const BASE64URL_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The answer of a confidential-VM endpoint, or `None` for another path. The caller has checked
/// `Metadata: true`.
pub(super) fn answer(request: &Request, cvm: &AzureCvm) -> Option<Answer> {
    let path = request.target.split('?').next().unwrap_or_default();
    match path {
        THIM_PATH => Some(thim(request, cvm.thim.as_ref())),
        TD_QUOTE_PATH => Some(td_quote(request, cvm.td_quote.as_deref())),
        _ => None,
    }
}

fn json(status: u16, value: &serde_json::Value) -> Answer {
    (
        status,
        vec![("Content-Type", "application/json; charset=utf-8".to_owned())],
        value.to_string().into_bytes(),
    )
}

fn thim(request: &Request, thim: Option<&ThimCertification>) -> Answer {
    if request.method != "GET" {
        return text(405, "Method Not Allowed");
    }
    let Some(thim) = thim else {
        return text(404, "Not Found");
    };
    json(
        200,
        &serde_json::json!({
            "vcekCert": thim.vcek_cert,
            "tcbm": thim.tcbm,
            "certificateChain": thim.certificate_chain,
            "cacheControl": "86400",
        }),
    )
}

fn td_quote(request: &Request, quote: Option<&[u8]>) -> Answer {
    if request.method != "POST" {
        return text(405, "Method Not Allowed");
    }
    let report = serde_json::from_slice::<serde_json::Value>(&request.body)
        .ok()
        .and_then(|body| body.get("report")?.as_str().map(str::to_owned))
        .and_then(|report| BASE64URL_ANY_PADDING.decode(report).ok());
    match report {
        Some(report) if report.len() == TD_REPORT_LEN => {}
        _ => {
            return json(
                400,
                &serde_json::json!({
                    "error": "the body is not {\"report\": base64url of a 1024-byte TDREPORT}"
                }),
            );
        }
    }
    let Some(quote) = quote else {
        return text(404, "Not Found");
    };
    json(
        200,
        &serde_json::json!({
            "quote": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(quote),
        }),
    )
}
