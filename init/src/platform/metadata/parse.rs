//! The pure half of [`super`]: what each cloud's answer says, as hawser keys.
//!
//! Nothing here logs, and no error carries a value: a value may be the state disk key.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use base64::Engine as _;
use zeroize::{Zeroize as _, Zeroizing};

/// The prefix of hawser's GCE instance attributes (`hawser-role`, `hawser-join_endpoint`).
pub const GCE_ATTRIBUTE_PREFIX: &str = "hawser-";
/// The longest value accepted for one hawser key: the bound fw_cfg applies to its entries, so
/// both sources accept the same values.
pub const MAX_VALUE_BYTES: usize = super::super::fw_cfg::MAX_ENTRY_SIZE as usize;

/// Hawser keys read from instance metadata: key (as under fw_cfg's `opt/hawser/`, e.g.
/// `join_endpoint`) → raw value. Derefs to the map [`crate::config::parse_fw_cfg`] reads;
/// `Debug` shows key names only, and the values are wiped on drop.
#[derive(Default, PartialEq, Eq)]
pub struct HawserKeys(BTreeMap<String, Vec<u8>>);

impl HawserKeys {
    /// The key names, for a log line (never the values).
    pub fn names(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }

    /// Adds `key`, refusing a second value for the same key (`spelled` is how the key was
    /// written, for the error).
    fn insert(&mut self, key: String, value: Vec<u8>, spelled: &str) -> Result<(), Malformed> {
        if self.0.contains_key(&key) {
            let mut value = value;
            value.zeroize();
            return Err(Malformed(format!(
                "{spelled} names key {key}, which is already given (`-` and `_` are the same \
                 in key names): give each key once"
            )));
        }
        self.0.insert(key, value);
        Ok(())
    }
}

impl Deref for HawserKeys {
    type Target = BTreeMap<String, Vec<u8>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Drop for HawserKeys {
    fn drop(&mut self) {
        for value in self.0.values_mut() {
            value.zeroize();
        }
    }
}

impl fmt::Debug for HawserKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl<const N: usize> From<[(&str, &str); N]> for HawserKeys {
    /// Keys from literal pairs (tests and examples).
    fn from(pairs: [(&str, &str); N]) -> Self {
        HawserKeys(
            pairs
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value.as_bytes().to_vec()))
                .collect(),
        )
    }
}

/// Why an answer could not be read as hawser keys. The text never contains a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

/// A key name as written (after any prefix) → the fw_cfg key name: ASCII letters, digits, `_`
/// and `-`, with `-` read as `_` (`join-endpoint` and `join_endpoint` are the same key).
fn key_name(spelled: &str, what: &str) -> Result<String, Malformed> {
    if spelled.is_empty()
        || !spelled
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Malformed(format!(
            "{what}: a key name is ASCII letters, digits, `_` and `-`, and not empty"
        )));
    }
    Ok(spelled.replace('-', "_"))
}

fn check_len(len: usize, what: &str) -> Result<(), Malformed> {
    if len > MAX_VALUE_BYTES {
        return Err(Malformed(format!(
            "{what} holds {len} bytes, more than the {MAX_VALUE_BYTES} accepted"
        )));
    }
    Ok(())
}

/// GCE: the JSON object of `instance/attributes/?recursive=true` (attribute name → string
/// value). The attributes named `hawser-<key>` are hawser's; every other attribute (ssh-keys,
/// startup-script, …) is skipped unread.
pub fn parse_gce_attributes(body: &[u8]) -> Result<HawserKeys, Malformed> {
    // serde_json's messages may quote the offending value: only its position is reported.
    let attributes: BTreeMap<String, String> = serde_json::from_slice(body).map_err(|e| {
        Malformed(format!(
            "the attributes are not a JSON object of strings ({:?} error at line {} column {})",
            e.classify(),
            e.line(),
            e.column()
        ))
    })?;
    let mut keys = HawserKeys::default();
    let mut failure = None;
    for (name, mut value) in attributes {
        let Some(spelled) = name.strip_prefix(GCE_ATTRIBUTE_PREFIX) else {
            value.zeroize();
            continue;
        };
        if failure.is_some() {
            value.zeroize();
            continue;
        }
        let what = format!("attribute {name}");
        let checked = key_name(spelled, &what).and_then(|key| {
            check_len(value.len(), &what)?;
            Ok(key)
        });
        match checked {
            Ok(key) => {
                if let Err(e) = keys.insert(key, value.into_bytes(), &what) {
                    failure = Some(e);
                }
            }
            Err(e) => {
                value.zeroize();
                failure = Some(e);
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(keys),
    }
}

/// AWS and Azure user data: UTF-8 text of `key=value` lines.
///
/// - A line is `<key>=<value>`; `key` is an fw_cfg key name (`role`, `join_endpoint`;
///   `join-endpoint` is the same key); ASCII whitespace around key and value is dropped, and
///   the value is everything after the first `=`.
/// - Empty lines and lines starting with `#` are skipped; `\r\n` line ends are accepted.
/// - Any other line, a key given twice, or text that is not UTF-8 makes the whole user data
///   malformed (it is hawser's alone; a half-read configuration is worse than none).
pub fn parse_user_data(text: &[u8]) -> Result<HawserKeys, Malformed> {
    let text = std::str::from_utf8(text).map_err(|e| {
        Malformed(format!(
            "user data is not UTF-8 text (at byte {})",
            e.valid_up_to()
        ))
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut keys = HawserKeys::default();
    for (index, line) in text.split('\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let what = format!("user data line {}", index + 1);
        let Some((spelled, value)) = line.split_once('=') else {
            return Err(Malformed(format!(
                "{what} is not `key=value` (nor empty, nor a `#` comment)"
            )));
        };
        let key = key_name(spelled.trim_ascii(), &what)?;
        let value = value.trim_ascii();
        check_len(value.len(), &what)?;
        keys.insert(key, value.as_bytes().to_vec(), &what)?;
    }
    Ok(keys)
}

/// Azure: `compute/userData` with `format=text` is the user data in base64 (ASCII whitespace
/// around it ignored); empty when the VM has none.
pub fn parse_azure_user_data(body: &[u8]) -> Result<HawserKeys, Malformed> {
    let encoded = body.trim_ascii();
    if encoded.is_empty() {
        return Ok(HawserKeys::default());
    }
    let mut decoded = Zeroizing::new(Vec::with_capacity(encoded.len() / 4 * 3));
    base64::engine::general_purpose::STANDARD
        .decode_vec(encoded, &mut decoded)
        .map_err(|_| Malformed("the user data answer is not base64".to_owned()))?;
    parse_user_data(&decoded)
}

/// AWS: the IMDSv2 session token of `PUT /latest/api/token`, as a header value (visible
/// ASCII, surrounding whitespace dropped).
pub fn parse_aws_token(body: &[u8]) -> Result<Zeroizing<String>, Malformed> {
    let token = body.trim_ascii();
    if token.is_empty() || !token.iter().all(|b| b.is_ascii_graphic()) {
        return Err(Malformed(
            "the IMDSv2 token answer is not one visible ASCII word".to_owned(),
        ));
    }
    Ok(Zeroizing::new(String::from_utf8_lossy(token).into_owned()))
}
