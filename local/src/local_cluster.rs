//! A local cluster of QEMU nodes: its layout on disk, what each node's console says about it,
//! and the console filter. `hawser local up` writes [`StatusFile`] as the nodes progress,
//! `hawser local status` reads it, `hawser local down` powers the nodes off in [`Layout`]'s
//! reverse order (workers before control planes).
//!
//! A node's state is read off its serial console, which PID 1 writes for exactly this purpose:
//! the init server's "waiting" line, the `HAWSER_JOIN_REPORT` (attested, key received, locked to
//! a cluster), the pivot into the rootfs, kubeadm's outcome, the mesh address, and the last
//! warning or error. Nothing here trusts those lines for security: `local up` verifies the
//! signed boot report of each node on its own.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use hawser_attestation::report::{JOIN_REPORT_MARKER, JoinReport};
use serde::{Deserialize, Serialize};

/// What a node is in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    ControlPlane,
    Worker,
}

impl Role {
    /// The value of the node's fw_cfg `role` key.
    pub fn fw_cfg(self) -> &'static str {
        match self {
            Role::ControlPlane => "control-plane",
            Role::Worker => "worker",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.fw_cfg())
    }
}

/// One node of the layout: its name (also its directory under the cluster's) and role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub name: String,
    pub role: Role,
}

/// The nodes of a local cluster, fixed when it is created: the first is the control plane
/// `hawser init` initializes, then the other control planes, then the workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub nodes: Vec<NodeSpec>,
}

/// The file in the cluster directory that keeps the [`Layout`].
pub const LAYOUT_FILE: &str = "layout.json";

impl Layout {
    /// `nodes` nodes, `control_planes` of them control planes (at least one, at most all).
    pub fn new(nodes: usize, control_planes: usize) -> anyhow::Result<Self> {
        if control_planes == 0 {
            bail!("a cluster needs at least one control plane (--control-planes 1 or more)");
        }
        if control_planes > nodes {
            bail!(
                "--control-planes {control_planes} is more than --nodes {nodes}: every control \
                 plane is a node"
            );
        }
        let nodes = (1..=nodes)
            .map(|i| NodeSpec {
                name: format!("node-{i}"),
                role: if i <= control_planes {
                    Role::ControlPlane
                } else {
                    Role::Worker
                },
            })
            .collect();
        Ok(Layout { nodes })
    }

    /// The position of the node called `name` (its LAN address is `lan::host` of it).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    pub fn control_planes(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::ControlPlane)
            .count()
    }

    /// Reads `<dir>/layout.json`, or `None` if there is no cluster in `dir`.
    pub fn read(dir: &Path) -> anyhow::Result<Option<Self>> {
        let path = dir.join(LAYOUT_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not a cluster layout (start over with `hawser local up --fresh`)",
                    path.display()
                )
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(LAYOUT_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// How far a node got on this boot, in boot order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Not running.
    Off,
    /// QEMU started; PID 1 has not said more yet.
    Booting,
    /// The init server waits for the admin's `hawser init` or `hawser recover`.
    WaitingForAdmin,
    /// Attested and got its state disk key; locked to its cluster (PCR 15).
    Attested,
    /// Switched into the verified rootfs.
    Pivoted,
    /// kubeadm ran (on this boot or an earlier one).
    KubeadmDone,
    /// PID 1 stopped on a fatal error.
    Failed,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Off => "off",
            Stage::Booting => "booting",
            Stage::WaitingForAdmin => "waiting for init/recover",
            Stage::Attested => "attested, key received",
            Stage::Pivoted => "pivoted",
            Stage::KubeadmDone => "kubeadm done",
            Stage::Failed => "FAILED",
        })
    }
}

/// What a node's console says about it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    pub stage: Option<Stage>,
    /// The cluster ID of the node's join report (what its PCR 15 is locked to).
    pub cluster_id: Option<String>,
    /// The node's VPN address, once the mesh is up.
    pub vpn_ip: Option<String>,
    /// The last warning, error, failed kubeadm attempt or `FATAL` PID 1 printed (not its
    /// services' output) since the node last got further.
    pub last_error: Option<String>,
}

impl Observation {
    /// The Kubernetes node IP of the cluster's node `i`: its VPN address once its mesh is up,
    /// else its LAN address.
    pub fn node_ip(&self, i: usize) -> String {
        self.vpn_ip.clone().unwrap_or_else(|| crate::lan::host(i))
    }
}

