//! The PCR commands of [`Tpm`]: which banks are allocated, reading them, and extending a
//! boot-phase word (as systemd-pcrextend does) or a digest (the node lock).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest as _, Sha256, Sha384, Sha512};
use tss_esapi::{
    constants::CapabilityType,
    handles::PcrHandle,
    interface_types::{resource_handles::Hierarchy, session_handles::AuthSession},
    structures::{CapabilityData, Digest, DigestValues, MaxBuffer, PcrSelectionList, PcrSlot},
};

use super::{HashingAlgorithm, Inner, Tpm, TpmError, lock};

/// The PCRs of a PC-client TPM: 0 to 23.
const PCR_COUNT: u8 = 24;
/// TPM2_PCR_Read returns at most 8 PCRs per call (the TPM's PCR selection output is limited).
const PCRS_PER_READ: usize = 8;

pub(super) fn pcr_slot(pcr: u8) -> Result<PcrSlot, TpmError> {
    if pcr >= PCR_COUNT {
        return Err(TpmError::PcrIndex { pcr });
    }
    PcrSlot::try_from(1u32 << pcr).map_err(|_| TpmError::PcrIndex { pcr })
}

fn pcr_handle(pcr: u8) -> Result<PcrHandle, TpmError> {
    use PcrHandle::*;
    const HANDLES: [PcrHandle; PCR_COUNT as usize] = [
        Pcr0, Pcr1, Pcr2, Pcr3, Pcr4, Pcr5, Pcr6, Pcr7, Pcr8, Pcr9, Pcr10, Pcr11, Pcr12, Pcr13,
        Pcr14, Pcr15, Pcr16, Pcr17, Pcr18, Pcr19, Pcr20, Pcr21, Pcr22, Pcr23,
    ];
    HANDLES
        .get(usize::from(pcr))
        .copied()
        .ok_or(TpmError::PcrIndex { pcr })
}

fn slot_index(slot: PcrSlot) -> u8 {
    // A PcrSlot is a single bit of a u32, so trailing_zeros is below 32.
    u32::from(slot).trailing_zeros() as u8
}

impl Tpm {
    /// The PCR banks with all 24 PCRs allocated (TPM2_GetCapability(TPM_CAP_PCRS)).
    pub fn pcr_banks(&self) -> Result<Vec<HashingAlgorithm>, TpmError> {
        let mut inner = lock(&self.inner);
        Self::full_banks(&mut inner)
    }

    fn full_banks(inner: &mut Inner) -> Result<Vec<HashingAlgorithm>, TpmError> {
        const CALL: &str = "TPM2_GetCapability(TPM_CAP_PCRS)";
        let (data, _more) = inner
            .context
            .get_capability(CapabilityType::AssignedPcr, 0, 1)
            .map_err(inner.call_err(CALL))?;
        let CapabilityData::AssignedPcr(list) = data else {
            return Err(inner.unexpected(CALL, format!("{data:?} instead of assigned PCRs")));
        };
        let banks: Vec<HashingAlgorithm> = list
            .get_selections()
            .iter()
            .filter(|selection| {
                (0..PCR_COUNT)
                    .all(|pcr| pcr_slot(pcr).is_ok_and(|slot| selection.is_selected(slot)))
            })
            .map(|selection| selection.hashing_algorithm())
            .collect();
        if banks.is_empty() {
            return Err(TpmError::NoPcrBanks {
                tcti: inner.tcti.clone(),
            });
        }
        Ok(banks)
    }

    /// Reads `pcrs` of one bank, looping because TPM2_PCR_Read returns at most 8 PCRs a call.
    pub fn read_pcrs(
        &self,
        bank: HashingAlgorithm,
        pcrs: impl IntoIterator<Item = u8>,
    ) -> Result<BTreeMap<u8, Vec<u8>>, TpmError> {
        let mut inner = lock(&self.inner);
        Self::read_pcrs_locked(&mut inner, bank, pcrs)
    }

    fn read_pcrs_locked(
        inner: &mut Inner,
        bank: HashingAlgorithm,
        pcrs: impl IntoIterator<Item = u8>,
    ) -> Result<BTreeMap<u8, Vec<u8>>, TpmError> {
        const CALL: &str = "TPM2_PCR_Read";
        let mut pending = BTreeSet::new();
        for pcr in pcrs {
            pcr_slot(pcr)?;
            pending.insert(pcr);
        }
        let mut values = BTreeMap::new();
        while !pending.is_empty() {
            let batch = pending
                .iter()
                .take(PCRS_PER_READ)
                .map(|&pcr| pcr_slot(pcr))
                .collect::<Result<Vec<_>, _>>()?;
            let selection = PcrSelectionList::builder()
                .with_selection(bank, &batch)
                .build()
                .map_err(inner.call_err(CALL))?;
            let (_update_counter, read, digests) = inner
                .context
                .pcr_read(selection)
                .map_err(inner.call_err(CALL))?;
            // The digests follow the returned selection: banks in order, PCRs ascending.
            let mut digests = digests.value().iter();
            let mut progressed = false;
            for selection in read.get_selections() {
                for slot in selection.selected() {
                    let Some(digest) = digests.next() else {
                        return Err(
                            inner.unexpected(CALL, "fewer digests than selected PCRs".to_string())
                        );
                    };
                    let pcr = slot_index(slot);
                    if selection.hashing_algorithm() == bank && pending.remove(&pcr) {
                        values.insert(pcr, digest.value().to_vec());
                        progressed = true;
                    }
                }
            }
            if !progressed {
                return Err(inner.unexpected(
                    CALL,
                    format!("none of PCRs {pending:?} of bank {bank:?} (are they allocated?)"),
                ));
            }
        }
        Ok(values)
    }

