//! GUIDs as GPT, dm-verity and the kernel command line use them.
//!
//! A [`Guid`] is held in its canonical byte order, the order of the hex digits in its text form
//! (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`): the order of a dm-verity superblock's UUID, of
//! the root-hash halves that name the rootfs partitions, and of `/dev/disk/by-partuuid`. GPT
//! stores the first three fields little-endian (`EFI_GUID`: u32, u16, u16, then 8 bytes);
//! [`Guid::to_gpt_bytes`] and [`Guid::from_gpt_bytes`] convert.

use std::fmt;
use std::str::FromStr;

/// A GUID in canonical (text) byte order: `Display` prints the bytes in order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Guid([u8; 16]);

impl Guid {
    /// The GUID whose text form (8-4-4-4-12 hex digits) is the 32 hex digits of `value`.
    pub const fn from_u128(value: u128) -> Guid {
        Guid(value.to_be_bytes())
    }

    /// The GUID whose canonical text is the hex of `bytes`, in order.
    pub const fn from_bytes(bytes: [u8; 16]) -> Guid {
        Guid(bytes)
    }

    /// A random (RFC 4122 version 4) GUID made from 16 random or hash bytes: the version and
    /// variant bits are set, so that tools which check them (mkfs.erofs, veritysetup) accept it.
    pub const fn version_4(bytes: [u8; 16]) -> Guid {
        let mut bytes = bytes;
        bytes[6] = (bytes[6] & 0x0F) | 0x40;
        bytes[8] = (bytes[8] & 0x3F) | 0x80;
        Guid(bytes)
    }

    /// The bytes in canonical order.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The mixed-endian form GPT stores (`EFI_GUID`: u32, u16, u16 little-endian, then 8 bytes).
    pub const fn to_gpt_bytes(self) -> [u8; 16] {
        let b = self.0;
        [
            b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13],
            b[14], b[15],
        ]
    }

    /// The GUID from GPT's mixed-endian form.
    pub const fn from_gpt_bytes(bytes: [u8; 16]) -> Guid {
        // The swap is its own inverse.
        Guid(Guid(bytes).to_gpt_bytes())
    }

    /// Whether every byte is zero (GPT reads that as "no partition").
    pub fn is_nil(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = hex::encode(self.0);
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

/// A string that is not a GUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a GUID (expected XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX in hex)")]
pub struct ParseGuidError(String);

impl FromStr for Guid {
    type Err = ParseGuidError;

    /// Parses the canonical text form, in either case.
    fn from_str(text: &str) -> Result<Guid, ParseGuidError> {
        let error = || ParseGuidError(text.to_owned());
        let groups: Vec<&str> = text.split('-').collect();
        if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
            return Err(error());
        }
        let mut bytes = [0u8; 16];
        hex::decode_to_slice(groups.concat(), &mut bytes).map_err(|_| error())?;
        Ok(Guid(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::{ESP_TYPE, ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE};

    fn guid(text: &str) -> Guid {
        text.parse().unwrap()
    }

    #[test]
    fn guid_text_and_gpt_byte_orders() {
        // As fdisk and sgdisk write the ESP type on disk.
        assert_eq!(
            ESP_TYPE.to_gpt_bytes(),
            [
                0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e,
                0xc9, 0x3b
            ]
        );
        assert_eq!(ESP_TYPE.to_string(), "c12a7328-f81f-11d2-ba4b-00a0c93ec93b");
        assert_eq!(
            Guid::from_gpt_bytes(ROOT_X86_64_TYPE.to_gpt_bytes()),
            ROOT_X86_64_TYPE
        );
        assert_eq!(
            "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5".parse::<Guid>(),
            Ok(ROOT_X86_64_VERITY_TYPE)
        );
        for bad in [
            "",
            "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF",
            "2C7357EDEBD246D9AEC123D437EC2BF5",
        ] {
            assert!(bad.parse::<Guid>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn guids_use_gpts_mixed_endian_encoding() {
        let root = guid("4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709");
        assert_eq!(
            root.to_gpt_bytes(),
            [
                0xE3, 0xBC, 0x68, 0x4F, 0xCD, 0xE8, 0xB1, 0x4D, 0x96, 0xE7, 0xFB, 0xCA, 0xF9, 0x84,
                0xB7, 0x09
            ]
        );
        assert_eq!(root.to_string(), "4f68bce3-e8cd-4db1-96e7-fbcaf984b709");
        assert_eq!(Guid::from_gpt_bytes(root.to_gpt_bytes()), root);
        for bad in [
            "4F68BCE3E8CD-4DB1-96E7-FBCAF984B709-",
            "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B70",
            "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B70g",
        ] {
            let error = bad.parse::<Guid>().unwrap_err();
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    #[test]
    fn version_4_sets_only_the_version_and_variant_bits() {
        assert_eq!(
            Guid::version_4([0xff; 16]).to_string(),
            "ffffffff-ffff-4fff-bfff-ffffffffffff"
        );
        assert_eq!(
            Guid::version_4([0; 16]).to_string(),
            "00000000-0000-4000-8000-000000000000"
        );
    }
}
