//! hawser-pcr: the sha256 PCR extend and the boot-phase words hawser measures.
//!
//! A TPM never stores what was measured, only the running value
//! `PCR_new = H(PCR_old || digest)`. A verifier that wants to check a quoted PCR therefore
//! replays the same extensions in software; this crate is that replay, shared by the image
//! builder's prediction (`hawser-measurements`), the PID 1 (what it extends) and the verifiers
//! (the join service, `hawser-attestation`: what they expect). It is small on purpose: PID 1 and
//! the join service link it without the prediction engine. The console marker PID 1 prints the
//! firmware's event log under ([`EVENT_LOG_MARKER`]) is here for the same reason.
//!
//! # Boot phases (systemd-pcrphase compatibility)
//!
//! hawser extends PCR 11 with the same boot-phase words as systemd 257's `systemd-pcrextend`
//! (run by `systemd-pcrphase-initrd.service` as `systemd-pcrextend --graceful enter-initrd`),
//! so a verifier that knows systemd's PCR 11 policy understands a hawser node and vice versa.
//! What systemd extends, from its source (`src/pcrextend/pcrextend.c` and
//! `tpm2_pcr_extend_bytes()` in `src/shared/tpm2-util.c`, called `tpm2_extend_bytes()` before
//! v255) and its `docs/TPM2_PCR_MEASUREMENTS.md` ("PCR 11, boot phases"):
//!
//! - the measured data is the phase word itself, `strlen(word)` bytes of UTF-8, **without** a
//!   trailing NUL or newline (an empty word is refused);
//! - for every selected bank the word is hashed with that bank's algorithm (`EVP_Digest`, no HMAC
//!   since no secret is involved) and all digests go into one `TPM2_PCR_Extend` of PCR 11;
//! - the banks are those with all 24 PCRs allocated in which PCR 11 is already initialised (not
//!   all-zero or all-one), falling back to every fully allocated bank if none is;
//! - systemd also appends a record to its userspace event log
//!   `/run/log/systemd/tpm2-measure.log` (CEL-JSON-like, with the digests and the word as
//!   content of type `phase`). That log is not part of what the TPM quotes. hawser keeps no such
//!   file in the initramfs: the boot report carries the words it extended and the PCR value
//!   before the first one, which is what a verifier needs to replay them.
//!
//! So in the sha256 bank, `PCR11_after = SHA256(PCR11_before || SHA256("enter-initrd"))`.
//!
//! # The control-plane marker
//!
//! One word is hawser's own, not systemd's: a node that holds its cluster's master secret (a
//! control plane) extends [`PHASE_CONTROL_PLANE`] immediately before `leave-initrd`, so after
//! the pivot a worker's PCR 11 is `ext(ext(P, enter-initrd), leave-initrd)` and a control
//! plane's `ext(ext(ext(P, enter-initrd), control-plane), leave-initrd)`
//! ([`pcr11_after_pivot`]). A hash chain fixes the order: root on a pivoted worker can only
//! extend after `leave-initrd`, so it can never produce the control plane's value, and a
//! joining node recognises a control plane's join service by it.

use sha2::{Digest, Sha256};

/// The console line prefix under which hawser's PID 1 prints the firmware's event log,
/// base64-encoded (`hawser_measurements::eventlog::find_in_console` reads it back).
pub const EVENT_LOG_MARKER: &str = "HAWSER_EVENT_LOG ";

/// PCR 11 ("kernel-boot" in the UAPI PCR registry): systemd-stub measures the UKI's sections
/// into it, and the boot-phase words follow.
pub const PCR_KERNEL_BOOT: u8 = 11;

/// The phase word extended into PCR 11 when the initramfs's PID 1 starts its work.
pub const PHASE_ENTER_INITRD: &str = "enter-initrd";

/// The phase word extended into PCR 11 just before leaving the initramfs (switch_root), so that
/// no later code can satisfy a policy bound to the initramfs phase.
pub const PHASE_LEAVE_INITRD: &str = "leave-initrd";

/// The phase word a control plane's PID 1 extends into PCR 11 immediately before
/// [`PHASE_LEAVE_INITRD`] (see the module docs): the node holds its cluster's master secret
/// and runs the cluster's join service after the pivot.
pub const PHASE_CONTROL_PLANE: &str = "control-plane";

/// PCR 11 after the pivot into the rootfs, from its value after `enter-initrd`: a worker's
/// with `leave-initrd`, a control plane's with `control-plane` and then `leave-initrd`.
pub fn pcr11_after_pivot(after_enter_initrd: &[u8; 32], control_plane: bool) -> [u8; 32] {
    let before_leave = if control_plane {
        extend_sha256(after_enter_initrd, &phase_digest(PHASE_CONTROL_PLANE))
    } else {
        *after_enter_initrd
    };
    extend_sha256(&before_leave, &phase_digest(PHASE_LEAVE_INITRD))
}

/// One TPM2_PCR_Extend in the sha256 bank: `SHA256(pcr || digest)`.
pub fn extend_sha256(pcr: &[u8; 32], digest: &[u8; 32]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(pcr);
    hasher.update(digest);
    hasher.finalize().into()
}

/// The PCR a node's lock extends with its cluster ID (Constellation's convention).
pub const PCR_CLUSTER_ID: u8 = 15;

