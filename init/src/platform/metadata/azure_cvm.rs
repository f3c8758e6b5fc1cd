//! What an Azure confidential VM's evidence needs from Azure's metadata service besides the
//! vTPM: the VCEK chain of an SEV-SNP VM's chip, or the TD quote of a TDX VM's TDREPORT. The
//! answers are public (certificates, a signed quote) and are sent to the verifier as they are;
//! the verifier checks them, so the service is no more trusted here than for user data.
//!
//! - **VCEK chain** (`azure-snp`): `GET /metadata/THIM/amd/certification` with `Metadata: true`
//!   answers JSON `{"vcekCert": PEM, "tcbm": …, "certificateChain": PEM (ASK, ARK), …}`
//!   (Microsoft: "Trusted Hardware Identity Management",
//!   <https://learn.microsoft.com/azure/security/fundamentals/trusted-hardware-identity-management>);
//!   [`azure_vcek_chain`] gives the PEM text `vcekCert` then `certificateChain`
//!   (`hawser_platforms::node::thim_vcek_chain`).
//! - **TD quote** (`azure-tdx`): `POST /acc/tdquote` with `Content-Type: application/json` and
//!   the body `{"report": "<base64url of the 1024-byte TDREPORT>"}` answers
//!   `{"quote": "<base64url>"}`. Microsoft documents no reference for it; the format is that of
//!   Microsoft's own client (`az-tdx-vtpm`, `src/imds.rs` of github.com/kinvolk/azure-cvm-tooling:
//!   the report base64url *without* padding, the answer decoded by `base64_url::decode`) and of
//!   Intel's (`go-tdx/azure_adapter.go` of github.com/intel/trustauthority-client-for-go: the
//!   report base64url *with* padding, the answer decoded as base64url without padding). So the
//!   service takes either padding; hawser sends Microsoft's (no padding) and reads the answer
//!   with or without padding (and, leniently, in the standard alphabet too).
//!   `Metadata: true` is sent as on every IMDS request; neither reference client sends it, so
//!   the service does not appear to require it.
//!
//! Both reads retry as the key reads do (transport failures, 429, 5xx, until the deadline) and
//! are bounded by [`super::MAX_RESPONSE_BYTES`]. A quote is made by the host's quoting enclave
//! when asked, so one attempt at it may take up to [`TD_QUOTE_ATTEMPT_TIMEOUT`] rather than
//! [`super::ATTEMPT_TIMEOUT`].

use std::time::Duration;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hyper::{Method, StatusCode};

use super::{ATTEMPT_TIMEOUT, BaseUrl, Failure, MetadataError, MetadataSource, retrying, send};

/// THIM's AMD certification endpoint: the VCEK of the chip the VM runs on, and AMD's chain.
pub const THIM_PATH: &str = "/metadata/THIM/amd/certification";
/// The TD quote endpoint: a TDREPORT in, the host's quote of it out.
pub const TD_QUOTE_PATH: &str = "/acc/tdquote";
/// One attempt at a TD quote (connect, request, whole answer) takes at most this long: the
/// host's quoting enclave signs on demand.
pub const TD_QUOTE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

const VCEK_CHAIN: &str = "THIM's VCEK certificate and chain";
const TD_QUOTE: &str = "a TD quote";

/// base64url, padding optional: the answer's quote as either reference client reads it.
const BASE64URL_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The VCEK chain of this SEV-SNP VM's chip from the metadata service at `base`, as PEM text
/// (the VCEK, then the ASK and ARK), retrying until `deadline` has passed.
pub async fn azure_vcek_chain(base: BaseUrl, deadline: Duration) -> Result<Vec<u8>, MetadataError> {
    let cloud = MetadataSource::Azure;
    let (pem, attempts) = retrying(
        cloud,
        base.url(THIM_PATH),
        deadline,
        ATTEMPT_TIMEOUT,
        move || async move {
            let (url, reply) = send(
                cloud,
                base,
                Method::GET,
                THIM_PATH,
                &[("metadata", "true")],
                None,
            )
            .await?;
            if reply.status != StatusCode::OK {
                return Err(status_failure(url, reply.status, THIM_HINT));
            }
            hawser_platforms::node::thim_vcek_chain(&reply.body).map_err(|error| {
                // Its detail, without the wrapper that names the request again.
                let reason = match &error {
                    hawser_platforms::node::NodeError::Metadata { source, .. } => {
                        source.to_string()
                    }
                    other => crate::platform::error_chain(other),
                };
                bad_answer(url, VCEK_CHAIN, &reason)
            })
        },
    )
    .await?;
    tracing::info!(%base, attempts, bytes = pem.len(), "read the VCEK chain from Azure's THIM");
    Ok(pem)
}