/// Reads a node's state off its console lines (see the module docs).
pub fn observe(lines: &[String]) -> Observation {
    let mut seen = Observation {
        stage: Some(Stage::Booting),
        ..Observation::default()
    };
    // A warning counts until the node gets further: what `status` shows is why a node is
    // stuck, not a hiccup it has since overcome (the kubelet's restarts before kubeadm wrote its
    // configuration, say).
    let advance = |seen: &mut Observation, stage: Stage| {
        if seen.stage.is_none_or(|s| s < stage) {
            seen.stage = Some(stage);
            seen.last_error = None;
        }
    };
    for line in lines {
        // The reports PID 1 prints for machines: a marker, then JSON.
        if line.contains(JOIN_REPORT_MARKER) {
            advance(&mut seen, Stage::Attested);
            if let Some(Ok(report)) = JoinReport::find_in_console(line) {
                seen.cluster_id = Some(report.cluster_id.to_string());
            }
            continue;
        }
        if let Some(attempt) = kubeadm_failure(line) {
            seen.last_error = Some(attempt);
            continue;
        }
        let Some(text) = pid1_text(line) else {
            continue;
        };
        if text.contains("init server listening on") {
            advance(&mut seen, Stage::WaitingForAdmin);
        } else if text.contains("switched into the rootfs") {
            advance(&mut seen, Stage::Pivoted);
        } else if KUBEADM_DONE.iter().any(|p| text.starts_with(p))
            || text.ends_with("kubeadm does not run again")
        {
            advance(&mut seen, Stage::KubeadmDone);
        } else if let Some(rest) = text.strip_prefix("mesh up: ") {
            seen.vpn_ip = rest
                .split_once(" is ")
                .and_then(|(_, r)| r.split('/').next())
                .map(str::to_owned);
        }
        if text.starts_with("FATAL: ") {
            seen.stage = Some(Stage::Failed);
            seen.last_error = Some(text.to_owned());
        } else if text.starts_with("warning: ") || text.starts_with("error: ") {
            seen.last_error = Some(text.to_owned());
        }
    }
    seen
}

/// PID 1's kubeadm status line (`HAWSER_KUBEADM_STATUS {json}`, after each attempt) of a
/// failed attempt, as the node's last error.
fn kubeadm_failure(line: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Status {
        verb: String,
        attempts: u32,
        last_error: Option<String>,
    }
    let (_, json) = line.split_once(KUBEADM_STATUS_MARKER)?;
    let status: Status = serde_json::from_str(json.trim()).ok()?;
    let error = status.last_error?;
    Some(format!(
        "kubeadm {} attempt {} failed (PID 1 tries again): {error}",
        status.verb, status.attempts
    ))
}

/// How PID 1's lines saying kubeadm succeeded begin (on this boot: the once-job's line and
/// the verb's); other lines may mention kubeadm succeeding (a control plane keeping its secrets
/// "until kubeadm succeeded") and do not count.
const KUBEADM_DONE: [&str; 3] = [
    "kubeadm succeeded in ",
    "kubeadm join succeeded",
    "kubeadm init succeeded",
];

/// What PID 1 prints before its kubeadm status.
const KUBEADM_STATUS_MARKER: &str = "HAWSER_KUBEADM_STATUS ";

/// The text PID 1 printed on a console line (after the kernel's timestamp and `hawser: `), or
/// `None` for a line PID 1 did not print or one of its services' (`[name] …`) output.
fn pid1_text(line: &str) -> Option<&str> {
    let (_, text) = line.split_once("hawser: ")?;
    (!text.starts_with('[')).then_some(text)
}

/// Whether `local up` echoes a console line: everything but the supervised services' routine
/// output (containerd's, the kubelet's, the join service's info and debug lines), which stays
/// in the node's console log (`hawser local status` names it).
pub fn show_on_console(line: &str) -> bool {
    let Some((_, text)) = line.split_once("hawser: [") else {
        return true;
    };
    const ROUTINE: [&str; 6] = [
        "level=info",
        "level=debug",
        "level=trace",
        " INFO ",
        " DEBUG ",
        " TRACE ",
    ];
    !ROUTINE.iter().any(|r| text.contains(r))
}

