//! kubeadm's configuration file: a YAML stream of documents (`---`-separated; each may be
//! written as JSON), decoded strictly against the kubeadm v1beta4 API and validated as kubeadm
//! validates it.
//!
//! Strict means what kubeadm's strict decoding means: an unknown field, a field of the wrong
//! type, an unknown `kind` or `apiVersion` are errors naming the document and the field path.
//! Every problem in the file is reported at once, as kubeadm aggregates its field errors.
//!
//! The documents kubeadm passes through to other components (KubeletConfiguration,
//! KubeProxyConfiguration) are accepted as objects and kept as they are.
//!
//! This module reads the stream and reports problems; [`types`] holds the v1beta4 types as
//! kubeadm defines them, and `checks` the field validation kubeadm applies to them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

mod checks;
pub mod types;

pub use types::*;

use checks::{validate_cluster, validate_init, validate_join};

/// The kubeadm configuration API this stand-in implements.
pub const KUBEADM_API_VERSION: &str = "kubeadm.k8s.io/v1beta4";
/// The kubelet's configuration API, passed through.
pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// kube-proxy's configuration API, passed through.
pub const KUBE_PROXY_API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";

/// Which kubeadm command reads the file: it decides which kinds belong in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Init,
    Join,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Init => "kubeadm init",
            Phase::Join => "kubeadm join",
        })
    }
}

/// One thing wrong with the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based document number, and its kind when it has a readable one.
    pub document: Option<(usize, Option<String>)>,
    /// The field path inside the document (`nodeRegistration.taints[0].effect`).
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.document {
            Some((n, Some(kind))) => write!(f, "document {n} ({kind}): ")?,
            Some((n, None)) => write!(f, "document {n}: ")?,
            None => {}
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the kubeadm configuration {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read and is wrong; every problem found is listed.
    #[error("the kubeadm configuration {path} is invalid ({} problem{}):\n  {}",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

/// One decoded document, as written (nulls removed), for the record.
#[derive(Debug, Clone)]
pub struct Document {
    pub api_version: String,
    pub kind: String,
    pub body: Value,
}

/// A validated configuration.
#[derive(Debug, Clone, Default)]
pub struct KubeadmConfig {
    pub init: Option<InitConfiguration>,
    pub cluster: Option<ClusterConfiguration>,
    pub join: Option<JoinConfiguration>,
    /// KubeletConfiguration, passed through.
    pub kubelet: Option<Value>,
    /// KubeProxyConfiguration, passed through.
    pub kube_proxy: Option<Value>,
    pub documents: Vec<Document>,
}

/// Reads and validates the file `kubeadm <phase> --config <path>` would read.
pub fn load(path: &Path, phase: Phase) -> Result<KubeadmConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, phase).map_err(|problems| ConfigError::Invalid {
        path: path.to_owned(),
        problems,
    })
}

