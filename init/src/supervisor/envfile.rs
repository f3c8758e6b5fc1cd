//! systemd-style environment files, as kubeadm writes `/var/lib/kubelet/kubeadm-flags.env`.
//!
//! kubeadm's kubelet drop-in says `EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env` and
//! `ExecStart=/usr/bin/kubelet … $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS`: the file is
//! optional (`-`), and an unbraced `$VAR` in `ExecStart` is split at whitespace into separate
//! arguments. kubeadm writes the file during `kubeadm init`/`join`, so it is read again at
//! every start of the service.
//!
//! The subset of systemd's syntax parsed: `KEY=VALUE` lines, blank lines and comment lines
//! (`#`, `;`), an optional `export ` prefix, and values in double quotes (with `\"` and `\\`
//! escapes) or single quotes.

use std::io;
use std::path::Path;

/// The `(key, value)` pairs of an environment file, in file order. Lines that are not
/// assignments are skipped, as systemd does (with a warning there).
pub fn parse(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                return None;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (key, value) = line.split_once('=')?;
            let key = key.trim();
            let valid_key = !key.is_empty()
                && !key.starts_with(|c: char| c.is_ascii_digit())
                && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            valid_key.then(|| (key.to_owned(), unquote(value.trim())))
        })
        .collect()
}

fn unquote(value: &str) -> String {
    if let Some(inner) = value
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('\\', Some(next @ ('"' | '\\'))) => {
                    out.push(next);
                    chars.next();
                }
                _ => out.push(c),
            }
        }
        return out;
    }
    if let Some(inner) = value
        .strip_prefix('\'')
        .and_then(|rest| rest.strip_suffix('\''))
    {
        return inner.to_owned();
    }
    value.to_owned()
}

/// The words of `$variable` from the optional file `path`: empty if the file or the variable
/// is missing. The last assignment wins.
pub fn args_from(path: &Path, variable: &str) -> io::Result<Vec<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(parse(&text)
        .into_iter()
        .rev()
        .find(|(key, _)| key == variable)
        .map(|(_, value)| value.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadms_flags_file_becomes_separate_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeadm-flags.env");
        std::fs::write(
            &path,
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock \
             --node-ip=10.0.2.15 --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n",
        )
        .unwrap();
        assert_eq!(
            args_from(&path, "KUBELET_KUBEADM_ARGS").unwrap(),
            [
                "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
                "--node-ip=10.0.2.15",
                "--pod-infra-container-image=registry.k8s.io/pause:3.10"
            ]
        );
        assert!(args_from(&path, "KUBELET_EXTRA_ARGS").unwrap().is_empty());
        assert!(
            args_from(&dir.path().join("missing"), "KUBELET_KUBEADM_ARGS")
                .unwrap()
                .is_empty()
        );
        // A directory cannot be read: that is an error, not "no arguments".
        assert!(args_from(dir.path(), "X").is_err());
    }

    #[test]
    fn systemd_syntax_subset() {
        let text = "# comment\n; another\n\nA=1\nexport B='two words'\nC=\"say \\\"hi\\\" \\\\o/\"\n\
                    not an assignment\n9X=bad\nA=last\n";
        assert_eq!(
            parse(text),
            [
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), "two words".to_owned()),
                ("C".to_owned(), "say \"hi\" \\o/".to_owned()),
                ("A".to_owned(), "last".to_owned()),
            ]
        );
    }
}