/// The TD quote of `td_report` (a TDREPORT, 1024 bytes) from the metadata service at `base`,
/// decoded, retrying until `deadline` has passed.
pub async fn azure_td_quote(
    base: BaseUrl,
    td_report: &[u8],
    deadline: Duration,
) -> Result<Vec<u8>, MetadataError> {
    let cloud = MetadataSource::Azure;
    let request = serde_json::json!({
        "report": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(td_report),
    })
    .to_string()
    .into_bytes();
    let (quote, attempts) = retrying(
        cloud,
        base.url(TD_QUOTE_PATH),
        deadline,
        TD_QUOTE_ATTEMPT_TIMEOUT,
        move || {
            let request = request.clone();
            async move {
                let (url, reply) = send(
                    cloud,
                    base,
                    Method::POST,
                    TD_QUOTE_PATH,
                    &[("metadata", "true")],
                    Some(("application/json", request)),
                )
                .await?;
                if reply.status != StatusCode::OK {
                    return Err(status_failure(url, reply.status, TD_QUOTE_HINT));
                }
                parse_td_quote(&reply.body).map_err(|reason| bad_answer(url, TD_QUOTE, &reason))
            }
        },
    )
    .await?;
    tracing::info!(%base, attempts, bytes = quote.len(), "read the TD quote from Azure's /acc/tdquote");
    Ok(quote)
}

/// `{"quote": "<base64url>"}` → the quote's bytes.
pub(super) fn parse_td_quote(json: &[u8]) -> Result<Vec<u8>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let text = value
        .get("quote")
        .and_then(serde_json::Value::as_str)
        .ok_or("no string \"quote\"")?;
    // The standard alphabet read as the URL-safe one (a lenient server); both are base64.
    let text: String = text
        .trim()
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    let quote = BASE64URL_ANY_PADDING
        .decode(text.as_bytes())
        .map_err(|e| format!("\"quote\" is not base64url: {e}"))?;
    if quote.is_empty() {
        return Err("\"quote\" is empty".to_owned());
    }
    Ok(quote)
}

fn bad_answer(url: String, what: &'static str, reason: &dyn std::fmt::Display) -> Failure {
    Failure::Fatal(MetadataError::BadAnswer {
        cloud: MetadataSource::Azure,
        url,
        what,
        reason: reason.to_string(),
    })
}

/// What a final status of the THIM read means.
const THIM_HINT: StatusHints = StatusHints {
    not_found: "no VCEK for this VM: THIM serves one to Azure SEV-SNP confidential VMs only \
                (is this VM one? A TDX VM needs hawser.platform=azure-tdx or azure)",
    refused: "the request was refused (a proxy header such as X-Forwarded-For?)",
};

/// What a final status of the TD quote read means.
const TD_QUOTE_HINT: StatusHints = StatusHints {
    not_found: "no TD quote service: Azure serves one to TDX confidential VMs only (is this VM \
                one? An SEV-SNP VM needs hawser.platform=azure-snp or azure)",
    refused: "the quote service refused the TDREPORT (not this VM's, or malformed)",
};

struct StatusHints {
    not_found: &'static str,
    refused: &'static str,
}

/// 429 and 5xx may pass; any other status will not.
fn status_failure(url: String, status: StatusCode, hints: StatusHints) -> Failure {
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Failure::Retry {
            url,
            reason: format!("HTTP {}", status.as_u16()),
        };
    }
    let hint = match status {
        StatusCode::NOT_FOUND => hints.not_found,
        StatusCode::BAD_REQUEST | StatusCode::FORBIDDEN => hints.refused,
        _ => "unexpected for an Azure confidential VM",
    };
    Failure::Fatal(MetadataError::Status {
        cloud: MetadataSource::Azure,
        url,
        status: status.as_u16(),
        hint: hint.to_owned(),
    })
}
