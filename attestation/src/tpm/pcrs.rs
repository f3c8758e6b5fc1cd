//! The PCR commands of [`Tpm`]: which banks are allocated, reading them, and extending a
//! boot-phase word (as systemd-pcrextend does) or a digest (the node lock).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest as _, Sha256, Sha384, Sha512};

use super::wire::{Command, cc};
use super::{HashingAlgorithm, Inner, Tpm, TpmError, lock};

/// The PCRs of a PC-client TPM: 0 to 23.
const PCR_COUNT: u8 = 24;
/// TPM2_PCR_Read returns at most 8 PCRs per call (the TPM's PCR selection output is limited).
const PCRS_PER_READ: usize = 8;
/// `TPM_RH_NULL`: TPM2_Hash without a ticket.
const TPM_RH_NULL: u32 = 0x4000_0007;
/// `MAX_DIGEST_BUFFER`: the largest TPM2B_MAX_BUFFER every TPM takes.
const MAX_DIGEST_BUFFER: usize = 1024;

/// Checks that `pcr` is one of a PC-client TPM's 24.
pub(super) fn pcr_slot(pcr: u8) -> Result<u8, TpmError> {
    if pcr >= PCR_COUNT {
        return Err(TpmError::PcrIndex { pcr });
    }
    Ok(pcr)
}

impl Tpm {
    /// The PCR banks with all 24 PCRs allocated (TPM2_GetCapability(TPM_CAP_PCRS)).
    pub fn pcr_banks(&self) -> Result<Vec<HashingAlgorithm>, TpmError> {
        let mut inner = lock(&self.inner);
        Self::full_banks(&mut inner)
    }