/// Decodes and validates a configuration text for `phase`; `Err` lists every problem.
pub fn parse(text: &str, phase: Phase) -> Result<KubeadmConfig, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut config = KubeadmConfig::default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut index = 0;
    for raw in serde_norway::Deserializer::from_str(text) {
        index += 1;
        let doc_problem = |kind: Option<&str>, field: Option<String>, message: String| Problem {
            document: Some((index, kind.map(str::to_owned))),
            field,
            message,
        };
        let value = match Value::deserialize(raw) {
            Ok(v) => v,
            Err(e) => {
                problems.push(doc_problem(None, None, format!("not valid YAML: {e}")));
                // The stream cannot be resumed after a syntax error (the parser would report
                // it again forever).
                break;
            }
        };
        let mut object = match value {
            // An empty document (`---` followed by nothing) is allowed, as in kubeadm.
            Value::Null => continue,
            Value::Object(map) => map,
            Value::Array(_) => {
                problems.push(doc_problem(
                    None,
                    None,
                    "is a list, not a configuration object: write one object per document, \
                     separated by ---"
                        .into(),
                ));
                continue;
            }
            other => {
                problems.push(doc_problem(
                    None,
                    None,
                    format!("is {other}, not a configuration object"),
                ));
                continue;
            }
        };
        strip_nulls(&mut object);
        let api_version = object.remove("apiVersion");
        let kind = object.remove("kind");
        let (api_version, kind) = match (api_version, kind) {
            (Some(Value::String(a)), Some(Value::String(k))) => (a, k),
            (a, k) => {
                let kind_name = match &k {
                    Some(Value::String(k)) => Some(k.as_str()),
                    _ => None,
                };
                if !matches!(a, Some(Value::String(_))) {
                    problems.push(doc_problem(
                        kind_name,
                        Some("apiVersion".into()),
                        "required: a string such as kubeadm.k8s.io/v1beta4".into(),
                    ));
                }
                if kind_name.is_none() {
                    problems.push(doc_problem(
                        None,
                        Some("kind".into()),
                        "required: a string such as InitConfiguration".into(),
                    ));
                }
                continue;
            }
        };
        if let Some(first) = seen.insert(kind.clone(), index) {
            problems.push(doc_problem(
                Some(&kind),
                None,
                format!("kind {kind} appears twice (documents {first} and {index})"),
            ));
            continue;
        }
        let body = Value::Object(object);
        let before = problems.len();
        {
            let mut report = |field: Option<String>, message: String| {
                problems.push(doc_problem(Some(&kind), field, message));
            };
            match (api_version.as_str(), kind.as_str(), phase) {
                (KUBEADM_API_VERSION, "InitConfiguration", Phase::Init) => {
                    if let Some(c) = decode::<InitConfiguration>(&body, &mut report) {
                        validate_init(&c, &mut report);
                        config.init = Some(c);
                    }
                }
                (KUBEADM_API_VERSION, "ClusterConfiguration", Phase::Init) => {
                    if let Some(c) = decode::<ClusterConfiguration>(&body, &mut report) {
                        validate_cluster(&c, &mut report);
                        config.cluster = Some(c);
                    }
                }
                (KUBEADM_API_VERSION, "JoinConfiguration", Phase::Join) => {
                    if let Some(c) = decode::<JoinConfiguration>(&body, &mut report) {
                        validate_join(&c, &mut report);
                        config.join = Some(c);
                    }
                }
                (KUBELET_API_VERSION, "KubeletConfiguration", Phase::Init) => {
                    config.kubelet = Some(body.clone());
                }
                (KUBE_PROXY_API_VERSION, "KubeProxyConfiguration", Phase::Init) => {
                    config.kube_proxy = Some(body.clone());
                }
                (
                    KUBEADM_API_VERSION,
                    "InitConfiguration" | "ClusterConfiguration" | "JoinConfiguration",
                    _,
                )
                | (KUBELET_API_VERSION, "KubeletConfiguration", _)
                | (KUBE_PROXY_API_VERSION, "KubeProxyConfiguration", _) => report(
                    None,
                    format!(
                        "kind {kind} has no effect on {phase} (kubeadm ignores it there); leave it out"
                    ),
                ),
                (KUBEADM_API_VERSION, "ResetConfiguration" | "UpgradeConfiguration", _) => report(
                    None,
                    format!("kind {kind} is for another kubeadm command, not {phase}"),
                ),
                (KUBEADM_API_VERSION, _, _) => report(
                    Some("kind".into()),
                    format!("unknown kind {kind:?} in {KUBEADM_API_VERSION}"),
                ),
                (a, _, _) if a.starts_with("kubeadm.k8s.io/") => report(
                    Some("apiVersion".into()),
                    format!(
                        "{a} is not supported: this stand-in implements {KUBEADM_API_VERSION} only"
                    ),
                ),
                (a, k, _) => report(
                    Some("apiVersion".into()),
                    format!("unknown apiVersion/kind {a}/{k}"),
                ),
            }
        }
        if problems.len() == before {
            config.documents.push(Document {
                api_version,
                kind,
                body,
            });
        }
    }
    if problems.is_empty() {
        match phase {
            Phase::Init if config.init.is_none() => problems.push(Problem {
                document: None,
                field: None,
                message: "no InitConfiguration document: the stand-in needs one (it cannot \
                          detect the node's address as kubeadm would)"
                    .into(),
            }),
            Phase::Join if config.join.is_none() => problems.push(Problem {
                document: None,
                field: None,
                message: "no JoinConfiguration document".into(),
            }),
            _ => {}
        }
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(problems)
    }
}

/// Go decodes `null` as "not set"; so does this.
fn strip_nulls(map: &mut serde_json::Map<String, Value>) {
    map.retain(|_, v| !v.is_null());
    for v in map.values_mut() {
        strip_nulls_in(v);
    }
}

fn strip_nulls_in(value: &mut Value) {
    match value {
        Value::Object(map) => strip_nulls(map),
        Value::Array(items) => items.iter_mut().for_each(strip_nulls_in),
        _ => {}
    }
}

/// Strict decoding: unknown fields and wrong types are reported with their path.
fn decode<T: serde::de::DeserializeOwned>(
    body: &Value,
    report: &mut dyn FnMut(Option<String>, String),
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(body.clone()) {
        Ok(v) => Some(v),
        Err(e) => {
            let path = e.path().to_string();
            let field = (path != ".").then_some(path);
            report(field, format!("strict decoding error: {}", e.inner()));
            None
        }
    }
}
