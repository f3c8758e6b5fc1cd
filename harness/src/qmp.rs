//! A minimal QMP (QEMU Machine Protocol) client over a unix socket.
//!
//! QMP is newline-delimited JSON. On connect QEMU sends a greeting (`{"QMP": {...}}`); the
//! client must send `qmp_capabilities` before any other command. Each command gets exactly one
//! `{"return": ...}` or `{"error": {"class", "desc"}}`; asynchronous `{"event": ...}` messages
//! may arrive at any time in between and are collected, not mistaken for replies.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::QemuError;

/// How long one QMP command may take to answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// One message from QEMU.
#[derive(Debug, Clone, PartialEq)]
pub enum QmpMessage {
    /// The greeting sent on connect; `version` is QEMU's `{"qemu": {...}, "package": ...}`.
    Greeting { version: Value },
    /// A command's successful reply.
    Return { id: Option<Value>, value: Value },
    /// A command's failure.
    Error {
        id: Option<Value>,
        class: String,
        desc: String,
    },
    /// An asynchronous event, such as `SHUTDOWN` or `POWERDOWN`.
    Event { name: String, data: Value },
}

/// Parses one QMP message (one line of the stream).
pub fn parse_message(line: &str) -> Result<QmpMessage, QemuError> {
    let protocol = |reason: String| QemuError::QmpProtocol { reason };
    let value: Value = serde_json::from_str(line.trim())
        .map_err(|e| protocol(format!("not JSON ({e}): {line:?}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| protocol(format!("not a JSON object: {line:?}")))?;
    let id = object.get("id").cloned();
    if let Some(greeting) = object.get("QMP") {
        return Ok(QmpMessage::Greeting {
            version: greeting.get("version").cloned().unwrap_or(Value::Null),
        });
    }
    if let Some(value) = object.get("return") {
        return Ok(QmpMessage::Return {
            id,
            value: value.clone(),
        });
    }
    if let Some(error) = object.get("error") {
        let field = |name: &str| {
            error
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or("(missing)")
                .to_owned()
        };
        return Ok(QmpMessage::Error {
            id,
            class: field("class"),
            desc: field("desc"),
        });
    }
    if let Some(name) = object.get("event").and_then(Value::as_str) {
        return Ok(QmpMessage::Event {
            name: name.to_owned(),
            data: object.get("data").cloned().unwrap_or(Value::Null),
        });
    }
    Err(protocol(format!("unknown message: {line:?}")))
}

/// Renders a command as one QMP line.
pub fn render_command(command: &str, arguments: Option<&Value>) -> String {
    let mut message = json!({ "execute": command });
    if let Some(arguments) = arguments {
        message["arguments"] = arguments.clone();
    }
    format!("{message}\n")
}

/// A connected QMP session, past capabilities negotiation.
#[derive(Debug)]
pub struct Qmp {
    socket: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    events: Vec<(String, Value)>,
    version: Value,
}

impl Qmp {
    /// Connects to `socket` (retrying until it exists or `timeout` passes), reads the greeting
    /// and negotiates capabilities.
    pub fn connect(socket: &Path, timeout: Duration) -> Result<Qmp, QemuError> {
        let deadline = Instant::now().checked_add(timeout);
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(stream) => break stream,
                Err(e)
                    if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused)
                        && deadline.is_none_or(|end| Instant::now() < end) =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(source) => {
                    return Err(QemuError::QmpIo {
                        socket: socket.to_path_buf(),
                        action: "connect",
                        source,
                    });
                }
            }
        };
        let io_error = |action, source| QemuError::QmpIo {
            socket: socket.to_path_buf(),
            action,
            source,
        };
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(|e| io_error("set a read timeout", e))?;
        let writer = stream
            .try_clone()
            .map_err(|e| io_error("clone the socket", e))?;
        let mut qmp = Qmp {
            socket: socket.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
            events: Vec::new(),
            version: Value::Null,
        };
        match qmp.read_message()? {
            QmpMessage::Greeting { version } => qmp.version = version,
            other => {
                return Err(QemuError::QmpProtocol {
                    reason: format!("expected the QMP greeting, got {other:?}"),
                });
            }
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// QEMU's version object from the greeting.
    pub fn version(&self) -> &Value {
        &self.version
    }

    /// Runs a command and returns its `return` value.
    pub fn execute(
        &mut self,
        command: &str,
        arguments: Option<&Value>,
    ) -> Result<Value, QemuError> {
        let line = render_command(command, arguments);
        self.writer
            .write_all(line.as_bytes())
            .map_err(|source| QemuError::QmpIo {
                socket: self.socket.clone(),
                action: "send a command",
                source,
            })?;
        loop {
            match self.read_message()? {
                QmpMessage::Return { value, .. } => return Ok(value),
                QmpMessage::Error { class, desc, .. } => {
                    return Err(QemuError::QmpCommand {
                        command: command.to_owned(),
                        class,
                        desc,
                    });
                }
                QmpMessage::Event { name, data } => self.events.push((name, data)),
                QmpMessage::Greeting { .. } => {
                    return Err(QemuError::QmpProtocol {
                        reason: "a second greeting arrived mid-session".into(),
                    });
                }
            }
        }
    }

    /// `query-status`: the run state, e.g. `"running"`, `"paused"`, `"shutdown"`.
    pub fn query_status(&mut self) -> Result<String, QemuError> {
        let value = self.execute("query-status", None)?;
        value
            .get("status")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| QemuError::QmpProtocol {
                reason: format!("query-status returned no status: {value}"),
            })
    }

    /// `system_powerdown`: presses the ACPI power button (the guest decides what to do).
    pub fn system_powerdown(&mut self) -> Result<(), QemuError> {
        self.execute("system_powerdown", None).map(drop)
    }

    /// `quit`: QEMU exits at once. QEMU may close the socket before its reply arrives.
    pub fn quit(&mut self) -> Result<(), QemuError> {
        match self.execute("quit", None) {
            Ok(_) => Ok(()),
            Err(QemuError::QmpIo { source, .. })
                if matches!(
                    source.kind(),
                    ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
                ) =>
            {
                Ok(())
            }
            Err(other) => Err(other),
        }
    }

    /// Events received so far (name, data), oldest first; draining them.
    pub fn take_events(&mut self) -> Vec<(String, Value)> {
        std::mem::take(&mut self.events)
    }

    fn read_message(&mut self) -> Result<QmpMessage, QemuError> {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self
                .reader
                .read_line(&mut line)
                .map_err(|source| QemuError::QmpIo {
                    socket: self.socket.clone(),
                    action: "read a reply",
                    source,
                })?;
            if read == 0 {
                return Err(QemuError::QmpIo {
                    socket: self.socket.clone(),
                    action: "read a reply",
                    source: std::io::Error::new(ErrorKind::UnexpectedEof, "QEMU closed the socket"),
                });
            }
            if !line.trim().is_empty() {
                return parse_message(&line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_greeting() {
        let line = r#"{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18"}, "capabilities": ["oob"]}}"#;
        let QmpMessage::Greeting { version } = parse_message(line).expect("parse") else {
            panic!("not a greeting");
        };
        assert_eq!(version["qemu"]["major"], 7);
    }

    #[test]
    fn parses_returns_errors_and_events() {
        assert_eq!(
            parse_message("{\"return\": {}}\r\n").expect("parse"),
            QmpMessage::Return {
                id: None,
                value: json!({})
            }
        );
        assert_eq!(
            parse_message(r#"{"return": {"status": "running", "running": true}, "id": 7}"#)
                .expect("parse"),
            QmpMessage::Return {
                id: Some(json!(7)),
                value: json!({"status": "running", "running": true})
            }
        );
        assert_eq!(
            parse_message(
                r#"{"error": {"class": "CommandNotFound", "desc": "The command nope has not been found"}}"#
            )
            .expect("parse"),
            QmpMessage::Error {
                id: None,
                class: "CommandNotFound".into(),
                desc: "The command nope has not been found".into()
            }
        );
        assert_eq!(
            parse_message(
                r#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}"#
            )
            .expect("parse"),
            QmpMessage::Event {
                name: "SHUTDOWN".into(),
                data: json!({"guest": true, "reason": "guest-shutdown"})
            }
        );
    }

    #[test]
    fn rejects_what_is_not_qmp() {
        for line in ["", "not json", "[1]", r#"{"something": 1}"#] {
            let error = parse_message(line).unwrap_err();
            assert!(
                matches!(error, QemuError::QmpProtocol { .. }),
                "{line:?}: {error}"
            );
        }
    }

    #[test]
    fn renders_commands_as_single_lines() {
        assert_eq!(
            render_command("qmp_capabilities", None),
            "{\"execute\":\"qmp_capabilities\"}\n"
        );
        let line = render_command(
            "human-monitor-command",
            Some(&json!({"command-line": "info\nx"})),
        );
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(
            parse_message(&line).is_err(),
            "a command is not a server message"
        );
    }

    #[test]
    fn session_skips_events_and_reports_command_errors() {
        // A scripted QEMU on the other end of a unix socket: the real byte stream, including an
        // event that arrives before a reply.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("qmp.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut writer = stream;
            writer
                .write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"major\": 7}}, \"capabilities\": []}}\r\n")
                .expect("greet");
            let mut expect = |want: &str, replies: &str| {
                let mut line = String::new();
                reader.read_line(&mut line).expect("read");
                assert_eq!(line.trim(), want);
                writer.write_all(replies.as_bytes()).expect("write");
            };
            expect(r#"{"execute":"qmp_capabilities"}"#, "{\"return\": {}}\r\n");
            expect(
                r#"{"execute":"query-status"}"#,
                "{\"event\": \"RESUME\", \"data\": {}}\r\n{\"return\": {\"status\": \"running\"}}\r\n",
            );
            expect(
                r#"{"execute":"nope"}"#,
                "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The command nope has not been found\"}}\r\n",
            );
        });
        let mut qmp = Qmp::connect(&path, Duration::from_secs(5)).expect("connect");
        assert_eq!(qmp.version()["qemu"]["major"], 7);
        assert_eq!(qmp.query_status().expect("status"), "running");
        assert_eq!(qmp.take_events(), vec![("RESUME".to_owned(), json!({}))]);
        let error = qmp.execute("nope", None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "QMP command `nope` failed: CommandNotFound: The command nope has not been found"
        );
        server.join().expect("server");
    }
}
