//! The PE image checksum (`IMAGHLP`'s `CheckSumMappedFile`), which [`super::assemble_uki`]
//! writes where ukify writes 0: firmware ignores it and the Authenticode hash skips it.

/// The PE checksum with the 4 bytes at `field` counted as zero.
pub(super) fn checksum_with_field_zeroed(image: &[u8], field: usize) -> u32 {
    let byte = |i: usize| {
        if (field..field.saturating_add(4)).contains(&i) {
            0
        } else {
            image.get(i).copied().unwrap_or(0)
        }
    };
    let mut sum: u64 = 0;
    for i in (0..image.len()).step_by(2) {
        sum += u64::from(u16::from_le_bytes([byte(i), byte(i + 1)]));
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum = (sum & 0xffff) + (sum >> 16);
    // The PE checksum is defined modulo 2^32 (file length included).
    (sum as u32).wrapping_add(image.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_words_folds_carries_and_adds_length() {
        // Two words 0xffff + 0x0002 = 0x10001 -> folded 0x0002; plus length 4.
        assert_eq!(
            checksum_with_field_zeroed(&[0xff, 0xff, 0x02, 0x00], 100),
            2 + 4
        );
        // The field is skipped: only 0x0001 counts, plus length 6.
        assert_eq!(
            checksum_with_field_zeroed(&[1, 0, 0xaa, 0xbb, 0xcc, 0xdd], 2),
            1 + 6
        );
        // An odd trailing byte counts as a low byte.
        assert_eq!(checksum_with_field_zeroed(&[0, 0, 0, 0, 0, 0, 7], 0), 7 + 7);
    }
}
