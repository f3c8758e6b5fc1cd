//! The stand-ins' call records: one JSON object per line, appended to
//! `<root>/var/log/hawser-standin/<tool>.jsonl`, so a test (or a person on the node) can see
//! exactly what hawser asked kubeadm and kubelet to do.
//!
//! Secrets never reach the record: bootstrap tokens keep only their public id
//! (`abcdef.<redacted>`), certificate keys are replaced.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The record file of `tool` under `root`.
pub fn record_path(root: &Path, tool: &str) -> PathBuf {
    root.join("var/log/hawser-standin")
        .join(format!("{tool}.jsonl"))
}

/// Appends `entry` as one line. One `write` of a whole line to an O_APPEND file: concurrent
/// writers never interleave within a line.
pub fn append(root: &Path, tool: &str, entry: &Value) -> std::io::Result<PathBuf> {
    let path = record_path(root, tool);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut line = entry.to_string();
    line.push('\n');
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)?;
    file.write_all(line.as_bytes())?;
    Ok(path)
}

/// Field names whose values are secrets in kubeadm's configuration.
const SECRET_FIELDS: &[&str] = &["token", "tlsBootstrapToken", "certificateKey"];

/// A copy of `value` with every secret field redacted.
pub fn redact(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (SECRET_FIELDS.contains(&k.as_str()), v) {
                        (true, Value::String(s)) => Value::String(redact_token(s)),
                        (true, _) => Value::String("<redacted>".into()),
                        (false, v) => redact(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        other => other.clone(),
    }
}

/// `abcdef.0123456789abcdef` -> `abcdef.<redacted>` (the id is public by design); anything
/// else -> `<redacted>`.
pub fn redact_token(s: &str) -> String {
    if crate::validate::is_bootstrap_token(s) {
        let (id, _) = s.split_at(6);
        format!("{id}.<redacted>")
    } else {
        "<redacted>".into()
    }
}

/// argv with the values of secret flags (`--token`, `--certificate-key`, a bare token
/// argument) redacted.
pub fn redact_argv(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut secret_next = false;
    for arg in argv {
        if secret_next {
            out.push(redact_token(arg));
            secret_next = false;
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (arg.as_str(), None),
        };
        let secret_flag = matches!(
            flag,
            "--token" | "--certificate-key" | "--discovery-token" | "--tls-bootstrap-token"
        );
        match (secret_flag, inline) {
            (true, Some(v)) => out.push(format!("{flag}={}", redact_token(v))),
            (true, None) => {
                out.push(arg.clone());
                secret_next = true;
            }
            (false, _) if crate::validate::is_bootstrap_token(arg) => out.push(redact_token(arg)),
            (false, _) => out.push(arg.clone()),
        }
    }
    out
}

/// Seconds since the Unix epoch, for the record's `time` field.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_redacted_everywhere() {
        let doc = json!({
            "bootstrapTokens": [{"token": "abcdef.0123456789abcdef", "ttl": "24h"}],
            "discovery": {"bootstrapToken": {"token": "abcdef.0123456789abcdef"},
                          "tlsBootstrapToken": "garbage"},
            "controlPlane": {"certificateKey": "00".repeat(32)},
        });
        let text = redact(&doc).to_string();
        assert!(!text.contains("0123456789abcdef"), "{text}");
        assert!(!text.contains(&"00".repeat(32)), "{text}");
        assert!(text.contains("abcdef.<redacted>"), "{text}");
        assert!(text.contains("24h"), "{text}");
        let argv: Vec<String> = ["join", "--token", "abcdef.0123456789abcdef", "x"]
            .map(String::from)
            .into();
        assert_eq!(
            redact_argv(&argv),
            ["join", "--token", "abcdef.<redacted>", "x"]
        );
    }
}
