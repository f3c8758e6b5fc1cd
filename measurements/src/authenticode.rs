//! The Authenticode image hash (sha256) of a PE file, as UEFI firmware computes it before it
//! extends PCR 4 for every boot application it loads.
//!
//! # What is hashed
//!
//! Microsoft's "Windows Authenticode Portable Executable Signature Format" ("Calculating the PE
//! Image Hash") and, since the value must match what firmware extends, EDK II's implementation
//! that OVMF runs: `Tcg2MeasurePeImage()` in
//! `SecurityPkg/Library/DxeTpm2MeasureBootLib/DxeTpm2MeasureBootLib.c` (via
//! `MeasurePeImageAndExtend()` / `HashPeImageByType()` in `Tcg2Dxe/MeasureBootPeCoff.c`):
//!
//! 1. the headers from offset 0 up to the optional header's `CheckSum` field;
//! 2. skipping `CheckSum` (4 bytes), the rest of the headers up to the certificate-table data
//!    directory entry; skipping that entry (8 bytes), the rest up to `SizeOfHeaders`
//!    (if the image has no certificate-table entry, i.e. `NumberOfRvaAndSizes <= 4`, everything
//!    after `CheckSum` up to `SizeOfHeaders`);
//! 3. every section with `SizeOfRawData > 0`, `SizeOfRawData` bytes from `PointerToRawData`, in
//!    ascending order of `PointerToRawData` (a stable sort, as EDK II's insertion sort);
//! 4. with `SUM_OF_BYTES_HASHED = SizeOfHeaders + Σ SizeOfRawData`: if the file is longer than
//!    that, the `FileSize − (CertificateTableSize + SUM_OF_BYTES_HASHED)` bytes starting at
//!    offset `SUM_OF_BYTES_HASHED` (a file shorter than `SUM + CertificateTableSize` is
//!    refused, as EDK II does).
//!
//! The file is what the firmware was handed: for the UKI, the file on the ESP; for the kernel,
//! the buffer systemd-stub passes to `LoadImage()`, which is the `.linux` section's
//! `VirtualSize` bytes (systemd 257 `linux_exec()`), i.e. the vmlinuz file.
//!
//! Checked against reality: the PCR 4 digests in the event log captured from an OVMF boot (see
//! the crate's tests) equal this hash of the UKI and of its `.linux`.

use sha2::{Digest, Sha256};

use hawser_pe::{PeError, PeImage};