/// PCR 15 (sha256 bank) of a node locked to `cluster_id` in this boot: the cluster ID itself is
/// the extended digest, so the value is `SHA256(0³² ‖ cluster ID)`.
pub fn cluster_lock_pcr(cluster_id: &[u8; 32]) -> [u8; 32] {
    extend_sha256(&[0; 32], cluster_id)
}

/// The sha256-bank digest systemd-pcrextend extends for a boot-phase word: `SHA256(word)`, the
/// UTF-8 bytes without a trailing NUL (see the module docs for the source).
pub fn phase_digest(phase: &str) -> [u8; 32] {
    Sha256::digest(phase.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> [u8; 32] {
        let v = hex::decode(s).expect("test vector is hex");
        v.try_into().expect("test vector is 32 bytes")
    }

    // Vectors computed outside this code with coreutils:
    //   printf enter-initrd | sha256sum
    //   printf leave-initrd | sha256sum
    //   printf control-plane | sha256sum
    //   (head -c 32 /dev/zero; printf enter-initrd | sha256sum | cut -d' ' -f1 | xxd -r -p) | sha256sum
    // The last one was also read back from swtpm 0.7.1 after
    // `tpm2_pcrextend 11:sha256=51e6b9…` on a fresh TPM (`tpm2_pcrread sha256:11`).
    const ENTER_INITRD_SHA256: &str =
        "51e6b92f405d1f98d96e3de343d61d420ad6923b25de21d766f9298192f14fed";
    const LEAVE_INITRD_SHA256: &str =
        "3be261aff7db92bf507eae947f4003ffa2bcad0bffe3524601d62d0bc8be7135";
    const ZERO_THEN_ENTER_INITRD: &str =
        "d15b0e8e244e65c40f024e95773f2347ce4ef3ffe6b597c9a14b50bbab6df319";
    const CONTROL_PLANE_SHA256: &str =
        "9682666514c07508d9ee41ca0a32cf2fc8e0fbda9466c5bfd0f88b82ca5389e9";
    // From zero: enter-initrd, leave-initrd (a worker) and enter-initrd, control-plane,
    // leave-initrd (a control plane), by Python's hashlib.
    const WORKER_AFTER_PIVOT: &str =
        "75df9c8b17d8a6465f2862028b892ea13a3d7c37685a945e5ff34fb44956c207";
    const CONTROL_PLANE_AFTER_PIVOT: &str =
        "3492e369895246af82df4149794721c8de1903bb953ca8157e3381eeb590844a";

    #[test]
    fn a_control_planes_pcr_11_after_the_pivot_differs_from_a_workers() {
        assert_eq!(phase_digest(PHASE_CONTROL_PLANE), h(CONTROL_PLANE_SHA256));
        let enter = h(ZERO_THEN_ENTER_INITRD);
        assert_eq!(pcr11_after_pivot(&enter, false), h(WORKER_AFTER_PIVOT));
        assert_eq!(
            pcr11_after_pivot(&enter, true),
            h(CONTROL_PLANE_AFTER_PIVOT)
        );
        // Root on a worker extends only after leave-initrd: the marker then comes too late.
        let worker_then_marker = extend_sha256(
            &pcr11_after_pivot(&enter, false),
            &phase_digest(PHASE_CONTROL_PLANE),
        );
        assert_ne!(worker_then_marker, h(CONTROL_PLANE_AFTER_PIVOT));
    }

    #[test]
    fn phase_digest_is_sha256_of_the_word_without_nul() {
        assert_eq!(phase_digest(PHASE_ENTER_INITRD), h(ENTER_INITRD_SHA256));
        assert_eq!(phase_digest(PHASE_LEAVE_INITRD), h(LEAVE_INITRD_SHA256));
        // A NUL-terminated or newline-terminated word would be a different measurement.
        assert_ne!(phase_digest("enter-initrd\0"), h(ENTER_INITRD_SHA256));
        assert_ne!(phase_digest("enter-initrd\n"), h(ENTER_INITRD_SHA256));
    }

    #[test]
    fn extend_from_zero_matches_a_real_tpm() {
        let after = extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD));
        assert_eq!(after, h(ZERO_THEN_ENTER_INITRD));
    }

    #[test]
    fn extend_is_order_sensitive() {
        let a = phase_digest(PHASE_ENTER_INITRD);
        let b = phase_digest(PHASE_LEAVE_INITRD);
        let ab = extend_sha256(&extend_sha256(&[0; 32], &a), &b);
        let ba = extend_sha256(&extend_sha256(&[0; 32], &b), &a);
        assert_ne!(ab, ba);
        // extend(x, d) = SHA256(x || d), checked against the definition directly.
        let mut cat = Vec::from([0u8; 32]);
        cat.extend_from_slice(&a);
        assert_eq!(
            extend_sha256(&[0; 32], &a),
            <[u8; 32]>::from(Sha256::digest(&cat))
        );
    }

    #[test]
    fn constants_match_the_uapi_registry() {
        assert_eq!(PCR_KERNEL_BOOT, 11);
        assert_eq!(PHASE_ENTER_INITRD, "enter-initrd");
        assert_eq!(PHASE_LEAVE_INITRD, "leave-initrd");
        assert_eq!(PHASE_CONTROL_PLANE, "control-plane");
    }
}
