//! A cloud's instance metadata service as a source of hawser keys, beside QEMU's fw_cfg.
//!
//! On a cloud the unmeasured per-boot settings that fw_cfg carries under QEMU come from the
//! metadata service at 169.254.169.254. This module reads them and nothing more: it returns
//! the keys as [`HawserKeys`], a map of the same shape as fw_cfg's entries, and the caller
//! feeds it to the same allow-list, [`crate::config::parse_fw_cfg`] (which also refuses
//! `init_secret_hash`). The metadata service is as unmeasured as fw_cfg: whoever runs the
//! host chooses its answers.
//!
//! # Where each cloud keeps hawser's keys
//!
//! - **GCE**: instance attributes named `hawser-<key>` (`hawser-role`,
//!   `hawser-join_endpoint`; `-` and `_` in `<key>` are the same, so `hawser-join-endpoint`
//!   works too, and giving both spellings is an error), read in one request:
//!   `GET /computeMetadata/v1/instance/attributes/?recursive=true` with the request header
//!   `Metadata-Flavor: Google` (the server answers 403 without it). An answer without the
//!   response header `Metadata-Flavor: Google` is refused, as Google's own clients do to
//!   recognise the real server (`OnGCE` in `cloud.google.com/go/compute/metadata`). 404 (no
//!   attributes) is no keys. Set them with `gcloud compute instances add-metadata NAME
//!   --metadata hawser-role=worker,...`. Google documents the endpoint, the header and that
//!   the server may answer 503 for a moment during maintenance (retry) in
//!   <https://cloud.google.com/compute/docs/metadata/querying-metadata> and
//!   <https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-metadata-server>.
//! - **Azure**: the VM's *user data*, `GET /metadata/instance/compute/userData
//!   ?api-version=2021-01-01&format=text` with the header `Metadata: true`; the answer is the
//!   user data in base64 (<https://learn.microsoft.com/azure/virtual-machines/user-data>,
//!   <https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service>).
//! - **AWS**: IMDSv2 only: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`,
//!   then `GET /latest/user-data` with `X-aws-ec2-metadata-token`; 404 is no user data
//!   (<https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html>).
//!
//! User data (Azure, AWS) is UTF-8 text of `key=value` lines, `#` comments and empty lines
//! skipped (see [`parse_user_data`]):
//!
//! ```text
//! role=worker
//! join_endpoint=10.0.0.2:9000
//! ```
//!
//! An Azure confidential VM also reads what its evidence needs here: the VCEK chain (SEV-SNP)
//! and the TD quote (TDX), [`azure_vcek_chain`] and [`azure_td_quote`] (`metadata/azure_cvm.rs`
//! documents the requests), with the same bounds and retries.
//!
//! # Use
//!
//! After the network is up ([`super::dhcp::dhcp_configure`] on a cloud):
//! `let keys = read_hawser_keys(MetadataSource::Gce, deadline).await?;` then
//! `config::parse_fw_cfg(&keys)` (a `&HawserKeys` derefs to the entry map). Tests point
//! [`read_hawser_keys_from`] at an emulator (`hawser_harness::metadata_server`).
//!
//! # How it reads
//!
//! HTTP/1.1 over a plain TCP connection (hyper's client connection, already in PID 1 through
//! tonic), to an IPv4 address: no DNS, no proxy, no TLS (the service has none). Every read is
//! bounded: [`MAX_RESPONSE_BYTES`] per answer, [`MAX_VALUE_BYTES`] per value,
//! [`ATTEMPT_TIMEOUT`] per attempt (connect, request and whole answer). Failures that may pass
//! — no route or no answer yet (the NIC, DHCP or the service still coming up), HTTP 429 and
//! 5xx — are retried with a doubling backoff ([`FIRST_BACKOFF`] to [`MAX_BACKOFF`]) until the
//! caller's deadline; answers that will not change by asking again (403, a malformed body, a
//! server that is not the expected one) fail at once.
//!
//! Values are never logged, and no error carries one (the allow-list's `state_disk_key` is key
//! material): hawser's copies of the answers are wiped after use ([`HawserKeys`] wipes its
//! values on drop). hyper's own read buffers are not under hawser's control and are not wiped.

