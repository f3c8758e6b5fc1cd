//! The `kubelet` stand-in binary: refuses to start without what a kubelet needs, otherwise
//! records its start and runs until SIGTERM, then exits 0.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const KUBELET: &str = env!("CARGO_BIN_EXE_kubelet");
const LABEL: &str = "kubelet STAND-IN (not Kubernetes)";

struct Node {
    root: tempfile::TempDir,
}

impl Node {
    /// A node as `kubeadm join` leaves it: kubelet config and kubeconfig present.
    fn new() -> Self {
        let node = Self {
            root: tempfile::tempdir().unwrap(),
        };
        node.write(
            "var/lib/kubelet/config.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
        );
        node.write(
            "etc/kubernetes/kubelet.conf",
            "apiVersion: v1\nkind: Config\n",
        );
        node
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The flags kubeadm's systemd drop-in passes.
    fn drop_in_args(&self) -> Vec<String> {
        vec![
            format!(
                "--bootstrap-kubeconfig={}",
                self.path("etc/kubernetes/bootstrap-kubelet.conf").display()
            ),
            format!(
                "--kubeconfig={}",
                self.path("etc/kubernetes/kubelet.conf").display()
            ),
            "--config".into(),
            self.path("var/lib/kubelet/config.yaml")
                .display()
                .to_string(),
        ]
    }

    fn command(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(KUBELET);
        cmd.args(args).env("HAWSER_STANDIN_ROOT", self.root.path());
        cmd
    }

    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("var/log/hawser-standin/kubelet.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Runs a start that must be refused; returns its stderr.
    fn refused(&self, args: &[String]) -> String {
        let out = self.command(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        for line in err.lines() {
            assert!(line.starts_with(LABEL), "unlabelled: {line:?}");
        }
        assert!(self.records().is_empty(), "a refused start was recorded");
        err
    }
}

#[test]
fn runs_until_sigterm_then_exits_zero_and_records_start_and_stop() {
    let node = Node::new();
    let socket = node.write("run/containerd/containerd.sock", "");
    node.write(
        "var/lib/kubelet/kubeadm-flags.env",
        &format!(
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix://{} --node-ip=10.42.0.2\"\n",
            socket.display()
        ),
    );
    let mut child = node
        .command(&node.drop_in_args())
        .arg("--hostname-override=node-2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    stdout.read_line(&mut banner).unwrap();
    assert!(banner.starts_with(LABEL), "{banner}");
    assert!(banner.contains("started for node node-2"), "{banner}");
    assert!(banner.contains("waiting for SIGTERM"), "{banner}");

    // Still running: it idles like a kubelet, it does not exit by itself.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the stand-in exited on its own"
    );

    let start = &node.records()[0];
    assert_eq!(start["event"], "start");
    assert_eq!(start["node"], "node-2");
    assert_eq!(
        start["flags"]["node-ip"], "10.42.0.2",
        "kubeadm-flags.env was not read"
    );
    assert_eq!(start["pid"], child.id());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(rest.contains("SIGTERM received, exiting"), "{rest}");
    let records = node.records();
    assert_eq!(records.len(), 2);
    assert_eq!(records[1]["event"], "stop");
    assert_eq!(records[1]["signal"], "SIGTERM");
}

#[test]
fn the_bootstrap_kubeconfig_is_enough_before_tls_bootstrap() {
    let node = Node::new();
    std::fs::remove_file(node.path("etc/kubernetes/kubelet.conf")).unwrap();
    node.write(
        "etc/kubernetes/bootstrap-kubelet.conf",
        "apiVersion: v1\nkind: Config\n",
    );
    let mut child = node
        .command(&node.drop_in_args())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    assert!(banner.contains("bootstrap-kubelet.conf"), "{banner}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_missing_config_is_refused_with_the_path() {
    let node = Node::new();
    std::fs::remove_file(node.path("var/lib/kubelet/config.yaml")).unwrap();
    let err = node.refused(&node.drop_in_args());
    assert!(err.contains("--config"), "{err}");
    assert!(err.contains("var/lib/kubelet/config.yaml"), "{err}");

    let mut no_config = node.drop_in_args();
    no_config.truncate(2);
    assert!(node.refused(&no_config).contains("--config is required"));
}

#[test]
fn a_config_that_is_not_a_kubelet_configuration_is_refused() {
    let node = Node::new();
    node.write(
        "var/lib/kubelet/config.yaml",
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n",
    );
    let err = node.refused(&node.drop_in_args());
    assert!(
        err.contains("not kubelet.config.k8s.io/v1beta1/KubeletConfiguration"),
        "{err}"
    );
}

#[test]
fn no_kubeconfig_at_all_is_refused() {
    let node = Node::new();
    std::fs::remove_file(node.path("etc/kubernetes/kubelet.conf")).unwrap();
    let err = node.refused(&node.drop_in_args());
    assert!(err.contains("no way to reach an API server"), "{err}");
    assert!(err.contains("bootstrap-kubelet.conf"), "{err}");
}

#[test]
fn a_missing_container_runtime_socket_is_refused() {
    let node = Node::new();
    node.write(
        "var/lib/kubelet/kubeadm-flags.env",
        "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///nonexistent/containerd.sock\"\n",
    );
    let err = node.refused(&node.drop_in_args());
    assert!(err.contains("/nonexistent/containerd.sock"), "{err}");
    assert!(err.contains("containerd"), "{err}");
}

#[test]
fn stray_arguments_are_refused() {
    let node = Node::new();
    let mut args = node.drop_in_args();
    args.push("run".into());
    assert!(node.refused(&args).contains("takes only flags"));
}