    /// Reads `pcrs` of the sha256 bank.
    pub fn read_pcrs_sha256(
        &self,
        pcrs: impl IntoIterator<Item = u8>,
    ) -> Result<BTreeMap<u8, [u8; 32]>, TpmError> {
        let mut inner = lock(&self.inner);
        let values = Self::read_pcrs_locked(&mut inner, HashingAlgorithm::Sha256, pcrs)?;
        values
            .into_iter()
            .map(|(pcr, value)| {
                let len = value.len();
                <[u8; 32]>::try_from(value).map(|v| (pcr, v)).map_err(|_| {
                    inner.unexpected(
                        "TPM2_PCR_Read",
                        format!("sha256 PCR {pcr} has {len} bytes, expected 32"),
                    )
                })
            })
            .collect()
    }

    /// Extends PCR `pcr` with the boot-phase word `phase` in every bank systemd-pcrextend would
    /// use (see the module docs). Returns the banks extended.
    pub fn extend_phase(&self, pcr: u8, phase: &str) -> Result<Vec<HashingAlgorithm>, TpmError> {
        if phase.is_empty() {
            return Err(TpmError::EmptyPhase);
        }
        let handle = pcr_handle(pcr)?;
        let mut inner = lock(&self.inner);
        let full = Self::full_banks(&mut inner)?;

        // Prefer the banks where the PCR is initialised (not all-zero or all-one), as
        // systemd's tpm2_get_good_pcr_banks() does.
        let mut good = Vec::new();
        for &bank in &full {
            let values = Self::read_pcrs_locked(&mut inner, bank, [pcr])?;
            let initialised = values.get(&pcr).is_some_and(|value| {
                !value.iter().all(|&b| b == 0) && !value.iter().all(|&b| b == 0xff)
            });
            if initialised {
                good.push(bank);
            }
        }
        let banks = if good.is_empty() { full } else { good };

        let mut digests = DigestValues::new();
        for &bank in &banks {
            let digest = Self::hash_for_bank(&mut inner, bank, phase.as_bytes())?;
            digests.set(bank, digest);
        }
        inner
            .context
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.pcr_extend(handle, digests)
            })
            .map_err(inner.call_err("TPM2_PCR_Extend"))?;
        tracing::info!(pcr, phase, banks = ?banks, "extended PCR with boot phase");
        Ok(banks)
    }

    /// Extends the sha256 bank of `pcr` with `digest` itself (not a hash of it), as
    /// Constellation's node lock extends PCR 15 with the cluster ID.
    pub fn extend_sha256_digest(&self, pcr: u8, digest: &[u8; 32]) -> Result<(), TpmError> {
        let handle = pcr_handle(pcr)?;
        let mut inner = lock(&self.inner);
        let mut digests = DigestValues::new();
        let value = Digest::try_from(digest.to_vec()).map_err(inner.call_err("Digest"))?;
        digests.set(HashingAlgorithm::Sha256, value);
        inner
            .context
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.pcr_extend(handle, digests)
            })
            .map_err(inner.call_err("TPM2_PCR_Extend"))?;
        tracing::info!(pcr, "extended the sha256 bank with a digest");
        Ok(())
    }

    fn hash_for_bank(
        inner: &mut Inner,
        bank: HashingAlgorithm,
        data: &[u8],
    ) -> Result<Digest, TpmError> {
        let local = match bank {
            HashingAlgorithm::Sha256 => Some(Sha256::digest(data).to_vec()),
            HashingAlgorithm::Sha384 => Some(Sha384::digest(data).to_vec()),
            HashingAlgorithm::Sha512 => Some(Sha512::digest(data).to_vec()),
            _ => None,
        };
        match local {
            Some(bytes) => Digest::try_from(bytes).map_err(inner.call_err("TPM2_PCR_Extend")),
            None => {
                let buffer =
                    MaxBuffer::try_from(data.to_vec()).map_err(inner.call_err("TPM2_Hash"))?;
                let (digest, _ticket) = inner
                    .context
                    .execute_without_session(|ctx| ctx.hash(buffer, bank, Hierarchy::Null))
                    .map_err(inner.call_err("TPM2_Hash"))?;
                Ok(digest)
            }
        }
    }
}
