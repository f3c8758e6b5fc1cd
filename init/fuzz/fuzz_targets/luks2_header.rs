//! The LUKS2 header parser and hawser's policy checks on whatever bytes a disk holds.
//!
//! Each input is read twice: as it is (most mutations then fail the sha256 checksum), and with
//! both copies' checksums recomputed — what anyone who controls the disk can do, since the
//! header is not authenticated — so that every mutation reaches the JSON parser and the policy.
//! The seeds are real headers: hawser's (plain and integrity, formatting and initialized) and
//! one cryptsetup wrote with hawser's parameters, a recovery keyslot and hawser's token.
// cargo-fuzz builds this file as a libFuzzer binary (`--cfg fuzzing`); `tests/fuzz_seeds.rs`
// of the crate compiles it as a module and replays the seeds through `run`.
#![cfg_attr(fuzzing, no_main)]

use hawser_init::disk::probe;
use hawser_luks2::{self as luks2, HeaderSlot, Integrity};
use sha2::{Digest, Sha256};

/// Offset of the checksum field in a binary header.
const CSUM: usize = 448;

/// One input, as the fuzzer gives it.
pub fn run(data: &[u8]) {
    check(data);
    let mut area = data.to_vec();
    area.resize(luks2::HEADERS_LEN, 0);
    for copy in area.chunks_mut(luks2::HEADER_SIZE) {
        copy[CSUM..CSUM + 64].fill(0);
        let sum = Sha256::digest(&*copy);
        copy[CSUM..CSUM + 32].copy_from_slice(&sum);
    }
    check(&area);
}

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));

fn check(area: &[u8]) {
    for integrity in [Integrity::None, Integrity::HmacSha256] {
        if let Ok(selected) = luks2::parse_headers(area, integrity) {
            // Whatever is accepted describes hawser's fixed layout and the measured mode.
            let header = &selected.header;
            assert!(luks2::is_uuid(&header.uuid));
            assert_eq!(header.uuid, header.uuid.to_ascii_lowercase());
            assert_eq!(header.integrity, integrity);
            assert!(header.digest.iterations >= luks2::DIGEST_ITERATIONS);
            assert!(header.digest.iterations <= luks2::MAX_DIGEST_ITERATIONS);
            // A repaired copy of an accepted header is itself accepted.
            let repaired = luks2::repaired_copy(&selected.source, [7; 64]);
            let copy = selected.source.slot.other();
            let reparsed = luks2::parse_copy(copy, &repaired).expect("repaired copy parses");
            luks2::validate(&reparsed, integrity).expect("repaired copy is accepted");
        }
    }
    let _ = luks2::is_hawser_binary_header(HeaderSlot::Primary, area);
    let _ = luks2::has_luks_magic(area);
    let _ = probe::identify(area);
}
