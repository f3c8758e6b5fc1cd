//! An emulated cloud instance metadata service on 127.0.0.1, for tests of PID 1's metadata
//! client (`hawser_init::platform::metadata`) on the host and in QEMU guests.
//!
//! [`MetadataServer`] answers as the clouds do, for what hawser reads:
//! - **GCE** (Google's format): `GET /computeMetadata/v1/instance/attributes/?recursive=true`
//!   (a JSON object), `…/attributes/` (names, one a line) and `…/attributes/<name>` (the
//!   value). Only requests carrying `Metadata-Flavor: Google` and no `X-Forwarded-For` are
//!   answered; others get 403, as Google's server does. Every answer carries the response
//!   header `Metadata-Flavor: Google` (unless [`MetadataServer::impersonate`] says otherwise).
//! - **Azure**: `GET /metadata/instance/compute/userData?api-version=…&format=text` with
//!   `Metadata: true` (else 400): the user data in base64. A confidential VM's endpoints too,
//!   when [`MetadataServer::set_azure_cvm`] gives them something to serve: THIM's VCEK chain
//!   (`GET /metadata/THIM/amd/certification`) and the TD quote service (`POST /acc/tdquote`);
//!   see [`AzureCvm`].
//! - **AWS IMDSv2**: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
//!   (1–21600, else 400) issues a token; `GET /latest/user-data` needs it (else 401) and answers
//!   the user data, or 404 when there is none.
//!
//! Tests can queue transient failures ([`MetadataServer::fail_next`]) and read back every
//! request ([`MetadataServer::requests`], with its body).
//!
//! # Reaching it from a guest
//!
//! [`gce_user_netdev`] gives a QEMU user network (slirp) whose guest reaches this server at
//! `169.254.169.254:80`, as on a cloud, with `guestfwd`. libslirp accepts a guestfwd address
//! only inside the user network's `net=` (and not its host or DNS address: `check_guestfwd` in
//! libslirp's `slirp.c`), so the network is `169.254.169.0/24`: host (gateway) `.2`, DNS `.3`,
//! DHCP from `.15`. `restrict=on` keeps the guest from reaching anything else: no traffic
//! leaves the machine.
//!
//! QEMU turns `guestfwd=tcp:IP:PORT-tcp:127.0.0.1:HPORT` into *one* TCP chardev, connected
//! when QEMU starts (so the server must be listening first) and shared by every guest
//! connection to `IP:PORT`. Two consequences this server is built for: it never closes a
//! connection itself (a closed chardev is not reopened: later guest requests would go nowhere),
//! answering each request with a `Content-Length` so a client knows where an answer ends,
//! whatever `Connection:` header the request had; and requests are taken one after another on
//! that one connection, so guest requests must not overlap (PID 1's client sends one at a
//! time).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;

mod azure_cvm;

pub use azure_cvm::{AzureCvm, TD_QUOTE_PATH, TD_REPORT_LEN, THIM_PATH, ThimCertification};

/// The user network of [`gce_user_netdev`].
pub const USER_NET: &str = "169.254.169.0/24";
/// The address the guest reaches the metadata service at, as on every supported cloud.
pub const METADATA_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// The user network's host (its gateway and DHCP server).
pub const USER_NET_HOST: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 2);
/// The first address the user network's DHCP server hands out (the guest's, with one NIC).
pub const USER_NET_GUEST: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 15);

/// The `-netdev` value of a user network whose guest reaches a [`MetadataServer`] on
/// `metadata_port` (on 127.0.0.1) at `169.254.169.254:80` and nothing else:
///
/// `user,id=<id>,net=169.254.169.0/24,host=169.254.169.2,dhcpstart=169.254.169.15,restrict=on,
/// guestfwd=tcp:169.254.169.254:80-tcp:127.0.0.1:<metadata_port>`
///
/// Start the server before QEMU (the forward connects at QEMU's start). Pair it with e.g.
/// `-device virtio-net-pci,netdev=<id>`.
pub fn gce_user_netdev(id: &str, metadata_port: u16) -> String {
    format!(
        "user,id={id},net={USER_NET},host={USER_NET_HOST},dhcpstart={USER_NET_GUEST},\
         restrict=on,guestfwd=tcp:{METADATA_IP}:80-tcp:127.0.0.1:{metadata_port}"
    )
}

/// Which cloud the server plays, with the configuration it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataFlavor {
    /// GCE: instance attributes (name → value).
    Gce {
        attributes: BTreeMap<String, String>,
    },
    /// Azure: the VM's user data (served in base64; empty when none).
    Azure { user_data: Vec<u8> },
    /// AWS IMDSv2: the instance's user data (`None`: 404, as for an instance without).
    Aws { user_data: Option<Vec<u8>> },
}

/// One request the server read, and the status it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// `GET`, `PUT`, …
    pub method: String,
    /// The request target, path and query (`/computeMetadata/v1/…?recursive=true`).
    pub target: String,
    /// The headers, names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body (empty when there was none).
    pub body: Vec<u8>,
    /// The status answered.
    pub status: u16,
}