    fn full_banks(inner: &mut Inner) -> Result<Vec<HashingAlgorithm>, TpmError> {
        const CALL: &str = "TPM2_GetCapability(TPM_CAP_PCRS)";
        let command = Command::new(cc::GET_CAPABILITY)
            .u32(super::TPM_CAP_PCRS)
            .u32(0)
            .u32(1);
        let selections = inner.run(CALL, command, 0, |mut reply| {
            let r = &mut reply.params;
            r.u8("moreData")?;
            let offset = r.offset();
            let capability = r.u32("capability")?;
            if capability != super::TPM_CAP_PCRS {
                return Err(r.unexpected("capability", offset, "TPM_CAP_PCRS", capability.into()));
            }
            read_selections(r)
        })?;
        let banks: Vec<HashingAlgorithm> = selections
            .iter()
            .filter(|(_, pcrs)| (0..PCR_COUNT).all(|pcr| pcrs.contains(&pcr)))
            .filter_map(|(alg, _)| {
                let bank = HashingAlgorithm::from_id(*alg);
                if bank.is_none() {
                    tracing::debug!(
                        alg = format_args!("{alg:#06x}"),
                        "skipping a PCR bank of an unknown hash"
                    );
                }
                bank
            })
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
            let batch: Vec<u8> = pending.iter().take(PCRS_PER_READ).copied().collect();
            let command = Command::new(cc::PCR_READ).pcr_selection(bank, &batch);
            let (read, digests) = inner.run(CALL, command, 0, |mut reply| {
                let r = &mut reply.params;
                r.u32("pcrUpdateCounter")?;
                let read = read_selections(r)?;
                let count = r.u32("pcrValues.count")?;
                let mut digests = Vec::new();
                for _ in 0..count.min(PCRS_PER_READ as u32 * 8) {
                    digests.push(r.tpm2b("pcrValues.digest", 64)?.to_vec());
                }
                Ok((read, digests))
            })?;
            // The digests follow the returned selection: banks in order, PCRs ascending.
            let mut digests = digests.into_iter();
            let mut progressed = false;
            for (alg, pcrs) in read {
                for pcr in pcrs {
                    let Some(digest) = digests.next() else {
                        return Err(
                            inner.unexpected(CALL, "fewer digests than selected PCRs".to_string())
                        );
                    };
                    if alg == bank.id() && pending.remove(&pcr) {
                        if digest.len() != bank.digest_size() {
                            return Err(inner.unexpected(
                                CALL,
                                format!("{bank:?} PCR {pcr} has {} bytes", digest.len()),
                            ));
                        }
                        values.insert(pcr, digest);
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
        pcr_slot(pcr)?;
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

        let mut digests = Vec::with_capacity(banks.len());
        for &bank in &banks {
            digests.push((
                bank,
                Self::hash_for_bank(&mut inner, bank, phase.as_bytes())?,
            ));
        }
        Self::pcr_extend(&mut inner, pcr, &digests)?;
        tracing::info!(pcr, phase, banks = ?banks, "extended PCR with boot phase");
        Ok(banks)
    }

    /// Extends the sha256 bank of `pcr` with `digest` itself (not a hash of it), as
    /// Constellation's node lock extends PCR 15 with the cluster ID.
    pub fn extend_sha256_digest(&self, pcr: u8, digest: &[u8; 32]) -> Result<(), TpmError> {
        pcr_slot(pcr)?;
        let mut inner = lock(&self.inner);
        Self::pcr_extend(
            &mut inner,
            pcr,
            &[(HashingAlgorithm::Sha256, digest.to_vec())],
        )?;
        tracing::info!(pcr, "extended the sha256 bank with a digest");
        Ok(())
    }

    /// TPM2_PCR_Extend of `pcr` with one digest per bank.
    fn pcr_extend(
        inner: &mut Inner,
        pcr: u8,
        digests: &[(HashingAlgorithm, Vec<u8>)],
    ) -> Result<(), TpmError> {
        const CALL: &str = "TPM2_PCR_Extend";
        // At most the 8 hash algorithms there are.
        let mut command = Command::new(cc::PCR_EXTEND)
            .authorised_handle(u32::from(pcr))
            .u32(digests.len() as u32);
        for (bank, digest) in digests {
            if digest.len() != bank.digest_size() {
                return Err(
                    inner.unexpected(CALL, format!("a {bank:?} digest of {} bytes", digest.len()))
                );
            }
            command = command.u16(bank.id()).bytes(digest);
        }
        inner.run(CALL, command, 0, |_| Ok(()))
    }

    fn hash_for_bank(
        inner: &mut Inner,
        bank: HashingAlgorithm,
        data: &[u8],
    ) -> Result<Vec<u8>, TpmError> {
        const CALL: &str = "TPM2_Hash";
        match bank {
            HashingAlgorithm::Sha256 => Ok(Sha256::digest(data).to_vec()),
            HashingAlgorithm::Sha384 => Ok(Sha384::digest(data).to_vec()),
            HashingAlgorithm::Sha512 => Ok(Sha512::digest(data).to_vec()),
            _ => {
                if data.len() > MAX_DIGEST_BUFFER {
                    return Err(inner.unexpected(
                        CALL,
                        format!(
                            "{} bytes to hash, more than {MAX_DIGEST_BUFFER}",
                            data.len()
                        ),
                    ));
                }
                let command = Command::new(cc::HASH)
                    .tpm2b(data)
                    .u16(bank.id())
                    .u32(TPM_RH_NULL);
                let digest = inner.run(CALL, command, 0, |mut reply| {
                    Ok(reply.params.tpm2b("outHash", 64)?.to_vec())
                })?;
                if digest.len() != bank.digest_size() {
                    return Err(inner
                        .unexpected(CALL, format!("a {bank:?} digest of {} bytes", digest.len())));
                }
                Ok(digest)
            }
        }
    }
}

/// A `TPML_PCR_SELECTION`: each bank's algorithm ID and its selected PCRs, ascending.
fn read_selections(
    r: &mut crate::tpm_types::Reader<'_>,
) -> Result<Vec<(u16, Vec<u8>)>, crate::tpm_types::ParseError> {
    let count = r.u32("pcrSelections.count")?;
    let mut out = Vec::new();
    // TPM_NUM_PCR_BANKS is 16 at most.
    for _ in 0..count.min(16) {
        let alg = r.u16("pcrSelections.hash")?;
        let size = r.u8("pcrSelections.sizeofSelect")?;
        let select = r.bytes(usize::from(size), "pcrSelections.pcrSelect")?;
        let mut pcrs = Vec::new();
        for (i, byte) in select.iter().enumerate() {
            for bit in 0..8u8 {
                if byte & (1 << bit) != 0 {
                    // i < 256: sizeofSelect is a u8; PCR numbers above 255 are not for this
                    // module (a PC-client TPM has 24).
                    if let Ok(pcr) = u8::try_from(i * 8 + usize::from(bit)) {
                        pcrs.push(pcr);
                    }
                }
            }
        }
        out.push((alg, pcrs));
    }
    Ok(out)
}
