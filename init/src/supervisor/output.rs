//! Forwarding a child's stdout and stderr to the log, one line per event, with secrets cut.
//!
//! Lines are bounded ([`MAX_LINE`]): a program that writes without newlines cannot make PID 1
//! buffer without limit. Bootstrap tokens (`abcdef.0123456789abcdef`) are redacted in every
//! line — `kubeadm init` prints its join command with the token — keeping the public token ID;
//! for one-shot jobs (kubeadm) standalone 64-hex-digit words (the certificate key kubeadm
//! prints for control-plane joins) are redacted too. Services keep those, since containerd's
//! container and image IDs have that shape.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use hawser_kube_types::BootstrapToken;
use hawser_kube_types::token::TOKEN_LEN;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::task::JoinHandle;

use crate::platform::reaper::SupervisedChild;

/// Longest line forwarded; the rest of a longer line is dropped.
pub const MAX_LINE: usize = 4096;
/// Lines of output a one-shot job's failure report carries.
pub const TAIL_LINES: usize = 20;

/// Which secrets to cut from lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redaction {
    /// Bootstrap tokens.
    Tokens,
    /// Bootstrap tokens and 64-hex-digit keys not preceded by `sha256:`.
    TokensAndKeys,
}

/// The last lines of a child's output.
#[derive(Debug, Clone, Default)]
pub struct Tail {
    lines: Arc<Mutex<VecDeque<String>>>,
}

impl Tail {
    fn push(&self, line: &str) {
        let mut lines = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line.to_owned());
    }

    /// The lines kept, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }
}

/// Replaces the secret half of bootstrap tokens (`[a-z0-9]{6}.[a-z0-9]{16}`, as a whole word)
/// and, with [`Redaction::TokensAndKeys`], standalone 64-hex-digit words.
pub fn redact(line: &str, redaction: Redaction) -> String {
    let bytes = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    let boundary = |at: usize| at == 0 || at >= bytes.len() || !bytes[at].is_ascii_alphanumeric();
    while i < bytes.len() {
        let word_start = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        if word_start
            && boundary(i + TOKEN_LEN)
            && let Some(token) = line
                .get(i..i + TOKEN_LEN)
                .and_then(|word| word.parse::<BootstrapToken>().ok())
        {
            out.push_str(token.id());
            out.push_str(".<redacted>");
            i += TOKEN_LEN;
            continue;
        }
        if redaction == Redaction::TokensAndKeys
            && word_start
            && i + 64 <= bytes.len()
            && bytes[i..i + 64]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            && boundary(i + 64)
            && !line[..i].ends_with("sha256:")
        {
            out.push_str("<redacted key>");
            i += 64;
            continue;
        }
        // Copy one character (not one byte: the line is UTF-8).
        let len = line[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&line[i..i + len]);
        i += len;
    }
    out
}

/// Starts forwarding the child's stdout and stderr (see [`forward`]); returns the tasks, which
/// end when the pipes close.
pub fn forward_child_output(
    child: &mut SupervisedChild,
    name: &str,
    redaction: Redaction,
    tail: Option<Tail>,
) -> Vec<JoinHandle<()>> {
    let stdout = child.inner().stdout.take();
    let stderr = child.inner().stderr.take();
    let mut tasks = Vec::new();
    if let Some(pipe) = stdout {
        tasks.push(tokio::spawn(forward(
            name.to_owned(),
            pipe,
            redaction,
            tail.clone(),
        )));
    }
    if let Some(pipe) = stderr {
        tasks.push(tokio::spawn(forward(
            name.to_owned(),
            pipe,
            redaction,
            tail,
        )));
    }
    tasks
}

/// Reads `pipe` to its end and logs every line as `[name] line` (info level, target
/// `hawser::service`), keeping the last lines in `tail`.
pub async fn forward(
    name: String,
    mut pipe: impl AsyncRead + Unpin,
    redaction: Redaction,
    tail: Option<Tail>,
) {
    let mut buf = vec![0u8; 8192];
    let mut line = Vec::with_capacity(256);
    let mut dropping = false;
    let emit = |line: &[u8], truncated: bool| {
        let text = String::from_utf8_lossy(line);
        let text = text.strip_suffix('\r').unwrap_or(&text);
        let mut text = redact(text, redaction);
        if truncated {
            text.push_str(" [line cut]");
        }
        tracing::info!(target: "hawser::service", "[{name}] {text}");
        if let Some(tail) = &tail {
            tail.push(&text);
        }
    };
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &byte in &buf[..n] {
            if byte == b'\n' {
                if !dropping {
                    emit(&line, false);
                }
                line.clear();
                dropping = false;
            } else if !dropping {
                line.push(byte);
                if line.len() == MAX_LINE {
                    emit(&line, true);
                    line.clear();
                    dropping = true;
                }
            }
        }
    }
    if !line.is_empty() && !dropping {
        emit(&line, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_tokens_keep_only_their_id() {
        assert_eq!(
            redact(
                "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef \\",
                Redaction::Tokens
            ),
            "kubeadm join 10.0.0.1:6443 --token abcdef.<redacted> \\"
        );
        assert_eq!(
            redact("token=\"abcdef.0123456789abcdef\"", Redaction::Tokens),
            "token=\"abcdef.<redacted>\""
        );
        // Not tokens: too long, uppercase, part of a longer word.
        for text in [
            "abcdefg.0123456789abcdef",
            "ABCDEF.0123456789ABCDEF",
            "xabcdef.0123456789abcdefx",
            "registry.k8s.io/pause:3.10",
        ] {
            assert_eq!(redact(text, Redaction::TokensAndKeys), text);
        }
        // Next to multi-byte characters, and cut short by one: no panic, nothing leaks.
        assert_eq!(
            redact("«abcdef.0123456789abcdef»", Redaction::Tokens),
            "«abcdef.<redacted>»"
        );
        assert_eq!(
            redact("abcdef.0123456789abcdeé", Redaction::Tokens),
            "abcdef.0123456789abcdeé"
        );
    }

    #[test]
    fn certificate_keys_are_cut_from_job_output_but_digests_stay() {
        let key = "0123456789abcdef".repeat(4);
        assert_eq!(
            redact(
                &format!("--certificate-key {key}"),
                Redaction::TokensAndKeys
            ),
            "--certificate-key <redacted key>"
        );
        assert_eq!(redact(&key, Redaction::TokensAndKeys), "<redacted key>");
        let digest = format!("--discovery-token-ca-cert-hash sha256:{key}");
        assert_eq!(redact(&digest, Redaction::TokensAndKeys), digest);
        // Services keep container IDs.
        assert_eq!(redact(&key, Redaction::Tokens), key);
        assert_eq!(
            redact("héllo wörld", Redaction::TokensAndKeys),
            "héllo wörld"
        );
    }

    #[test]
    fn the_tail_keeps_the_last_lines() {
        let tail = Tail::default();
        for i in 0..TAIL_LINES + 5 {
            tail.push(&i.to_string());
        }
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "5");
        assert_eq!(lines.last().map(String::as_str), Some("24"));
    }
}