/// What `local up` echoes of a console line, if anything: [`show_on_console`]'s choice, with
/// PID 1's machine-readable reports (`HAWSER_BOOT_REPORT {json}`, the base64 event log)
/// shortened to their name and size.
pub fn echo_text(line: &str) -> Option<String> {
    if !show_on_console(line) {
        return None;
    }
    match line.split_once(' ') {
        Some((marker, rest)) if marker.starts_with("HAWSER_") && rest.len() > 100 => Some(format!(
            "{marker} … ({} bytes; whole in the console log)",
            rest.len()
        )),
        _ => Some(line.to_owned()),
    }
}

/// One node's line in `hawser local status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: String,
    pub role: Role,
    #[serde(flatten)]
    pub seen: Observation,
    /// Whether `local up` verified the node's signed boot report (quote, nonce, PCR 15).
    pub quote_verified: bool,
    pub console_log: PathBuf,
    /// Kubernetes' view of the node (`kubectl get nodes` through the forwarded API server,
    /// matched by the node's address), when it was last asked; `None` with stand-ins, before
    /// the API server answered, or while the node is not registered.
    #[serde(default)]
    pub kubernetes: Option<crate::kubectl::KubeNode>,
    /// The release (node image) it booted last, as the cluster's join services name it.
    #[serde(default)]
    pub release: Option<String>,
}

/// What `hawser local up` writes for `hawser local status` (and keeps current while it runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusFile {
    /// The `hawser local up` process that owns the nodes.
    pub pid: u32,
    /// The cluster ID `hawser init` made (the admin's `cluster.json`), once there is one.
    pub cluster_id: Option<String>,
    pub nodes: Vec<NodeStatus>,
}

/// The status file's name in the cluster directory.
pub const STATUS_FILE: &str = "status.json";