mod azure_cvm;
mod parse;

use std::fmt;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::str::FromStr;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, StatusCode};
use zeroize::Zeroizing;

pub use azure_cvm::{
    TD_QUOTE_ATTEMPT_TIMEOUT, TD_QUOTE_PATH, THIM_PATH, azure_td_quote, azure_vcek_chain,
};
pub use parse::{
    GCE_ATTRIBUTE_PREFIX, HawserKeys, MAX_VALUE_BYTES, Malformed, parse_aws_token,
    parse_azure_user_data, parse_gce_attributes, parse_user_data,
};

/// The link-local address every supported cloud serves its metadata on.
pub const METADATA_ADDRESS: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(169, 254, 169, 254), 80);
/// The largest answer read: GCE's limit on all of an instance's metadata (512 KiB), which its
/// recursive attribute listing may approach; Azure's (64 KiB, base64) and AWS's (16 KiB) user
/// data are smaller.
pub const MAX_RESPONSE_BYTES: usize = 512 * 1024;
/// One attempt (connect, request, whole answer) takes at most this long.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// The wait after the first failed attempt; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The lifetime asked for an IMDSv2 token: one boot's reads take seconds.
pub const AWS_TOKEN_TTL_SECONDS: &str = "60";

const GCE_PATH: &str = "/computeMetadata/v1/instance/attributes/?recursive=true";
const AZURE_PATH: &str = "/metadata/instance/compute/userData?api-version=2021-01-01&format=text";
const AWS_TOKEN_PATH: &str = "/latest/api/token";
const AWS_USER_DATA_PATH: &str = "/latest/user-data";

/// Which cloud's metadata service to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataSource {
    /// Google Compute Engine: instance attributes `hawser-<key>`.
    Gce,
    /// Azure IMDS: user data of `key=value` lines.
    Azure,
    /// AWS EC2 IMDSv2: user data of `key=value` lines.
    Aws,
}

impl MetadataSource {
    /// `gce`, `azure` or `aws` (e.g. a command line value) → the source.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "gce" => Some(MetadataSource::Gce),
            "azure" => Some(MetadataSource::Azure),
            "aws" => Some(MetadataSource::Aws),
            _ => None,
        }
    }

    /// What the operator does to give this VM hawser keys.
    fn how_to_configure(self) -> &'static str {
        match self {
            MetadataSource::Gce => {
                "set instance attributes hawser-<key> (gcloud compute instances add-metadata)"
            }
            MetadataSource::Azure => "set the VM's user data to key=value lines",
            MetadataSource::Aws => {
                "enable IMDSv2 (metadata options: http-endpoint enabled) and set the instance's \
                 user data to key=value lines"
            }
        }
    }
}

impl fmt::Display for MetadataSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MetadataSource::Gce => "GCE",
            MetadataSource::Azure => "Azure",
            MetadataSource::Aws => "AWS",
        })
    }
}

/// Where the metadata service listens: `http://<IPv4 address>[:<port>]` (no name: PID 1 has
/// no DNS). [`BaseUrl::default`] is [`METADATA_ADDRESS`]; tests point it at an emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseUrl(SocketAddr);

impl BaseUrl {
    /// The service at `address`.
    pub fn new(address: SocketAddr) -> Self {
        BaseUrl(address)
    }

    /// The socket address connected to.
    pub fn address(&self) -> SocketAddr {
        self.0
    }

    fn url(&self, path: &str) -> String {
        format!("{self}{path}")
    }

    fn host_header(&self) -> String {
        match self.0.port() {
            80 => self.0.ip().to_string(),
            _ => self.0.to_string(),
        }
    }
}

impl Default for BaseUrl {
    fn default() -> Self {
        BaseUrl(SocketAddr::V4(METADATA_ADDRESS))
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.host_header())
    }
}