impl RecordedRequest {
    /// The first value of header `name` (in any case: HTTP's header names are).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the server does besides answering as its flavor says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Impersonation {
    /// Answer as the cloud does.
    #[default]
    Faithful,
    /// Answer GCE requests without the `Metadata-Flavor: Google` response header: a server
    /// that is not Google's (a client must refuse it).
    NotGoogle,
}

#[derive(Debug)]
struct State {
    flavor: MetadataFlavor,
    azure_cvm: AzureCvm,
    impersonation: Impersonation,
    fail_next: VecDeque<u16>,
    requests: Vec<RecordedRequest>,
    tokens: Vec<String>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
    token_counter: AtomicU64,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread cannot leave the state half-written in a way that
        // matters to a test; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The emulated metadata service, listening on `127.0.0.1:<ephemeral port>` until dropped.
#[derive(Debug)]
pub struct MetadataServer {
    address: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// Longest request head read (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// Longest request body read.
const MAX_BODY: usize = 64 * 1024;
/// How often idle connection threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

impl MetadataServer {
    /// Starts serving `flavor`.
    pub fn start(flavor: MetadataFlavor) -> io::Result<MetadataServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                flavor,
                azure_cvm: AzureCvm::default(),
                impersonation: Impersonation::Faithful,
                fail_next: VecDeque::new(),
                requests: Vec::new(),
                tokens: Vec::new(),
            }),
            stop: AtomicBool::new(false),
            token_counter: AtomicU64::new(0),
        });
        let for_acceptor = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("metadata-server".into())
            .spawn(move || accept_loop(&listener, &for_acceptor))?;
        Ok(MetadataServer {
            address,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// Starts a GCE metadata server with these instance attributes.
    pub fn gce<K: Into<String>, V: Into<String>>(
        attributes: impl IntoIterator<Item = (K, V)>,
    ) -> io::Result<MetadataServer> {
        MetadataServer::start(MetadataFlavor::Gce {
            attributes: attributes
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        })
    }

    /// The address it listens on (127.0.0.1).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The port it listens on: [`gce_user_netdev`]'s `metadata_port`.
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// `http://127.0.0.1:<port>`: the base URL a host-side client is pointed at.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every request read so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.state().requests.clone()
    }

    /// Answers the next requests with these statuses (e.g. 503 as during a GCE maintenance
    /// event), in order, before serving normally again.
    pub fn fail_next(&self, statuses: &[u16]) {
        self.shared.state().fail_next.extend(statuses);
    }

    /// Replaces what the server serves.
    pub fn set_flavor(&self, flavor: MetadataFlavor) {
        self.shared.state().flavor = flavor;
    }

    /// Serves an Azure confidential VM's endpoints (with the Azure flavor) as `cvm` says.
    pub fn set_azure_cvm(&self, cvm: AzureCvm) {
        self.shared.state().azure_cvm = cvm;
    }

    /// Makes the server misbehave in a way a client must notice.
    pub fn impersonate(&self, impersonation: Impersonation) {
        self.shared.state().impersonation = impersonation;
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("metadata-conn".into())
            .spawn(move || serve_connection(stream, &shared));
        if let Ok(handle) = spawned {
            connections.push(handle);
        }
        connections.retain(|handle| !handle.is_finished());
    }
    for handle in connections {
        let _ = handle.join();
    }
}

/// Requests one after another until the peer closes (never closed from here: see the module
/// docs) or the server stops.
fn serve_connection(stream: TcpStream, shared: &Shared) {
    if stream.set_read_timeout(Some(POLL)).is_err() {
        return;
    }
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let request = match read_request(&mut reader, shared) {
            Ok(Some(request)) => request,
            Ok(None) | Err(_) => return,
        };
        let (status, headers, body) = answer(&request, shared);
        let mut state = shared.state();
        state.requests.push(RecordedRequest {
            method: request.method,
            target: request.target,
            headers: request.headers,
            body: request.body,
            status,
        });
        drop(state);
        let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
        for (name, value) in &headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let written = writer
            .write_all(head.as_bytes())
            .and_then(|()| writer.write_all(&body))
            .and_then(|()| writer.flush());
        if written.is_err() {
            return;
        }
    }
}

struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One line, waiting out read timeouts until the server stops; `None` at end of stream.
fn read_line(reader: &mut BufReader<TcpStream>, shared: &Shared) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    loop {
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Ok(None),
            Ok(_) if line.ends_with(b"\n") => {
                return Ok(Some(String::from_utf8_lossy(&line).trim_end().to_owned()));
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if shared.stop.load(Ordering::SeqCst) {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
        if line.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>, shared: &Shared) -> io::Result<Option<Request>> {
    // Blank lines between requests are tolerated (RFC 9112 §2.2).
    let request_line = loop {
        match read_line(reader, shared)? {
            None => return Ok(None),
            Some(line) if line.is_empty() => continue,
            Some(line) => break line,
        }
    };
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad request line",
        ));
    };
    let mut headers = Vec::new();
    loop {
        let Some(line) = read_line(reader, shared)? else {
            return Ok(None);
        };
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let mut request = Request {
        method: method.to_owned(),
        target: target.to_owned(),
        headers,
        body: Vec::new(),
    };
    let length: usize = request
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "request body too long",
        ));
    }
    request.body = vec![0; length];
    reader.read_exact(&mut request.body)?;
    Ok(Some(request))
}

