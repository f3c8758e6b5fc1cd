//! The wire format against hand-written bytes, the transports against a fake TPM.

use super::*;

#[test]
fn password_session_commands_marshal_as_the_spec_lays_them_out() {
    // TPM2_PCR_Extend(PCR 11, sha256 digest of zeros) with TPM_RS_PW.
    let command = Command::new(cc::PCR_EXTEND)
        .authorised_handle(11)
        .u32(1)
        .u16(HashingAlgorithm::Sha256.id())
        .bytes(&[0; 32])
        .marshal()
        .expect("marshals");
    let expected = concat!(
        "8002",     // TPM_ST_SESSIONS
        "00000041", // 65 bytes
        "00000182", // TPM_CC_PCR_Extend
        "0000000b", // PCR 11
        "00000009", // authorizationSize
        "40000009", "0000", "00", "0000", // TPM_RS_PW, nonce, attributes, hmac
        "00000001", "000b",
    );
    assert_eq!(
        hex::encode(&command),
        format!("{expected}{}", "00".repeat(32))
    );
    // No sessions: no authorisation area.
    let command = Command::new(cc::GET_RANDOM).u16(32).marshal().expect("ok");
    assert_eq!(hex::encode(command), "80010000000c0000017b0020");
}

#[test]
fn a_pcr_selection_sets_one_bit_per_pcr() {
    let command = Command::new(cc::PCR_READ)
        .pcr_selection(HashingAlgorithm::Sha1, &[0, 7, 8, 23])
        .marshal()
        .expect("ok");
    assert_eq!(hex::encode(&command[HEADER..]), "00000001000403810180");
}

#[test]
fn an_oversized_buffer_does_not_marshal() {
    let command = Command::new(cc::HASH).tpm2b(&vec![0; 70_000]);
    assert!(command.marshal().is_err());
}

/// Hands out at most `chunk` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    chunk: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.chunk.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn a_response_is_read_whole_across_short_reads() {
    let response = hex::decode("80010000000e000000000020abcd").expect("hex");
    let mut source = Trickle {
        data: &response,
        chunk: 3,
    };
    assert_eq!(read_response(&mut source).expect("reads"), response);
}

#[test]
fn a_badly_framed_response_is_refused() {
    for (bytes, what) in [
        ("80010000000e00000000", "ends early"),
        ("12340000000a00000000", "bad tag"),
        ("800100000004000000000000", "size below the header"),
    ] {
        let data = hex::decode(bytes).expect("hex");
        let mut source = Trickle {
            data: &data,
            chunk: 64,
        };
        assert!(read_response(&mut source).is_err(), "{what}");
    }
}

#[test]
fn response_codes_decode_to_their_names_and_places() {
    assert_eq!(
        ResponseCode(0x18b).to_string(),
        "TPM_RC_HANDLE of handle 1 (0x18b, format 1)"
    );
    assert_eq!(
        ResponseCode(0x2c4).to_string(),
        "TPM_RC_VALUE of parameter 2 (0x2c4, format 1)"
    );
    assert_eq!(
        ResponseCode(0x98e).to_string(),
        "TPM_RC_AUTH_FAIL of session 1 (0x98e, format 1)"
    );
    assert_eq!(
        ResponseCode(0x902).to_string(),
        "TPM_RC_OBJECT_MEMORY (0x902, format 0 warning)"
    );
    assert_eq!(
        ResponseCode(0x100).to_string(),
        "TPM_RC_INITIALIZE (0x100, format 0 error)"
    );
    assert!(ResponseCode(0x922).is_retry());
    assert!(ResponseCode(0x90a).is_retry());
    assert!(!ResponseCode(0x902).is_retry());
    assert_eq!(ResponseCode(0x18b).name(), Some("TPM_RC_HANDLE"));
}

#[test]
fn tcti_strings_parse() {
    assert_eq!(
        parse_tcti("device:/dev/tpm0"),
        Ok(Target::Device("/dev/tpm0".into()))
    );
    assert_eq!(
        parse_tcti("device"),
        Ok(Target::Device("/dev/tpmrm0".into()))
    );
    assert_eq!(
        parse_tcti("swtpm:host=127.0.0.1,port=2345"),
        Ok(Target::Swtpm {
            host: "127.0.0.1".into(),
            port: 2345
        })
    );
    assert_eq!(
        parse_tcti("swtpm:"),
        Ok(Target::Swtpm {
            host: "localhost".into(),
            port: 2321
        })
    );
    assert!(parse_tcti("mssim:port=1").is_err());
    assert!(parse_tcti("swtpm:port=x").is_err());
}

#[test]
fn a_reply_with_sessions_skips_the_authorisation_area() {
    // CreatePrimary-like: one handle, parameterSize 4, parameters, then a password ack.
    let response =
        hex::decode("80020000001b000000008000000000000004aabbccdd0000010000").expect("hex");
    let mut reply = split_reply(&response, 1, true).expect("splits");
    assert_eq!(reply.handles, vec![0x8000_0000]);
    assert_eq!(reply.params.u32("x").expect("u32"), 0xaabb_ccdd);
    assert_eq!(reply.params.remaining(), 0);
}