impl FromStr for BaseUrl {
    type Err = MetadataError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || MetadataError::BadBaseUrl {
            url: text.to_owned(),
        };
        let rest = text.strip_prefix("http://").ok_or_else(bad)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let address = match rest.parse::<SocketAddrV4>() {
            Ok(address) => address,
            Err(_) => SocketAddrV4::new(rest.parse().map_err(|_| bad())?, 80),
        };
        Ok(BaseUrl(SocketAddr::V4(address)))
    }
}

/// Why no hawser keys could be read from instance metadata.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// No usable answer before the deadline (no route, no listener, timeouts, 5xx).
    #[error(
        "{cloud} metadata at {url}: no answer within {} s (last: {last}); check that this VM \
         runs on {cloud} and that its network is up (DHCP), or boot with another \
         configuration source",
        .deadline.as_secs_f32()
    )]
    Unreachable {
        cloud: MetadataSource,
        url: String,
        deadline: Duration,
        last: String,
    },
    /// The service answered with a status asking again will not change.
    #[error("{cloud} metadata at {url} answered HTTP {status}: {hint}")]
    Status {
        cloud: MetadataSource,
        url: String,
        status: u16,
        hint: String,
    },
    /// Something other than Google's metadata server answered at the GCE address.
    #[error(
        "GCE metadata at {url}: the answer lacks the response header `Metadata-Flavor: Google`, \
         so it is not Google's metadata server; refused (is this VM on GCE?)"
    )]
    NotGoogle { url: String },
    /// The answer is larger than any hawser configuration.
    #[error(
        "{cloud} metadata at {url}: the answer exceeds {MAX_RESPONSE_BYTES} bytes; refused \
         (remove large attributes or user data)"
    )]
    TooLarge { cloud: MetadataSource, url: String },
    /// The answer could not be read as hawser keys.
    #[error("{cloud} metadata at {url}: {reason}; fix it: {}", .cloud.how_to_configure())]
    Malformed {
        cloud: MetadataSource,
        url: String,
        reason: Malformed,
    },
    /// An attestation answer (Azure's VCEK chain, TD quote) that is not what the service
    /// documents.
    #[error("{cloud} metadata at {url}: the answer is not {what}: {reason}")]
    BadAnswer {
        cloud: MetadataSource,
        url: String,
        what: &'static str,
        reason: String,
    },
    /// A base URL that is not `http://<IPv4 address>[:<port>]`.
    #[error("metadata base URL {url:?} is not http://<IPv4 address>[:<port>]")]
    BadBaseUrl { url: String },
}

/// Reads hawser's keys from `source`'s metadata service at 169.254.169.254, retrying until
/// `deadline` has passed (see the module docs).
pub async fn read_hawser_keys(
    source: MetadataSource,
    deadline: Duration,
) -> Result<HawserKeys, MetadataError> {
    read_hawser_keys_from(source, BaseUrl::default(), deadline).await
}

/// [`read_hawser_keys`] from the service at `base` (tests: an emulator on loopback).
pub async fn read_hawser_keys_from(
    source: MetadataSource,
    base: BaseUrl,
    deadline: Duration,
) -> Result<HawserKeys, MetadataError> {
    let (keys, attempts) = retrying(
        source,
        base.to_string(),
        deadline,
        ATTEMPT_TIMEOUT,
        move || attempt(source, base),
    )
    .await?;
    tracing::info!(
        cloud = %source,
        %base,
        attempts,
        keys = ?keys.names(),
        "read hawser keys from instance metadata"
    );
    Ok(keys)
}

