//! Stacked etcd, end to end on the host: the kubeadm stand-in sets up a real etcd (Debian's
//! `etcd-server`) the way kubeadm does, the kubelet stand-in runs it from its static pod
//! manifest, and a second control plane joins the etcd cluster. The "nodes" are stand-in roots
//! on loopback addresses (127.0.0.2, 127.0.0.3) with free ports.
//!
//! Also: the kubelet stand-in refuses manifests it cannot run and runs the others.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::io::{BufRead as _, BufReader};
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use hawser_standin::{etcd, pki, static_pods};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use x509_parser::extensions::GeneralName;

const KUBEADM: &str = env!("CARGO_BIN_EXE_kubeadm");
const KUBELET: &str = env!("CARGO_BIN_EXE_kubelet");

/// Fails the test, naming the package, when etcd is not installed.
fn require_etcd() {
    let found = ["/usr/local/bin/etcd", "/usr/bin/etcd", "/bin/etcd"]
        .iter()
        .any(|p| Path::new(p).is_file());
    assert!(
        found,
        "etcd is not installed: these tests run a real etcd; install Debian's etcd-server \
         (apt-get install etcd-server, or scripts/setup-host)"
    );
}

/// A port free on 127.0.0.1 and on each of `ips`.
fn free_port(ips: &[IpAddr], taken: &[u16]) -> u16 {
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !taken.contains(&port) && ips.iter().all(|ip| TcpListener::bind((*ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no free port on loopback");
}

/// Lines a child wrote to stdout, collected by a thread.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn follow(&self, out: std::process::ChildStdout) {
        let lines = self.0.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn text(&self) -> String {
        self.all().join("\n")
    }
}

/// Waits until `done` holds, or fails naming `what`.
fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pids of the processes whose command line contains `needle` (the etcds a test started,
/// found by their data directory under its temporary root).
fn pids_with(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// One stand-in node: a root, a name, a loopback address.
struct Node {
    root: tempfile::TempDir,
    name: &'static str,
    ip: IpAddr,
}

/// Everything a test started, stopped at the end, also when it panics.
#[derive(Default)]
struct Processes {
    kubelets: Vec<Child>,
    data_dirs: Vec<String>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for kubelet in &mut self.kubelets {
            let _ = kill(
                Pid::from_raw(i32::try_from(kubelet.id()).unwrap()),
                Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for kubelet in &mut self.kubelets {
            while kubelet.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = kubelet.kill();
            let _ = kubelet.wait();
        }
        for dir in &self.data_dirs {
            for pid in pids_with(&format!("--data-dir={dir}")) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

impl Node {
    fn new(name: &'static str, ip: &str) -> Self {
        Self {
            root: tempfile::tempdir().unwrap(),
            name,
            ip: ip.parse().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    fn data_dir(&self) -> String {
        self.path("var/lib/etcd").display().to_string()
    }

    fn cri_socket(&self) -> String {
        let socket = self.path("run/containerd/containerd.sock");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        std::fs::write(&socket, "").unwrap();
        format!("unix://{}", socket.display())
    }

    fn kubeadm(&self, ports: &str, args: &[&str]) -> Output {
        Command::new(KUBEADM)
            .args(args)
            .env("HAWSER_STANDIN_ROOT", self.root.path())
            .env(etcd::PORTS_ENV, ports)
            .output()
            .unwrap()
    }

    fn start_kubelet(&self, processes: &mut Processes) -> Lines {
        let mut child = Command::new(KUBELET)
            .arg(format!(
                "--config={}",
                self.path("var/lib/kubelet/config.yaml").display()
            ))
            .arg(format!(
                "--kubeconfig={}",
                self.path("etc/kubernetes/kubelet.conf").display()
            ))
            .arg(format!("--hostname-override={}", self.name))
            .env("HAWSER_STANDIN_ROOT", self.root.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Lines::default();
        lines.follow(child.stdout.take().unwrap());
        processes.kubelets.push(child);
        processes.data_dirs.push(self.data_dir());
        lines
    }

    fn etcd_pids(&self) -> Vec<i32> {
        pids_with(&format!("--data-dir={}", self.data_dir()))
    }

    /// An etcd client as the API server's: the etcd CA, apiserver-etcd-client.
    async fn client(&self, endpoint: &str) -> Result<Client, etcd_client::Error> {
        let read = |rel: &str| std::fs::read(self.path(rel)).unwrap();
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(
                "etc/kubernetes/pki/etcd/ca.crt",
            )))
            .identity(Identity::from_pem(
                read("etc/kubernetes/pki/apiserver-etcd-client.crt"),
                read("etc/kubernetes/pki/apiserver-etcd-client.key"),
            ));
        let options = ConnectOptions::new()
            .with_tls(tls)
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(3));
        Client::connect([endpoint], Some(options)).await
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Puts `key`=`value` through `node`'s client certificate at `endpoint`.
fn put(rt: &tokio::runtime::Runtime, node: &Node, endpoint: &str, key: &str, value: &str) -> bool {
    rt.block_on(async {
        let Ok(mut client) = node.client(endpoint).await else {
            return false;
        };
        client.put(key, value, None).await.is_ok()
    })
}

/// The value of `key` at `endpoint`, if it answers.
fn get(rt: &tokio::runtime::Runtime, node: &Node, endpoint: &str, key: &str) -> Option<String> {
    rt.block_on(async {
        let mut client = node.client(endpoint).await.ok()?;
        let response = client.get(key, None).await.ok()?;
        response
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
    })
}

/// (name, peer URLs) of the members `endpoint` lists.
fn members(
    rt: &tokio::runtime::Runtime,
    node: &Node,
    endpoint: &str,
) -> Vec<(String, Vec<String>)> {
    rt.block_on(async {
        let Ok(mut client) = node.client(endpoint).await else {
            return Vec::new();
        };
        client
            .member_list()
            .await
            .map(|r| {
                r.members()
                    .iter()
                    .map(|m| (m.name().to_owned(), m.peer_urls().to_vec()))
                    .collect()
            })
            .unwrap_or_default()
    })
}

fn cert(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    pem.contents
}

/// CN, SANs (as text), server usage, client usage; and checks the etcd CA signed it.
fn describe(node: &Node, rel: &str) -> (String, Vec<String>, bool, bool) {
    let ca_der = cert(&node.path("etc/kubernetes/pki/etcd/ca.crt"));
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    let der = cert(&node.path(&format!("etc/kubernetes/pki/{rel}")));
    let (_, c) = x509_parser::parse_x509_certificate(&der).unwrap();
    c.verify_signature(Some(ca.public_key()))
        .unwrap_or_else(|e| panic!("{rel} is not signed by the etcd CA: {e}"));
    let cn = c
        .subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    let sans = c
        .subject_alternative_name()
        .unwrap()
        .map(|s| {
            s.value
                .general_names
                .iter()
                .map(|n| match n {
                    GeneralName::DNSName(d) => (*d).to_owned(),
                    GeneralName::IPAddress(b) if b.len() == 4 => {
                        IpAddr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string()
                    }
                    GeneralName::IPAddress(b) => {
                        IpAddr::from(<[u8; 16]>::try_from(*b).unwrap()).to_string()
                    }
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .unwrap_or_default();
    let eku = c.extended_key_usage().unwrap().unwrap().value;
    (cn, sans, eku.server_auth, eku.client_auth)
}

fn manifest_command(node: &Node) -> Vec<String> {
    let text = std::fs::read_to_string(node.path("etc/kubernetes/manifests/etcd.yaml")).unwrap();
    let pod: Value = serde_norway::from_str(&text).unwrap();
    pod["spec"]["containers"][0]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn init_config(node: &Node) -> String {
    format!(
        r#"{{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
 "nodeRegistration": {{"name": "{}", "criSocket": "{}"}},
 "localAPIEndpoint": {{"advertiseAddress": "{}", "bindPort": 6443}}}}
---
{{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration", "kubernetesVersion": "v1.33.0"}}
"#,
        node.name,
        node.cri_socket(),
        node.ip
    )
}

fn join_config(node: &Node, first: &Node, ca_hash: &str) -> String {
    format!(
        r#"{{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
 "nodeRegistration": {{"name": "{}", "criSocket": "{}"}},
 "controlPlane": {{"localAPIEndpoint": {{"advertiseAddress": "{}", "bindPort": 6443}}}},
 "discovery": {{"bootstrapToken": {{"token": "abcdef.0123456789abcdef",
   "apiServerEndpoint": "{}:6443", "caCertHashes": ["{ca_hash}"]}}}}}}
"#,
        node.name,
        node.cri_socket(),
        node.ip,
        first.ip
    )
}

/// The cluster CA and the shared control-plane files, as hawser-joind hands them out.
fn copy_shared_files(from: &Node, to: &Node) {
    for name in ["ca.crt", "ca.key"]
        .iter()
        .chain(pki::SHARED_CONTROL_PLANE_FILES)
    {
        let target = to.path(&format!("etc/kubernetes/pki/{name}"));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(from.path(&format!("etc/kubernetes/pki/{name}")), target).unwrap();
    }
}

/// SIGTERM, then the kubelet stand-in must exit 0 (having stopped its pods).
fn stop_kubelet(kubelet: &mut Child) {
    kill(
        Pid::from_raw(i32::try_from(kubelet.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let mut status = None;
    wait_for(
        "the kubelet stand-in to exit",
        Duration::from_secs(40),
        || {
            status = kubelet.try_wait().unwrap();
            status.is_some()
        },
    );
    assert_eq!(status.unwrap().code(), Some(0));
}

fn assert_ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Control-plane nodes cp-1, cp-2, … at 127.0.0.2, 127.0.0.3, … with free etcd ports, and
/// what the test started on them (stopped first when the test ends, also on panic).
struct Cluster {
    processes: Processes,
    nodes: Vec<Node>,
    /// [`etcd::PORTS_ENV`] for every node.
    ports: String,
    /// Each node's etcd client URL.
    endpoints: Vec<String>,
    /// Each node's etcd peer URL.
    peer_urls: Vec<String>,
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    fn new(count: u8) -> Self {
        require_etcd();
        let nodes: Vec<Node> = (0..count)
            .map(|i| {
                let name: &'static str = ["cp-1", "cp-2", "cp-3"][usize::from(i)];
                Node::new(name, &format!("127.0.0.{}", i + 2))
            })
            .collect();
        let ips: Vec<IpAddr> = nodes.iter().map(|n| n.ip).collect();
        let mut taken = Vec::new();
        for _ in 0..3 * nodes.len() {
            let port = free_port(&ips, &taken);
            taken.push(port);
        }
        let ports = nodes
            .iter()
            .zip(taken.chunks(3))
            .map(|(node, p)| format!("{}={}:{}:{}", node.ip, p[0], p[1], p[2]))
            .collect::<Vec<_>>()
            .join(",");
        let endpoints = nodes
            .iter()
            .zip(taken.chunks(3))
            .map(|(node, p)| format!("https://{}:{}", node.ip, p[0]))
            .collect();
        let peer_urls = nodes
            .iter()
            .zip(taken.chunks(3))
            .map(|(node, p)| format!("https://{}:{}", node.ip, p[1]))
            .collect();
        Self {
            processes: Processes::default(),
            nodes,
            ports,
            endpoints,
            peer_urls,
            rt: runtime(),
        }
    }

    /// `kubeadm init` on cp-1; its output.
    fn init(&self) -> String {
        let first = &self.nodes[0];
        std::fs::write(first.path("init.json"), init_config(first)).unwrap();
        let init = first.path("init.json");
        assert_ok(&first.kubeadm(&self.ports, &["init", "--config", init.to_str().unwrap()]))
    }

    /// `kubeadm join` of node `i` as a control plane, given the shared files; its output.
    fn join(&self, i: usize) -> String {
        let (first, node) = (&self.nodes[0], &self.nodes[i]);
        copy_shared_files(first, node);
        let ca_hash = pki::ca_cert_hash(
            &std::fs::read_to_string(first.path("etc/kubernetes/pki/ca.crt")).unwrap(),
        )
        .unwrap();
        std::fs::write(node.path("join.json"), join_config(node, first, &ca_hash)).unwrap();
        let join = node.path("join.json");
        assert_ok(&node.kubeadm(&self.ports, &["join", "--config", join.to_str().unwrap()]))
    }

    fn start_kubelet(&mut self, i: usize) -> Lines {
        self.nodes[i].start_kubelet(&mut self.processes)
    }

    /// Starts node `i`'s kubelet before its `kubeadm join`, as hawser's supervisor has it
    /// running (here with a first configuration instead of restarts until kubeadm writes one).
    fn start_kubelet_before_join(&mut self, i: usize) -> Lines {
        let node = &self.nodes[i];
        let config = node.path("var/lib/kubelet/config.yaml");
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\n",
                node.path("etc/kubernetes/manifests").display()
            ),
        )
        .unwrap();
        let kubeconfig = node.path("etc/kubernetes/kubelet.conf");
        std::fs::create_dir_all(kubeconfig.parent().unwrap()).unwrap();
        std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
        self.start_kubelet(i)
    }

    fn put(&self, i: usize, key: &str, value: &str) -> bool {
        put(&self.rt, &self.nodes[i], &self.endpoints[i], key, value)
    }

    fn get(&self, i: usize, key: &str) -> Option<String> {
        get(&self.rt, &self.nodes[i], &self.endpoints[i], key)
    }

    /// Waits until node `i` lists `count` members, all started (named).
    fn wait_for_started_members(&self, i: usize, count: usize) {
        wait_for(
            &format!("{count} started members"),
            Duration::from_secs(60),
            || {
                let listed = members(&self.rt, &self.nodes[i], &self.endpoints[i]);
                listed.len() == count && listed.iter().all(|(name, _)| !name.is_empty())
            },
        );
    }
}

#[test]
fn kubeadm_init_makes_kubeadms_etcd_certificates_and_manifest() {
    let cluster = Cluster::new(1);
    let first = &cluster.nodes[0];
    let out = cluster.init();
    assert!(out.contains("stacked etcd: member cp-1"), "{out}");
    let (cn, sans, server, client) = describe(first, "etcd/server.crt");
    assert_eq!(cn, "cp-1");
    assert!(server && client, "etcd/server is for server and client use");
    for san in ["localhost", "cp-1", "127.0.0.2", "127.0.0.1", "::1"] {
        assert!(sans.contains(&san.to_owned()), "{san} not in {sans:?}");
    }
    let (cn, sans, server, client) = describe(first, "etcd/peer.crt");
    assert_eq!(cn, "cp-1");
    assert!(server && client && sans.contains(&"127.0.0.2".to_owned()));
    for (rel, expected_cn) in [
        (
            "etcd/healthcheck-client.crt",
            "kube-etcd-healthcheck-client",
        ),
        ("apiserver-etcd-client.crt", "kube-apiserver-etcd-client"),
    ] {
        let (cn, sans, server, client) = describe(first, rel);
        assert_eq!(cn, expected_cn);
        assert!(
            client && !server && sans.is_empty(),
            "{rel}: a client certificate"
        );
    }
    for key in [
        "etcd/server.key",
        "etcd/peer.key",
        "apiserver-etcd-client.key",
    ] {
        let mode = std::fs::metadata(first.path(&format!("etc/kubernetes/pki/{key}")))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600,
            "{key}"
        );
    }
    let command = manifest_command(first);
    let client_port = cluster.endpoints[0].replace("https://127.0.0.2:", "");
    assert!(
        command.contains(&format!(
            "--listen-client-urls=https://127.0.0.1:{client_port},https://127.0.0.2:{client_port}"
        )),
        "{command:?}"
    );
    for flag in [
        "--initial-cluster=cp-1=https://127.0.0.2:".to_owned(),
        "--initial-cluster-state=new".to_owned(),
        format!("--data-dir={}", first.data_dir()),
        "--client-cert-auth=true".to_owned(),
        "--peer-client-cert-auth=true".to_owned(),
        "--name=cp-1".to_owned(),
    ] {
        assert!(
            command.iter().any(|c| c.starts_with(&flag)),
            "{flag} not in {command:?}"
        );
    }
    let kubelet_config: Value = serde_norway::from_str(
        &std::fs::read_to_string(first.path("var/lib/kubelet/config.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        kubelet_config["staticPodPath"],
        first.path("etc/kubernetes/manifests").display().to_string()
    );
}

#[test]
fn the_kubelet_runs_etcd_restarts_it_when_killed_and_stops_it() {
    let mut cluster = Cluster::new(1);
    cluster.init();
    let log = cluster.start_kubelet(0);
    // A one-member etcd over TLS with the apiserver-etcd-client certificate.
    wait_for("etcd to take a write", Duration::from_secs(60), || {
        cluster.put(0, "/hawser/key", "kept")
    });

    // Killed, it is started again at once (the first crash-loop restart) with its data.
    let first = &cluster.nodes[0];
    let killed = first.etcd_pids();
    assert_eq!(killed.len(), 1, "{killed:?}");
    kill(Pid::from_raw(killed[0]), Signal::SIGKILL).unwrap();
    wait_for(
        "the kubelet to start etcd again",
        Duration::from_secs(30),
        || {
            let now = first.etcd_pids();
            now.len() == 1 && now != killed
        },
    );
    wait_for(
        "the restarted etcd to serve",
        Duration::from_secs(60),
        || cluster.get(0, "/hawser/key").as_deref() == Some("kept"),
    );
    assert!(
        log.text().contains("killed by signal 9; restarting in 0 s"),
        "{}",
        log.text()
    );

    // Its manifest removed, it is stopped; put back, started again.
    let manifest = first.path("etc/kubernetes/manifests/etcd.yaml");
    let text = std::fs::read(&manifest).unwrap();
    std::fs::remove_file(&manifest).unwrap();
    wait_for(
        "etcd to stop with its manifest gone",
        Duration::from_secs(30),
        || first.etcd_pids().is_empty(),
    );
    assert!(log.text().contains("its manifest was removed"));
    std::fs::write(&manifest, text).unwrap();
    wait_for("etcd to serve again", Duration::from_secs(60), || {
        cluster.get(0, "/hawser/key").as_deref() == Some("kept")
    });

    // A kubelet that dies takes its pods' processes with it (they cannot be adopted as
    // containers are), and the kubelet started next (by hawser's supervisor) runs them again.
    let kubelet = &mut cluster.processes.kubelets[0];
    kubelet.kill().unwrap();
    kubelet.wait().unwrap();
    wait_for(
        "etcd to stop with its kubelet killed",
        Duration::from_secs(30),
        || cluster.nodes[0].etcd_pids().is_empty(),
    );
    let log = cluster.start_kubelet(0);
    wait_for(
        "etcd to serve under a new kubelet",
        Duration::from_secs(60),
        || cluster.get(0, "/hawser/key").as_deref() == Some("kept"),
    );

    // SIGTERM to the kubelet stand-in stops its pods, and it exits 0.
    stop_kubelet(cluster.processes.kubelets.last_mut().unwrap());
    assert!(
        cluster.nodes[0].etcd_pids().is_empty(),
        "etcd outlived its kubelet"
    );
    for line in log.all() {
        assert!(line.contains("kubelet STAND-IN (not Kubernetes)"), "{line}");
    }
    assert!(
        log.text().contains(&format!(
            "{}: kube-system/etcd-cp-1: started pid",
            static_pods::POD_LABEL
        )),
        "{}",
        log.text()
    );
}

#[test]
fn a_second_control_plane_joins_etcd_and_a_retried_join_adds_no_member() {
    let mut cluster = Cluster::new(2);
    cluster.init();
    cluster.start_kubelet(0);
    wait_for(
        "the first etcd to take a write",
        Duration::from_secs(60),
        || cluster.put(0, "/hawser/first", "one"),
    );

    // A join interrupted after MemberAdd (a power cut before the member started): the member
    // is listed, never started, and the cluster has lost its quorum until it runs.
    let interrupted = cluster.rt.block_on(async {
        let mut client = cluster.nodes[0]
            .client(&cluster.endpoints[0])
            .await
            .unwrap();
        client
            .member_add([cluster.peer_urls[1].as_str()], None)
            .await
            .unwrap();
        client.member_list().await.unwrap().members().len()
    });
    assert_eq!(interrupted, 2);

    // The join on the next boot finds the member listed, adds none, and completes once the
    // kubelet runs it.
    cluster.start_kubelet_before_join(1);
    let out = cluster.join(1);
    assert!(out.contains("already listed in (a retried join)"), "{out}");
    let second = &cluster.nodes[1];
    let command = manifest_command(second);
    let initial_cluster = command
        .iter()
        .find(|f| f.starts_with("--initial-cluster="))
        .unwrap();
    assert!(
        initial_cluster.contains("cp-1=https://127.0.0.2:")
            && initial_cluster.contains("cp-2=https://127.0.0.3:"),
        "{initial_cluster}"
    );
    assert!(command.contains(&"--initial-cluster-state=existing".to_owned()));
    let (cn, sans, _, _) = describe(second, "etcd/server.crt");
    assert_eq!(cn, "cp-2");
    assert!(sans.contains(&"127.0.0.3".to_owned()), "{sans:?}");
    // As kubeadm's control-plane join: an admin kubeconfig signed by the cluster CA, with
    // which `token create` works on this control plane too (its join service issues tokens).
    let admin = second.path("etc/kubernetes/admin.conf");
    let info = hawser_standin::pki::read_cluster_info(&admin).unwrap();
    let ca = std::fs::read_to_string(second.path("etc/kubernetes/pki/ca.crt")).unwrap();
    assert_eq!(info.ca_pem.unwrap().trim(), ca.trim());
    let out = second.kubeadm(
        "",
        &[
            "token",
            "create",
            "--kubeconfig",
            admin.to_str().unwrap(),
            "--print-join-command",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    cluster.wait_for_started_members(1, 2);
    // Joined again with its data (kubeadm's marker lost): still no second member.
    let out = cluster.join(1);
    assert!(out.contains("already listed in (a retried join)"), "{out}");
    assert_eq!(
        members(&cluster.rt, &cluster.nodes[0], &cluster.endpoints[0]).len(),
        2
    );
    wait_for("a write on the first", Duration::from_secs(30), || {
        cluster.put(0, "/hawser/shared", "written on cp-1")
    });
    wait_for(
        "the write read on the second",
        Duration::from_secs(30),
        || cluster.get(1, "/hawser/shared").as_deref() == Some("written on cp-1"),
    );
    assert_eq!(cluster.get(1, "/hawser/first").as_deref(), Some("one"));
}

#[test]
fn a_control_plane_whose_etcd_data_is_gone_rejoins_as_a_new_member() {
    let mut cluster = Cluster::new(3);
    cluster.init();
    cluster.start_kubelet(0);
    wait_for(
        "the first etcd to take a write",
        Duration::from_secs(60),
        || cluster.put(0, "/hawser/shared", "written on cp-1"),
    );
    for i in 1..3 {
        cluster.start_kubelet_before_join(i);
        let out = cluster.join(i);
        assert!(out.contains("added to the cluster through"), "{out}");
        cluster.wait_for_started_members(0, i + 1);
    }
    wait_for("the third to read the key", Duration::from_secs(30), || {
        cluster.get(2, "/hawser/shared").as_deref() == Some("written on cp-1")
    });

    // cp-3's state disk is formatted again: its etcd data and /etc/kubernetes are gone. Its old
    // member, which had run, is replaced (a member cannot rejoin without its state); two of
    // three members keep the quorum throughout.
    stop_kubelet(cluster.processes.kubelets.last_mut().unwrap());
    let third = &cluster.nodes[2];
    assert!(third.etcd_pids().is_empty(), "etcd outlived its kubelet");
    std::fs::remove_dir_all(third.path("var/lib")).unwrap();
    std::fs::remove_dir_all(third.path("etc/kubernetes")).unwrap();
    cluster.start_kubelet_before_join(2);
    let out = cluster.join(2);
    assert!(out.contains("replaced its old member"), "{out}");
    cluster.wait_for_started_members(0, 3);
    wait_for(
        "the re-formatted third to read the key",
        Duration::from_secs(60),
        || cluster.get(2, "/hawser/shared").as_deref() == Some("written on cp-1"),
    );
}

#[test]
fn a_join_without_a_reachable_member_fails_naming_it() {
    let first = Node::new("cp-1", "127.0.0.2");
    let second = Node::new("cp-2", "127.0.0.3");
    let port = free_port(&[first.ip], &[]);
    let ports = format!("{}={port}:{}:{}", first.ip, port + 1, port + 2);
    let pki_dir = second.path("etc/kubernetes/pki");
    pki::Ca::load_or_create(&pki_dir).unwrap();
    pki::create_shared_control_plane_files(&pki_dir).unwrap();
    std::fs::write(
        second.path("join.json"),
        join_config(&second, &first, &format!("sha256:{}", "0".repeat(64))),
    )
    .unwrap();
    let join = second.path("join.json");
    let out = second.kubeadm(&ports, &["join", "--config", join.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("the etcd member at https://127.0.0.2:{port}"))
            && stderr.contains("Connection refused"),
        "{stderr}"
    );
    assert!(!second.path("etc/kubernetes/manifests/etcd.yaml").exists());
}

#[test]
fn the_kubelet_refuses_manifests_it_cannot_run_and_runs_the_others() {
    let node = Node::new("node-1", "127.0.0.2");
    let manifests = node.path("etc/kubernetes/manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::create_dir_all(node.path("var/lib/kubelet")).unwrap();
    std::fs::write(
        node.path("var/lib/kubelet/config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\n",
            manifests.display()
        ),
    )
    .unwrap();
    std::fs::write(
        node.path("etc/kubernetes/kubelet.conf"),
        "apiVersion: v1\nkind: Config\n",
    )
    .unwrap();
    let marker = node.path("sleeper-ran");
    std::fs::write(
        manifests.join("sleeper.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: sleeper, namespace: kube-system}}\n\
             spec:\n  containers:\n  - name: sleeper\n    image: debian\n    command: [sh, -c]\n    \
             args: ['touch {} && exec sleep 300']\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::write(
        manifests.join("image-only.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: web, image: nginx}]}\n",
    )
    .unwrap();
    std::fs::write(
        manifests.join("two.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: two}\nspec: {containers: [{name: a, command: [sleep, '1']}, {name: b, command: [sleep, '1']}]}\n",
    )
    .unwrap();
    std::fs::write(manifests.join(".hidden.yaml"), "not a pod").unwrap();
    let mut processes = Processes::default();
    let log = node.start_kubelet(&mut processes);
    wait_for("the runnable pod to run", Duration::from_secs(20), || {
        marker.exists()
    });
    wait_for("both refusals", Duration::from_secs(10), || {
        log.text().matches("refusing the manifest").count() == 2
    });
    let text = log.text();
    assert!(text.contains("image-only.yaml: container \"web\" has no command: its entrypoint is in the image \"nginx\""), "{text}");
    assert!(text.contains("two.yaml: it has 2 containers"), "{text}");
    assert!(!text.contains(".hidden.yaml"), "{text}");
    let pid: i32 = text
        .split("kube-system/sleeper-node-1: started pid ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no start line: {text}"));
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    // The pod's output goes where the kubelet keeps container logs.
    assert!(
        node.path("var/log/pods/kube-system_sleeper-node-1/sleeper/0.log")
            .is_file()
    );

    let kubelet = &mut processes.kubelets[0];
    kill(
        Pid::from_raw(i32::try_from(kubelet.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let mut status = None;
    wait_for("the kubelet to exit", Duration::from_secs(40), || {
        status = kubelet.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(0));
    let text = log.text();
    assert!(
        text.contains("kube-system/sleeper-node-1: stopping pid"),
        "{text}"
    );
    assert!(text.contains("killed by signal 15"), "{text}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the pod outlived the kubelet"
    );
    for line in log.all() {
        assert!(line.contains("kubelet STAND-IN (not Kubernetes)"), "{line}");
    }
}