type Answer = (u16, Vec<(&'static str, String)>, Vec<u8>);

fn answer(request: &Request, shared: &Shared) -> Answer {
    let mut guard = shared.state();
    let state = &mut *guard;
    let gce_header = matches!(state.flavor, MetadataFlavor::Gce { .. })
        && state.impersonation == Impersonation::Faithful;
    let mut answer = match state.fail_next.pop_front() {
        Some(status) => (status, Vec::new(), reason(status).as_bytes().to_vec()),
        None => match &state.flavor {
            MetadataFlavor::Gce { attributes } => gce(request, attributes),
            MetadataFlavor::Azure { user_data } => azure(request, user_data, &state.azure_cvm),
            MetadataFlavor::Aws { user_data } => {
                aws(request, user_data.as_deref(), &mut state.tokens, shared)
            }
        },
    };
    if gce_header {
        answer.1.push(("Metadata-Flavor", "Google".to_owned()));
        answer
            .1
            .push(("Server", "Metadata Server for VM".to_owned()));
    }
    answer
}

fn text(status: u16, body: &str) -> Answer {
    (
        status,
        vec![("Content-Type", "text/plain; charset=utf-8".to_owned())],
        body.as_bytes().to_vec(),
    )
}

fn gce(request: &Request, attributes: &BTreeMap<String, String>) -> Answer {
    if request.header("metadata-flavor") != Some("Google")
        || request.header("x-forwarded-for").is_some()
    {
        return text(
            403,
            "Your client does not have permission to get URL from this server. Missing \
             Metadata-Flavor:Google header.",
        );
    }
    let (path, query) = request
        .target
        .split_once('?')
        .unwrap_or((&request.target, ""));
    let recursive = query.split('&').any(|pair| pair == "recursive=true");
    let Some(name) = path.strip_prefix("/computeMetadata/v1/instance/attributes/") else {
        return text(404, "Not Found");
    };
    if name.is_empty() {
        if recursive {
            let json = serde_json::to_vec(attributes).unwrap_or_default();
            return (
                200,
                vec![("Content-Type", "application/json".to_owned())],
                json,
            );
        }
        let names: String = attributes.keys().map(|name| format!("{name}\n")).collect();
        return text(200, &names);
    }
    match attributes.get(name) {
        Some(value) => text(200, value),
        None => text(404, "Not Found"),
    }
}

fn azure(request: &Request, user_data: &[u8], cvm: &AzureCvm) -> Answer {
    if request.header("metadata") != Some("true") {
        return (
            400,
            vec![("Content-Type", "application/json".to_owned())],
            br#"{"error":"Bad request. Required metadata header not specified"}"#.to_vec(),
        );
    }
    if let Some(answer) = azure_cvm::answer(request, cvm) {
        return answer;
    }
    let (path, query) = request
        .target
        .split_once('?')
        .unwrap_or((&request.target, ""));
    let pairs: Vec<&str> = query.split('&').collect();
    if path != "/metadata/instance/compute/userData"
        || !pairs.iter().any(|p| p.starts_with("api-version="))
        || !pairs.contains(&"format=text")
    {
        return text(404, "Not Found");
    }
    text(
        200,
        &base64::engine::general_purpose::STANDARD.encode(user_data),
    )
}

fn aws(
    request: &Request,
    user_data: Option<&[u8]>,
    tokens: &mut Vec<String>,
    shared: &Shared,
) -> Answer {
    match (request.method.as_str(), request.target.as_str()) {
        ("PUT", "/latest/api/token") => {
            let ttl: Option<u32> = request
                .header("x-aws-ec2-metadata-token-ttl-seconds")
                .and_then(|v| v.parse().ok());
            if !ttl.is_some_and(|ttl| (1..=21600).contains(&ttl)) {
                return text(400, "Bad Request");
            }
            let n = shared.token_counter.fetch_add(1, Ordering::SeqCst);
            let token = format!("AQAEAhawserTestToken{n:08}==");
            tokens.push(token.clone());
            text(200, &token)
        }
        (_, "/latest/api/token") => text(405, "Method Not Allowed"),
        ("GET", path) => {
            let authorized = request
                .header("x-aws-ec2-metadata-token")
                .is_some_and(|token| tokens.iter().any(|t| t == token));
            if !authorized {
                return text(401, "Unauthorized");
            }
            match (path, user_data) {
                ("/latest/user-data", Some(data)) => (
                    200,
                    vec![("Content-Type", "application/octet-stream".to_owned())],
                    data.to_vec(),
                ),
                _ => text(404, "Not Found"),
            }
        }
        _ => text(405, "Method Not Allowed"),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests;