/// Runs `once` until it succeeds, fails for good, or `deadline` has passed: each attempt gets
/// at most `attempt_timeout` (less when the deadline is closer; a timeout names `url`), and
/// failures worth another attempt wait a doubling backoff ([`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`]). The value and the number of attempts it took.
async fn retrying<T, F, Fut>(
    cloud: MetadataSource,
    url: String,
    deadline: Duration,
    attempt_timeout: Duration,
    mut once: F,
) -> Result<(T, u32), MetadataError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let started = tokio::time::Instant::now();
    let give_up_at = started + deadline;
    let mut backoff = FIRST_BACKOFF;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let remaining = give_up_at.saturating_duration_since(tokio::time::Instant::now());
        let timeout = attempt_timeout.min(remaining);
        let failure = match tokio::time::timeout(timeout, once()).await {
            Ok(Ok(value)) => return Ok((value, attempts)),
            Ok(Err(Failure::Fatal(error))) => return Err(error),
            Ok(Err(Failure::Retry { url, reason })) => (url, reason),
            Err(_) => (
                url.clone(),
                format!("no complete answer within {} ms", timeout.as_millis()),
            ),
        };
        let now = tokio::time::Instant::now();
        if now >= give_up_at {
            return Err(MetadataError::Unreachable {
                cloud,
                url: failure.0,
                deadline,
                last: failure.1,
            });
        }
        tracing::debug!(%cloud, url = %failure.0, reason = %failure.1, "metadata not yet answering; retrying");
        tokio::time::sleep(backoff.min(give_up_at - now)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// How one attempt failed.
enum Failure {
    /// Worth another attempt.
    Retry { url: String, reason: String },
    /// Final.
    Fatal(MetadataError),
}

/// One HTTP answer, its body wiped on drop.
struct Reply {
    status: StatusCode,
    flavor: Option<HeaderValue>,
    body: Zeroizing<Vec<u8>>,
}

async fn attempt(source: MetadataSource, base: BaseUrl) -> Result<HawserKeys, Failure> {
    match source {
        MetadataSource::Gce => {
            let (url, reply) = send(
                source,
                base,
                Method::GET,
                GCE_PATH,
                &[("metadata-flavor", "Google")],
                None,
            )
            .await?;
            if reply.flavor.as_ref().is_none_or(|v| v != "Google") {
                return Err(Failure::Fatal(MetadataError::NotGoogle { url }));
            }
            match reply.status {
                StatusCode::OK => parse_gce_attributes(&reply.body)
                    .map_err(|reason| malformed(source, url, reason)),
                StatusCode::NOT_FOUND => Ok(HawserKeys::default()),
                status => Err(status_failure(source, url, status)),
            }
        }
        MetadataSource::Azure => {
            let (url, reply) = send(
                source,
                base,
                Method::GET,
                AZURE_PATH,
                &[("metadata", "true")],
                None,
            )
            .await?;
            match reply.status {
                StatusCode::OK => parse_azure_user_data(&reply.body)
                    .map_err(|reason| malformed(source, url, reason)),
                status => Err(status_failure(source, url, status)),
            }
        }
        MetadataSource::Aws => {
            let (url, reply) = send(
                source,
                base,
                Method::PUT,
                AWS_TOKEN_PATH,
                &[(
                    "x-aws-ec2-metadata-token-ttl-seconds",
                    AWS_TOKEN_TTL_SECONDS,
                )],
                None,
            )
            .await?;
            if reply.status != StatusCode::OK {
                return Err(status_failure(source, url, reply.status));
            }
            let token =
                parse_aws_token(&reply.body).map_err(|reason| malformed(source, url, reason))?;
            let (url, reply) = send(
                source,
                base,
                Method::GET,
                AWS_USER_DATA_PATH,
                &[("x-aws-ec2-metadata-token", token.as_str())],
                None,
            )
            .await?;
            match reply.status {
                StatusCode::OK => {
                    parse_user_data(&reply.body).map_err(|reason| malformed(source, url, reason))
                }
                StatusCode::NOT_FOUND => Ok(HawserKeys::default()),
                // The token expired between the two requests: start over.
                StatusCode::UNAUTHORIZED => Err(Failure::Retry {
                    url,
                    reason: "HTTP 401 (token not accepted)".to_owned(),
                }),
                status => Err(status_failure(source, url, status)),
            }
        }
    }
}

fn malformed(cloud: MetadataSource, url: String, reason: Malformed) -> Failure {
    Failure::Fatal(MetadataError::Malformed { cloud, url, reason })
}

/// 429 and 5xx may pass; any other status will not.
fn status_failure(cloud: MetadataSource, url: String, status: StatusCode) -> Failure {
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Failure::Retry {
            url,
            reason: format!("HTTP {}", status.as_u16()),
        };
    }
    let hint = match (cloud, status.as_u16()) {
        (MetadataSource::Gce, 403) => {
            "the metadata server refused the request (endpoint disabled for this instance?)"
                .to_owned()
        }
        (MetadataSource::Aws, 403) => {
            "IMDS is disabled for this instance: enable it (http-endpoint enabled)".to_owned()
        }
        (MetadataSource::Azure, 404) => {
            "no user data endpoint (IMDS api-version 2021-01-01 or later is needed)".to_owned()
        }
        _ => format!("unexpected; {}", cloud.how_to_configure()),
    };
    Failure::Fatal(MetadataError::Status {
        cloud,
        url,
        status: status.as_u16(),
        hint,
    })
}

