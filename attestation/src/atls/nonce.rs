//! How the two nonces travel in a TLS 1.3 handshake without any TLS extension of our own.
//!
//! - Client → server: the ClientHello's server_name (SNI), as two DNS labels of 32 lowercase hex
//!   digits (a DNS label holds at most 63 characters) under a fixed suffix in the `.invalid`
//!   TLD, which never resolves (RFC 6761):
//!   `<hex nonce[0..16]>.<hex nonce[16..32]>.atls-nonce.hawser.invalid`.
//! - Server → client: the CertificateRequest's certificate_authorities, as one distinguished
//!   name with a single attribute of type [`NONCE_ATTRIBUTE_OID`](super::NONCE_ATTRIBUTE_OID)
//!   whose value is an OCTET STRING holding the nonce:
//!   `SEQUENCE { SET { SEQUENCE { OID, OCTET STRING (32 bytes) } } }`.

use crate::evidence::{NONCE_LEN, Nonce};

use super::cert::NONCE_OID_BYTES;

/// The labels after the two hex labels of a nonce SNI.
pub const SNI_SUFFIX: &str = "atls-nonce.hawser.invalid";

/// The SNI host name carrying `nonce`.
pub fn to_sni(nonce: &Nonce) -> String {
    format!(
        "{}.{}.{SNI_SUFFIX}",
        hex::encode(&nonce[..NONCE_LEN / 2]),
        hex::encode(&nonce[NONCE_LEN / 2..])
    )
}

/// The nonce in an SNI host name, if it has exactly the form [`to_sni`] writes (case-insensitive,
/// as DNS names are).
pub fn from_sni(sni: &str) -> Option<Nonce> {
    let sni = sni.to_ascii_lowercase();
    let (labels, suffix) = sni.split_at_checked(2 * (NONCE_LEN + 1))?;
    if suffix != SNI_SUFFIX {
        return None;
    }
    let (first, second) = labels.split_at_checked(NONCE_LEN)?;
    let second = second.strip_prefix('.')?.strip_suffix('.')?;
    let mut nonce = [0u8; NONCE_LEN];
    hex::decode_to_slice(first, &mut nonce[..NONCE_LEN / 2]).ok()?;
    hex::decode_to_slice(second, &mut nonce[NONCE_LEN / 2..]).ok()?;
    Some(nonce)
}

/// The header of the distinguished name up to the nonce bytes.
const DN_PREFIX: [u8; 31] = {
    let mut out = [0u8; 31];
    let head = [
        0x30, 0x3d, // Name: SEQUENCE, 61 bytes
        0x31, 0x3b, // RelativeDistinguishedName: SET, 59 bytes
        0x30, 0x39, // AttributeTypeAndValue: SEQUENCE, 57 bytes
        0x06, 0x15, // OID, 21 bytes
    ];
    let mut i = 0;
    while i < head.len() {
        out[i] = head[i];
        i += 1;
    }
    let mut j = 0;
    while j < NONCE_OID_BYTES.len() {
        out[head.len() + j] = NONCE_OID_BYTES[j];
        j += 1;
    }
    out[29] = 0x04; // OCTET STRING
    out[30] = NONCE_LEN as u8; // 32 bytes
    out
};

/// The DER distinguished name carrying `nonce` (see the module docs).
pub fn to_distinguished_name(nonce: &Nonce) -> Vec<u8> {
    let mut dn = DN_PREFIX.to_vec();
    dn.extend_from_slice(nonce);
    dn
}

/// The nonce in a distinguished name, if it is exactly one [`to_distinguished_name`] writes.
pub fn from_distinguished_name(dn: &[u8]) -> Option<Nonce> {
    let rest = dn.strip_prefix(&DN_PREFIX[..])?;
    rest.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::{FromDer as _, X509Name};

    #[test]
    fn sni_round_trips_and_is_a_valid_dns_name() {
        let nonce: Nonce = std::array::from_fn(|i| i as u8 * 7);
        let sni = to_sni(&nonce);
        assert_eq!(
            sni,
            "00070e151c232a31383f464d545b6269.70777e858c939aa1a8afb6bdc4cbd2d9.atls-nonce.hawser.invalid"
        );
        assert_eq!(from_sni(&sni), Some(nonce));
        assert_eq!(from_sni(&sni.to_uppercase()), Some(nonce));
        rustls::pki_types::ServerName::try_from(sni.as_str()).expect("rustls accepts it as SNI");

        for bad in [
            "",
            "example.com",
            &sni.replace(SNI_SUFFIX, "atls-nonce.hawser.example"),
            &sni[1..],
            &format!("0{sni}"),
            &sni.replacen('0', "g", 1),
            &sni.replacen('.', "-", 1),
        ] {
            assert_eq!(from_sni(bad), None, "{bad}");
        }
    }

    #[test]
    fn distinguished_name_round_trips_and_is_a_valid_name() {
        let nonce = [0xa5; 32];
        let dn = to_distinguished_name(&nonce);
        assert_eq!(dn.len(), 63);
        assert_eq!(from_distinguished_name(&dn), Some(nonce));
        let (rest, name) = X509Name::from_der(&dn).expect("a DER Name");
        assert!(rest.is_empty());
        let attribute = name.iter_attributes().next().expect("one attribute");
        assert_eq!(attribute.attr_type().as_bytes(), NONCE_OID_BYTES);
        assert_eq!(attribute.attr_value().data, nonce);

        assert_eq!(from_distinguished_name(&dn[..62]), None);
        let mut longer = dn.clone();
        longer.push(0);
        assert_eq!(from_distinguished_name(&longer), None);
        let mut other_oid = dn.clone();
        other_oid[28] ^= 1;
        assert_eq!(from_distinguished_name(&other_oid), None);
    }
}
