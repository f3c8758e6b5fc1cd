//! The issuer against a real swtpm, and its output against the verifier and tpm2-tools.
//! Run with `cargo test -p hawser-attestation --features tpm`.
#![cfg(feature = "tpm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Swtpm;
use hawser_attestation::report::boot_report_qualifying_data;
use hawser_attestation::tpm::HashingAlgorithm;
use hawser_attestation::{
    BootReport, PhaseTiming, QuoteEvidence, REPORT_VERSION, Tpm, TpmError, VerifyError,
};
use hawser_pcr::{
    PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD, extend_sha256, phase_digest,
};
use sha2::{Digest, Sha256, Sha384, Sha512};

const ALL_PCRS: std::ops::RangeInclusive<u8> = 0..=23;

/// SHA-1 through coreutils, so the SHA-1 bank is checked without this crate's code.
fn sha1sum(data: &[u8]) -> Vec<u8> {
    let mut child = Command::new("sha1sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha1sum runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(data)
        .expect("write");
    let out = child.wait_with_output().expect("sha1sum output");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    hex::decode(text.split_whitespace().next().expect("digest")).expect("hex")
}

fn cat(a: &[u8], b: &[u8]) -> Vec<u8> {
    [a, b].concat()
}

/// What the PID 1 does: PCR 11 before, extend enter-initrd, read the bank, quote it all.
fn boot_report(tpm: &Tpm, nonce: &[u8]) -> BootReport {
    let before = tpm
        .read_pcrs_sha256([PCR_KERNEL_BOOT])
        .expect("read PCR 11")[&PCR_KERNEL_BOOT];
    tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
        .expect("extend enter-initrd");
    let pcrs = tpm.read_pcrs_sha256(ALL_PCRS).expect("read sha256 bank");
    let ak = tpm.create_attestation_key().expect("create AK");
    let all: Vec<u8> = ALL_PCRS.collect();
    let quote = tpm.quote_boot_report(&ak, nonce, &all).expect("quote");
    BootReport {
        report_version: REPORT_VERSION,
        hawser_version: "test".into(),
        kernel_release: "host".into(),
        tpm_device: tpm.tcti().into(),
        nonce: hex::encode(nonce),
        nonce_source: "generated".into(),
        pcr11_before_phase: hex::encode(before),
        phases_extended: vec![PHASE_ENTER_INITRD.into()],
        pcrs: pcrs
            .iter()
            .map(|(pcr, value)| (*pcr, hex::encode(value)))
            .collect(),
        quote,
        timings: vec![PhaseTiming {
            name: "tpm".into(),
            start_ms: 0.0,
            duration_ms: 1.0,
        }],
        init_started_at_ms: 0.0,
        warnings: vec![],
    }
}

#[test]
fn extend_phase_changes_pcr11_in_every_bank_as_predicted() {
    let swtpm = Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
    let banks = tpm.pcr_banks().expect("banks");
    assert_eq!(
        banks,
        [
            HashingAlgorithm::Sha1,
            HashingAlgorithm::Sha256,
            HashingAlgorithm::Sha384,
            HashingAlgorithm::Sha512
        ],
        "swtpm 0.7 allocates four banks by default"
    );

    for phase in [PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD] {
        let before: Vec<Vec<u8>> = banks
            .iter()
            .map(|&bank| tpm.read_pcrs(bank, [11]).expect("read")[&11].clone())
            .collect();
        let extended = tpm.extend_phase(PCR_KERNEL_BOOT, phase).expect("extend");
        assert_eq!(extended, banks, "every bank is extended for {phase}");
        for (&bank, old) in banks.iter().zip(&before) {
            let after = tpm.read_pcrs(bank, [11]).expect("read")[&11].clone();
            let expected = match bank {
                HashingAlgorithm::Sha1 => sha1sum(&cat(old, &sha1sum(phase.as_bytes()))),
                HashingAlgorithm::Sha256 => {
                    Sha256::digest(cat(old, &Sha256::digest(phase))).to_vec()
                }
                HashingAlgorithm::Sha384 => {
                    Sha384::digest(cat(old, &Sha384::digest(phase))).to_vec()
                }
                HashingAlgorithm::Sha512 => {
                    Sha512::digest(cat(old, &Sha512::digest(phase))).to_vec()
                }
                other => panic!("unexpected bank {other:?}"),
            };
            assert_eq!(
                hex::encode(after),
                hex::encode(expected),
                "{bank:?} after {phase}"
            );
        }
        // The pure prediction agrees with the TPM for the sha256 bank.
        let old: [u8; 32] = before[1].clone().try_into().expect("32 bytes");
        assert_eq!(
            tpm.read_pcrs_sha256([11]).expect("read")[&11],
            extend_sha256(&old, &phase_digest(phase))
        );
    }
    // Other PCRs are untouched.
    assert_eq!(tpm.read_pcrs_sha256([10, 12]).expect("read")[&12], [0; 32]);

    assert!(matches!(
        tpm.extend_phase(11, ""),
        Err(TpmError::EmptyPhase)
    ));
    assert!(matches!(
        tpm.extend_phase(24, PHASE_ENTER_INITRD),
        Err(TpmError::PcrIndex { pcr: 24 })
    ));
}

#[test]
fn reads_all_24_pcrs_despite_the_8_per_call_limit() {
    let swtpm = Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
    let pcrs = tpm.read_pcrs_sha256(ALL_PCRS).expect("read");
    assert_eq!(
        pcrs.keys().copied().collect::<Vec<_>>(),
        ALL_PCRS.collect::<Vec<_>>()
    );
    // After TPM2_Startup(CLEAR) PCRs 17..=22 (locality-4 PCRs) are all-ones, the rest zero.
    for (pcr, value) in &pcrs {
        let fill = if (17..=22).contains(pcr) { 0xff } else { 0 };
        assert_eq!(value, &[fill; 32], "PCR {pcr}");
    }
    let sha1 = tpm
        .read_pcrs(HashingAlgorithm::Sha1, ALL_PCRS)
        .expect("sha1");
    assert!(sha1.values().all(|v| v.len() == 20));
    assert!(matches!(
        tpm.read_pcrs_sha256([3, 24]),
        Err(TpmError::PcrIndex { pcr: 24 })
    ));
}

#[test]
fn attestation_key_is_deterministic_and_matches_tpm2_tools_template() {
    let swtpm = Swtpm::start();
    let (first_public, first_name) = {
        let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
        let a = tpm.create_attestation_key().expect("AK 1");
        let b = tpm
            .create_attestation_key()
            .expect("AK 2 while AK 1 is loaded");
        assert_eq!(a.public_tpm2b(), b.public_tpm2b());
        assert_eq!(a.name(), b.name());
        drop((a, b));
        let c = tpm.create_attestation_key().expect("AK 3");
        (c.public_tpm2b().to_vec(), c.name().to_vec())
    };
    // A new connection (as after a reboot of the guest) derives the same key.
    {
        let tpm = Tpm::open(&swtpm.tcti()).expect("reopen swtpm");
        let again = tpm.create_attestation_key().expect("AK again");
        assert_eq!(again.public_tpm2b(), first_public.as_slice());
    }

    // tpm2-tools with the template documented in the tpm module creates the very same key.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = swtpm.tpm2_tool(
        "tpm2_createprimary",
        &[
            "-C",
            "e",
            "-G",
            "ecc256:ecdsa-sha256:null",
            "-g",
            "sha256",
            "-a",
            "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign",
            "-c",
            "ak.ctx",
        ],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = swtpm.tpm2_tool(
        "tpm2_readpublic",
        &["-c", "ak.ctx", "-f", "tss", "-o", "ak.pub", "-n", "ak.name"],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    swtpm.tpm2_tool("tpm2_flushcontext", &["-t"], dir.path());
    let tools_public = std::fs::read(dir.path().join("ak.pub")).expect("ak.pub");
    let tools_name = std::fs::read(dir.path().join("ak.name")).expect("ak.name");
    assert_eq!(hex::encode(tools_public), hex::encode(&first_public));
    assert_eq!(hex::encode(tools_name), hex::encode(&first_name));
}

#[test]
fn transient_handles_are_flushed() {
    let swtpm = Swtpm::start();
    {
        let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
        // swtpm has 3 transient object slots: without flushing, the 4th create fails (0x902).
        for i in 0..10 {
            let ak = tpm
                .create_attestation_key()
                .unwrap_or_else(|e| panic!("AK #{i}: {e}"));
            let quote = tpm.quote(&ak, b"n", &[11]);
            quote.expect("quote");
        }
        // A guard kept alive while the connection stays open holds its slot until dropped.
        let _kept = tpm.create_attestation_key().expect("kept AK");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = swtpm.tpm2_tool("tpm2_getcap", &["handles-transient"], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "",
        "no transient object is left loaded"
    );
}

#[test]
fn quote_becomes_a_boot_report_that_verifies() {
    let swtpm = Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
    let nonce = tpm.get_random(32).expect("nonce");
    let report = boot_report(&tpm, &nonce);

    // Through the console line, as the harness reads it.
    let line = report.to_console_line().expect("serialise");
    let parsed = BootReport::find_in_console(&format!("boot noise\n{line}\n"))
        .expect("report line")
        .expect("parses");
    let verified = parsed.verify(Some(&nonce)).expect("report verifies");

    let ak = tpm.create_attestation_key().expect("AK");
    assert_eq!(verified.quote.ak_name, ak.name());
    verified.quote.ensure_ak_name(ak.name()).expect("pinned AK");
    assert_eq!(verified.nonce, nonce);
    assert_eq!(verified.quote.nonce, boot_report_qualifying_data(&nonce));
    assert_eq!(verified.pcrs.len(), 24);
    assert_eq!(verified.pcr11_before_phase, [0; 32]);
    assert_eq!(
        verified.pcrs[&11],
        extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD))
    );
    assert!(verified.quote.clock_info.safe);
    assert_ne!(verified.quote.firmware_version, 0);
    assert_eq!(
        verified.quote.ak_fingerprint,
        <[u8; 32]>::from(Sha256::digest(verified.quote.ak_public_point))
    );

    // A second quote with another nonce verifies with that nonce only.
    let nonce2 = tpm.get_random(32).expect("nonce 2");
    let all: Vec<u8> = ALL_PCRS.collect();
    let mut report2 = report.clone();
    report2.quote = tpm.quote_boot_report(&ak, &nonce2, &all).expect("quote 2");
    report2.nonce = hex::encode(&nonce2);
    let verified2 = report2
        .verify(Some(&nonce2))
        .expect("second quote verifies");
    // Same boot of the TPM: same reset count, a clock that did not go backwards.
    let (c1, c2) = (verified.quote.clock_info, verified2.quote.clock_info);
    assert_eq!(c1.reset_count, c2.reset_count);
    assert!(c2.clock >= c1.clock, "{c1:?} then {c2:?}");
    assert!(matches!(
        report2.verify(Some(&nonce)),
        Err(VerifyError::UnexpectedNonce { .. })
    ));
}

#[test]
fn tampered_reports_are_refused_with_the_reason() {
    let swtpm = Swtpm::start();
    let other_swtpm = Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
    let nonce = tpm.get_random(32).expect("nonce");
    let report = boot_report(&tpm, &nonce);
    report
        .verify(Some(&nonce))
        .expect("untampered report verifies");

    // A PCR value that is not what the TPM quoted.
    let mut r = report.clone();
    r.pcrs.insert(4, "aa".repeat(32));
    let err = r.verify(Some(&nonce)).expect_err("tampered PCR 4");
    assert!(matches!(err, VerifyError::PcrDigest { .. }), "{err}");

    // PCR 11 claimed consistently but with a different starting value.
    let mut r = report.clone();
    r.pcr11_before_phase = "bb".repeat(32);
    let err = r.verify(Some(&nonce)).expect_err("tampered PCR 11 base");
    assert!(matches!(err, VerifyError::Pcr11Replay { .. }), "{err}");

    // The verifier's nonce is not the one quoted (a replayed report).
    let err = report.verify(Some(&[7; 32])).expect_err("wrong nonce");
    assert!(matches!(err, VerifyError::UnexpectedNonce { .. }), "{err}");

    // The report's nonce field does not match the quote's extraData.
    let mut r = report.clone();
    r.nonce = hex::encode([7; 32]);
    let err = r.verify(None).expect_err("nonce field changed");
    assert!(matches!(err, VerifyError::NonceMismatch { .. }), "{err}");

    // The AK of another TPM in place of the signer.
    let other_ak = {
        let other = Tpm::open(&other_swtpm.tcti()).expect("open other swtpm");
        let ak = other.create_attestation_key().expect("other AK");
        assert!(matches!(
            tpm.quote(&ak, &nonce, &[11]),
            Err(TpmError::ForeignKey)
        ));
        hex::encode(ak.public_tpm2b())
    };
    assert_ne!(other_ak, report.quote.ak_public);
    let mut r = report.clone();
    r.quote.ak_public = other_ak;
    let err = r.verify(Some(&nonce)).expect_err("other AK");
    assert!(matches!(err, VerifyError::SignatureInvalid { .. }), "{err}");

    // One flipped byte of s.
    let mut r = report.clone();
    let mut sig = hex::decode(&r.quote.signature).expect("hex");
    let last = sig.len() - 1;
    sig[last] ^= 0x80;
    r.quote.signature = hex::encode(sig);
    let err = r.verify(Some(&nonce)).expect_err("flipped signature byte");
    assert!(matches!(err, VerifyError::SignatureInvalid { .. }), "{err}");

    // A truncated attest.
    let mut r = report.clone();
    let attest = hex::decode(&r.quote.attest).expect("hex");
    r.quote.attest = hex::encode(&attest[..attest.len() - 5]);
    let err = r.verify(Some(&nonce)).expect_err("truncated attest");
    assert!(
        matches!(
            err,
            VerifyError::Parse {
                field: "quote.attest",
                ..
            }
        ),
        "{err}"
    );
    let chain = hawser_attestation::error_chain(&err);
    assert!(chain.contains("pcrDigest"), "{chain}");

    // Fewer PCRs declared than quoted.
    let mut r = report.clone();
    r.quote.pcr_selection.pop();
    let err = r.verify(Some(&nonce)).expect_err("selection changed");
    assert!(matches!(err, VerifyError::PcrSelection { .. }), "{err}");
}

#[test]
fn tpm2_checkquote_accepts_our_quote() {
    let swtpm = Swtpm::start();
    let nonce: Vec<u8> = (0u8..32).collect();
    let quote: QuoteEvidence = {
        let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
        tpm.extend_phase(11, PHASE_ENTER_INITRD).expect("extend");
        let ak = tpm.create_attestation_key().expect("AK");
        tpm.quote(&ak, &nonce, &ALL_PCRS.collect::<Vec<_>>())
            .expect("quote")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, value) in [
        ("ak.pub", &quote.ak_public),
        ("attest.bin", &quote.attest),
        ("sig.bin", &quote.signature),
    ] {
        std::fs::write(dir.path().join(file), hex::decode(value).expect("hex")).expect("write");
    }
    // A missing tpm2_checkquote fails naming its Debian package (tpm2-tools).
    let tpm2_checkquote = hawser_harness::find_binary(std::path::Path::new("tpm2_checkquote"))
        .unwrap_or_else(|e| panic!("{e}"));
    let checkquote = |qualification: &str| {
        Command::new(&tpm2_checkquote)
            .args([
                "-u",
                "ak.pub",
                "-m",
                "attest.bin",
                "-s",
                "sig.bin",
                "-g",
                "sha256",
            ])
            .args(["-q", qualification])
            .current_dir(dir.path())
            .output()
            .expect("tpm2_checkquote runs")
    };
    let out = checkquote(&hex::encode(&nonce));
    assert!(
        out.status.success(),
        "tpm2_checkquote refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And it does notice a wrong nonce, so the success above means something.
    let out = checkquote(&hex::encode([0u8; 32]));
    assert!(!out.status.success());
}

#[test]
fn get_random_returns_the_requested_length() {
    let swtpm = Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
    for n in [0, 1, 32, 33, 100] {
        assert_eq!(tpm.get_random(n).expect("random").len(), n);
    }
    assert_ne!(
        tpm.get_random(32).expect("a"),
        tpm.get_random(32).expect("b")
    );
}

#[test]
fn handles_can_move_to_blocking_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tpm>();
    assert_send_sync::<hawser_attestation::AttestationKey>();

    let swtpm = Swtpm::start();
    let tpm = std::sync::Arc::new(Tpm::open(&swtpm.tcti()).expect("open swtpm"));
    let ak = tpm.create_attestation_key().expect("AK");
    let worker = {
        let tpm = std::sync::Arc::clone(&tpm);
        std::thread::spawn(move || tpm.quote(&ak, b"from another thread", &[11]))
    };
    let quote = worker.join().expect("thread").expect("quote");
    quote.verify(b"from another thread").expect("verifies");
}

#[test]
fn open_names_the_bad_tcti() {
    let err = Tpm::open("nonsense:xyz").expect_err("bad TCTI");
    assert!(err.to_string().contains("nonsense:xyz"), "{err}");
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Prints the medians (`--nocapture` to see them); fails only if swtpm is absurdly slow.
#[test]
fn latency_of_ak_creation_and_quote() {
    const N: usize = 25;
    let swtpm = Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).expect("open swtpm");
    let all: Vec<u8> = ALL_PCRS.collect();
    let nonce = [0x5a; 32];
    let mut create = Vec::with_capacity(N);
    let mut quote = Vec::with_capacity(N);
    let mut flush = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let ak = tpm.create_attestation_key().expect("AK");
        create.push(t.elapsed());
        let t = Instant::now();
        tpm.quote(&ak, &nonce, &all).expect("quote");
        quote.push(t.elapsed());
        let t = Instant::now();
        drop(ak);
        flush.push(t.elapsed());
    }
    let (create, quote, flush) = (median(create), median(quote), median(flush));
    eprintln!(
        "swtpm latency (median of {N}): AK create {create:?}, quote of 24 PCRs {quote:?}, flush {flush:?}"
    );
    assert!(create < Duration::from_secs(2) && quote < Duration::from_secs(2));
}