impl StatusFile {
    pub fn read(dir: &Path) -> anyhow::Result<Option<Self>> {
        let path = dir.join(STATUS_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                Ok(Some(serde_json::from_str(&text).with_context(|| {
                    format!("{} is not a status file", path.display())
                })?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the file atomically (a reader never sees half of it).
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(STATUS_FILE);
        // A temporary file per writing thread (`local up` writes from several), renamed into
        // place: a reader sees one whole status.
        let thread = format!("{:?}", std::thread::current().id());
        let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
        let tmp = dir.join(format!("{STATUS_FILE}.{thread}.tmp"));
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The status as a table: one line per node, then each node's last warning or error.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<8} {:<14} {:<26} {:<6} {:<15} {:<9} {:<8} {:<20} {}\n",
            "NODE",
            "ROLE",
            "STATE",
            "QUOTE",
            "VPN IP",
            "K8S",
            "KUBELET",
            "RELEASE",
            "CLUSTER (PCR 15 lock)"
        );
        for node in &self.nodes {
            let cluster = match (&node.seen.cluster_id, &self.cluster_id) {
                (Some(id), Some(expected)) if id == expected => format!("{}… (this)", &id[..16]),
                (Some(id), Some(_)) => format!("{}… (ANOTHER CLUSTER)", &id[..16.min(id.len())]),
                (Some(id), None) => format!("{}…", &id[..16.min(id.len())]),
                (None, _) => "-".to_owned(),
            };
            let kube = node.kubernetes.as_ref();
            out.push_str(&format!(
                "{:<8} {:<14} {:<26} {:<6} {:<15} {:<9} {:<8} {:<20} {}\n",
                node.name,
                node.role.to_string(),
                node.seen.stage.unwrap_or(Stage::Off).to_string(),
                if node.quote_verified { "ok" } else { "-" },
                node.seen.vpn_ip.as_deref().unwrap_or("-"),
                kube.map_or("-", |k| if k.ready { "Ready" } else { "NotReady" }),
                kube.map_or("-", |k| k.kubelet_version.as_str()),
                node.release.as_deref().unwrap_or("-"),
                cluster
            ));
        }
        for node in &self.nodes {
            if let Some(error) = &node.seen.last_error {
                out.push_str(&format!("{}: last said: {error}\n", node.name));
            }
        }
        for node in &self.nodes {
            out.push_str(&format!(
                "{}: console log {}\n",
                node.name,
                node.console_log.display()
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_layout_puts_the_control_planes_first_and_refuses_impossible_counts() {
        let layout = Layout::new(3, 2).unwrap();
        let roles: Vec<_> = layout
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.role))
            .collect();
        assert_eq!(
            roles,
            [
                ("node-1", Role::ControlPlane),
                ("node-2", Role::ControlPlane),
                ("node-3", Role::Worker)
            ]
        );
        assert_eq!(layout.control_planes(), 2);
        let none = Layout::new(2, 0).unwrap_err().to_string();
        assert!(none.contains("at least one control plane"), "{none}");
        let more = Layout::new(1, 2).unwrap_err().to_string();
        assert!(more.contains("more than --nodes 1"), "{more}");
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Layout::read(dir.path()).unwrap(), None);
        layout.write(dir.path()).unwrap();
        assert_eq!(Layout::read(dir.path()).unwrap(), Some(layout));
        std::fs::write(dir.path().join(LAYOUT_FILE), "{").unwrap();
        let broken = format!("{:#}", Layout::read(dir.path()).unwrap_err());
        assert!(broken.contains("--fresh"), "{broken}");
    }

    #[test]
    fn a_nodes_stage_follows_its_console() {
        let console = lines(
            "BdsDxe: loading Boot0001\n\
             [   10.1] hawser: loaded 27 kernel modules\n\
             [   10.7] hawser: init server listening on 0.0.0.0:9000 (aTLS): waiting for `hawser init` or `hawser recover`\n\
             [   11.2] hawser: warning: Init refused: init secret does not match the node's init secret hash; the node is not locked and keeps waiting",
        );
        let seen = observe(&console);
        assert_eq!(seen.stage, Some(Stage::WaitingForAdmin));
        assert!(
            seen.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("warning: Init refused")),
            "{seen:?}"
        );
        let mut more = console.clone();
        more.push(format!(
            "{JOIN_REPORT_MARKER} {{\"disk_uuid\":\"d\",\"rpc\":\"Init\",\"via\":\"admin\",\"attempts\":1,\"key_fingerprint\":\"f\",\"cluster_id\":\"{}\",\"pcr15\":\"p\"}}",
            "c".repeat(64)
        ));
        assert_eq!(observe(&more).stage, Some(Stage::Attested));
        assert_eq!(observe(&more).cluster_id, Some("c".repeat(64)));
        more.extend(lines(
            "[   15.2] hawser: measured leave-initrd into PCR 11 and switched into the rootfs\n\
             [   20.2] hawser: [containerd] time=\"x\" level=error msg=\"failed to load cni\"\n\
             [   22.0] hawser: mesh up: node-2 is 10.123.0.3/16 on hawser0 (MTU 1420, key k), 1 peers at registry version 4\n\
             [   22.5] hawser: kept the cluster's master secret on the encrypted state disk (/var/lib/hawser/cluster): this control plane runs the cluster's join service once kubeadm succeeded, and on every boot\n\
             [   22.6] hawser: running kubeadm once: /usr/bin/kubeadm join --config /run/hawser/kubeadm.yaml",
        ));
        // A line that mentions kubeadm succeeding is not kubeadm's success.
        assert_eq!(observe(&more).stage, Some(Stage::Pivoted));
        more.extend(lines(
            "[   23.1] hawser: kubeadm succeeded in 1.2 s; marker /var/lib/hawser/kubeadm.done written",
        ));
        let seen = observe(&more);
        assert_eq!(seen.stage, Some(Stage::KubeadmDone));
        assert_eq!(seen.vpn_ip.as_deref(), Some("10.123.0.3"));
        // The refused Init was overcome: the node got further.
        assert_eq!(seen.last_error, None);
        more.push("[   24.0] hawser: warning: service kubelet exited; restarting".to_owned());
        more.push("[   24.1] hawser: [kubelet] error: no API server".to_owned());
        // A service's own output is not PID 1's last word.
        assert_eq!(
            observe(&more).last_error.as_deref(),
            Some("warning: service kubelet exited; restarting")
        );
        more.push("[   30.0] hawser: FATAL: the state disk is not ours".to_owned());
        let seen = observe(&more);
        assert_eq!(seen.stage, Some(Stage::Failed));
        assert_eq!(
            seen.last_error.as_deref(),
            Some("FATAL: the state disk is not ours")
        );
        assert_eq!(observe(&[]).stage, Some(Stage::Booting));
        let retried = lines(
            "HAWSER_KUBEADM_STATUS {\"state\":\"pending\",\"verb\":\"join\",\"attempts\":2,\"last_error\":\"discovery: connection refused\"}",
        );
        assert_eq!(
            observe(&retried).last_error.as_deref(),
            Some(
                "kubeadm join attempt 2 failed (PID 1 tries again): discovery: connection refused"
            )
        );
    }

    #[test]
    fn the_console_echo_drops_the_services_routine_output_only() {
        for shown in [
            "[   10.7] hawser: init server listening on 0.0.0.0:9000",
            "[   21.7] hawser: [containerd] time=\"t\" level=error msg=\"failed to load cni\"",
            "[   28.8] hawser: [hawser-joind] 2026-11-24T17:06:08Z  WARN hawser_joind: slow",
            "[   29.2] hawser: [hawser-joind] listening on 0.0.0.0:7000",
            "BdsDxe: loading Boot0001",
        ] {
            assert!(show_on_console(shown), "{shown}");
        }
        for hidden in [
            "[   21.1] hawser: [containerd] time=\"t\" level=info msg=\"loading plugin\"",
            "[   23.9] hawser: [kubelet]  INFO kubelet STAND-IN (not Kubernetes), running",
            "[   28.8] hawser: [hawser-joind] 2026-11-24T17:06:08Z  INFO hawser_joind: imported",
        ] {
            assert!(!show_on_console(hidden), "{hidden}");
        }
    }

    #[test]
    fn the_echo_shortens_the_machine_reports() {
        let long = format!("HAWSER_EVENT_LOG {}", "A".repeat(9582));
        assert_eq!(
            echo_text(&long).as_deref(),
            Some("HAWSER_EVENT_LOG … (9582 bytes; whole in the console log)")
        );
        let short = "HAWSER_KUBEADM_STATUS {\"state\":\"done\"}";
        assert_eq!(echo_text(short).as_deref(), Some(short));
    }

    #[test]
    fn the_status_table_names_each_nodes_state_and_a_foreign_cluster() {
        let id = "1d4c7b44c584b4927f35d148368557061bdbb6e2dce6c5eb5ec382ab1ae9264a";
        let status = StatusFile {
            pid: 1,
            cluster_id: Some(id.to_owned()),
            nodes: vec![
                NodeStatus {
                    name: "node-1".into(),
                    role: Role::ControlPlane,
                    seen: Observation {
                        stage: Some(Stage::KubeadmDone),
                        cluster_id: Some(id.to_owned()),
                        vpn_ip: None,
                        last_error: None,
                    },
                    quote_verified: true,
                    console_log: "/x/node-1.console.log".into(),
                    kubernetes: Some(crate::kubectl::KubeNode {
                        name: "hawser-1d4c7b44".into(),
                        ready: true,
                        kubelet_version: "v1.20.2".into(),
                        internal_ip: Some("192.168.76.10".into()),
                        not_ready_reason: None,
                    }),
                    release: Some("v2".into()),
                },
                NodeStatus {
                    name: "node-2".into(),
                    role: Role::Worker,
                    seen: Observation {
                        stage: Some(Stage::Attested),
                        cluster_id: Some("ab".repeat(32)),
                        vpn_ip: None,
                        last_error: Some(
                            "warning: the join service at 10.0.2.100:7000 does not answer".into(),
                        ),
                    },
                    quote_verified: false,
                    console_log: "/x/node-2.console.log".into(),
                    kubernetes: None,
                    release: None,
                },
            ],
        };
        let table = status.table();
        assert!(table.contains("kubeadm done"), "{table}");
        let node1 = table.lines().find(|l| l.starts_with("node-1")).unwrap();
        assert!(
            node1.contains("Ready") && node1.contains("v1.20.2") && node1.contains(" v2 "),
            "{table}"
        );
        let node2 = table.lines().find(|l| l.starts_with("node-2")).unwrap();
        assert!(!node2.contains("Ready"), "{table}");
        assert!(table.contains("1d4c7b44c584b492… (this)"), "{table}");
        assert!(table.contains("ANOTHER CLUSTER"), "{table}");
        assert!(
            table.contains("node-2: last said: warning: the join service"),
            "{table}"
        );
        let dir = tempfile::tempdir().unwrap();
        status.write(dir.path()).unwrap();
        assert_eq!(StatusFile::read(dir.path()).unwrap(), Some(status));
    }
}