/// One request on a fresh connection (`Connection: close`), with `body` (its content type and
/// bytes) if given; the answer read whole, up to [`MAX_RESPONSE_BYTES`]. Transport failures
/// are retryable.
async fn send(
    cloud: MetadataSource,
    base: BaseUrl,
    method: Method,
    path: &str,
    headers: &[(&'static str, &str)],
    body: Option<(&'static str, Vec<u8>)>,
) -> Result<(String, Reply), Failure> {
    let url = base.url(path);
    let retry = |reason: String| Failure::Retry {
        url: url.clone(),
        reason,
    };
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, base.host_header())
        .header(hyper::header::CONNECTION, "close")
        .header(hyper::header::USER_AGENT, "hawser-init");
    let bytes = match body {
        Some((content_type, bytes)) => {
            builder = builder.header(hyper::header::CONTENT_TYPE, content_type);
            Bytes::from(bytes)
        }
        None => Bytes::new(),
    };
    // An empty `Full` is an empty body, as `Empty` is: no `Content-Length` on a GET.
    let mut request = builder
        .body(Full::new(bytes))
        .map_err(|e| retry(format!("cannot build the request: {e}")))?;
    for (name, value) in headers {
        let value = HeaderValue::from_str(value)
            .map_err(|_| retry(format!("header {name} has a value HTTP cannot carry")))?;
        request
            .headers_mut()
            .insert(HeaderName::from_static(name), value);
    }
    let stream = tokio::net::TcpStream::connect(base.address())
        .await
        .map_err(|e| retry(format!("connect: {e}")))?;
    // Small requests: no Nagle delay (DESIGN: 44 ms per exchange otherwise).
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| retry(format!("HTTP handshake: {e}")))?;
    let driver = AbortOnDrop(tokio::spawn(connection));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| retry(format!("request: {e}")))?;
    let status = response.status();
    let flavor = response.headers().get("metadata-flavor").cloned();
    let mut body = response.into_body();
    let mut bytes = Zeroizing::new(Vec::new());
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| retry(format!("reading the answer: {e}")))?;
        if let Some(data) = frame.data_ref() {
            if bytes.len() + data.len() > MAX_RESPONSE_BYTES {
                return Err(Failure::Fatal(MetadataError::TooLarge { cloud, url }));
            }
            append_wiping(&mut bytes, data);
        }
    }
    drop(driver);
    Ok((
        url,
        Reply {
            status,
            flavor,
            body: bytes,
        },
    ))
}

/// Appends `data` to `buf`; when `buf` must grow, the old allocation is wiped rather than
/// freed with the answer in it (a plain `extend` reallocates without wiping).
fn append_wiping(buf: &mut Zeroizing<Vec<u8>>, data: &[u8]) {
    if buf.capacity() - buf.len() < data.len() {
        let wanted = (buf.len() + data.len()).max(buf.capacity() * 2).max(4096);
        let mut grown = Zeroizing::new(Vec::with_capacity(wanted));
        grown.extend_from_slice(buf);
        *buf = grown; // the old buffer is wiped as it drops
    }
    buf.extend_from_slice(data);
}

/// The connection's task, stopped when the exchange is over or abandoned.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