/// The Authenticode sha256 of `pe` (see the module docs for the exact byte ranges).
pub fn authenticode_sha256(pe: &PeImage<'_>) -> Result<[u8; 32], PeError> {
    let data = pe.data();
    let headers = pe.size_of_headers as usize;
    let checksum = pe.checksum_offset;
    let mut hasher = Sha256::new();
    let mut hash_range = |from: usize, to: usize, what: &str| -> Result<(), PeError> {
        if from > to || to > data.len() {
            return Err(pe.malformed(format!(
                "the Authenticode range {what} ({from:#x}..{to:#x}) is not within the file's {:#x} bytes",
                data.len()
            )));
        }
        hasher.update(&data[from..to]);
        Ok(())
    };
    hash_range(0, checksum, "before CheckSum")?;
    match pe.security_directory_offset {
        None => hash_range(checksum + 4, headers, "after CheckSum")?,
        Some(entry) => {
            hash_range(
                checksum + 4,
                entry,
                "between CheckSum and the certificate table entry",
            )?;
            hash_range(
                entry + 8,
                headers,
                "after the certificate table entry up to SizeOfHeaders",
            )?;
        }
    }

    let mut sections: Vec<_> = pe
        .sections
        .iter()
        .filter(|s| s.size_of_raw_data > 0)
        .collect();
    // `sort_by_key` is stable, like EDK II's insertion sort.
    sections.sort_by_key(|s| s.pointer_to_raw_data);
    let mut sum: u64 = headers as u64;
    for s in &sections {
        let from = s.pointer_to_raw_data as usize;
        hash_range(
            from,
            from + s.size_of_raw_data as usize,
            &format!("of section {:?}", s.name),
        )?;
        sum += u64::from(s.size_of_raw_data);
    }

    let file_size = data.len() as u64;
    if file_size > sum {
        let cert_size = u64::from(pe.security_directory.1);
        if file_size > sum + cert_size {
            // sum < file_size <= usize::MAX, so these conversions are exact.
            hash_range(
                sum as usize,
                (file_size - cert_size) as usize,
                "of the data after the last section",
            )?;
        } else if file_size < sum + cert_size {
            return Err(pe.malformed(format!(
                "the file ({file_size:#x} bytes) is shorter than its headers, sections and certificate table ({:#x} bytes)",
                sum + cert_size
            )));
        }
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_pe::test_support::{TINY_HEADERS as H, tiny_pe};

    fn sha256(parts: &[&[u8]]) -> [u8; 32] {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
        }
        h.finalize().into()
    }

    #[test]
    fn skips_checksum_and_certificate_entry_and_hashes_sections_in_file_order() {
        let file = tiny_pe(&[(".a", &[0xaa; 0x10]), (".b", &[0xbb; 0x210])]);
        let pe = PeImage::parse(&file, "t").expect("valid");
        let c = pe.checksum_offset;
        let e = pe.security_directory_offset.expect("16 directories");
        // Recomputed by hand from the spec's ranges.
        let expected = sha256(&[
            &file[..c],
            &file[c + 4..e],
            &file[e + 8..H],
            &file[H..H + 0x200],
            &file[H + 0x200..H + 0x600],
        ]);
        assert_eq!(authenticode_sha256(&pe).expect("hash"), expected);

        // CheckSum and the certificate entry do not count; every other header byte does.
        let mut changed = file.clone();
        changed[c] ^= 0xff;
        changed[e] ^= 0x01; // certificate table offset: not hashed (and still "no table").
        changed[e] ^= 0x01;
        let pe2 = PeImage::parse(&changed, "t").expect("valid");
        assert_eq!(authenticode_sha256(&pe2).expect("hash"), expected);
        let mut changed = file.clone();
        changed[0x40] ^= 1; // the DOS stub is hashed
        let pe3 = PeImage::parse(&changed, "t").expect("valid");
        assert_ne!(authenticode_sha256(&pe3).expect("hash"), expected);
    }

    #[test]
    fn section_order_is_by_file_offset_not_table_order() {
        let file = tiny_pe(&[(".a", &[0xaa; 0x10]), (".b", &[0xbb; 0x10])]);
        let pe = PeImage::parse(&file, "t").expect("valid");
        let base = authenticode_sha256(&pe).expect("hash");
        // Swap the two section headers: the file offsets are unchanged, so the hash only
        // changes by the header bytes, and the sections are still hashed .a then .b.
        let mut swapped = file.clone();
        let table = pe.checksum_offset - 64 + 112 + 128;
        let (a, b) = (table, table + 40);
        let header_a: Vec<u8> = swapped[a..a + 40].to_vec();
        let header_b: Vec<u8> = swapped[b..b + 40].to_vec();
        swapped[a..a + 40].copy_from_slice(&header_b);
        swapped[b..b + 40].copy_from_slice(&header_a);
        let pe2 = PeImage::parse(&swapped, "t").expect("valid");
        let c = pe2.checksum_offset;
        let e = pe2.security_directory_offset.expect("directories");
        let expected = sha256(&[
            &swapped[..c],
            &swapped[c + 4..e],
            &swapped[e + 8..H],
            &swapped[H..H + 0x200],
            &swapped[H + 0x200..H + 0x400],
        ]);
        assert_eq!(authenticode_sha256(&pe2).expect("hash"), expected);
        assert_ne!(expected, base);
    }

    #[test]
    fn trailing_data_is_hashed_minus_the_certificate_table() {
        let mut file = tiny_pe(&[(".a", &[1; 0x200])]);
        let plain = file.clone();
        file.extend_from_slice(b"trailer!");
        let pe = PeImage::parse(&file, "t").expect("valid");
        let c = pe.checksum_offset;
        let e = pe.security_directory_offset.expect("directories");
        let with_trailer = sha256(&[
            &file[..c],
            &file[c + 4..e],
            &file[e + 8..H + 0x200],
            b"trailer!",
        ]);
        assert_eq!(authenticode_sha256(&pe).expect("hash"), with_trailer);

        // Declare the last 8 bytes a certificate table: they are no longer hashed.
        let mut signed = file.clone();
        signed[e..e + 4].copy_from_slice(&(plain.len() as u32).to_le_bytes());
        signed[e + 4..e + 8].copy_from_slice(&8u32.to_le_bytes());
        let pe = PeImage::parse(&signed, "t").expect("valid");
        let unsigned = PeImage::parse(&plain, "t").expect("valid");
        assert_eq!(
            authenticode_sha256(&pe).expect("hash"),
            authenticode_sha256(&unsigned).expect("hash")
        );

        // A certificate table larger than what follows the sections is refused.
        signed[e + 4..e + 8].copy_from_slice(&0x100u32.to_le_bytes());
        let pe = PeImage::parse(&signed, "t").expect("valid");
        let err = authenticode_sha256(&pe).unwrap_err();
        assert!(err.to_string().contains("shorter than"), "{err}");
    }
}
