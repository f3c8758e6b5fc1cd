//! What verifying each platform's genuine evidence costs a verifier's CPU, side by side in one
//! run, rounds interleaved (gce, azure-snp, azure-tdx, sev-snp, tdx, gce, …) so load from
//! elsewhere on the machine hits all alike; each is also given as a multiple of GCE's, the
//! simplest chain (two certificates, one RSA quote signature).
//!
//! `cargo bench -p hawser-platforms --bench verify` (prints a table). `HAWSER_BENCH_ROUNDS`
//! (default 5) rounds of `HAWSER_BENCH_VERIFICATIONS` (default 200) verifications each.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failed assumption fails it

use std::time::Instant;

use hawser_platforms::profile::{self, Platform, PlatformEvidence};
use hawser_platforms::tdx::TdxPolicy;

#[path = "../tests/common/mod.rs"]
mod common;
use common::*;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rounds = env("HAWSER_BENCH_ROUNDS", 5);
    let per_round = env("HAWSER_BENCH_VERIFICATIONS", 200);

    let gce = GceVector::load();
    let gce_intermediates = [gce.intermediate.as_slice()];
    let gce_roots = [gce.root.as_slice()];
    let gce_policy = hawser_platforms::gce::GcePolicy::default();
    let gce_evidence = PlatformEvidence::Gce {
        evidence: gce.evidence(&gce_intermediates, &gce.pcrs),
        roots: &gce_roots,
        policy: &gce_policy,
    };

    let snp = AzureSnpVector::load();
    let snp_policy = azure_snp_policy();
    let snp_nonce = hex::decode(AZURE_SNP_NONCE).unwrap();
    let azure_snp = PlatformEvidence::Azure {
        evidence: snp.evidence(&snp_policy),
        roots: &[],
    };

    let tdx = AzureTdxVector::load();
    let tdx_policy = TdxPolicy::default();
    let tdx_intermediates = tdx.intermediates();
    let azure_roots = [tdx.root.as_slice()];
    let azure_tdx = PlatformEvidence::Azure {
        evidence: tdx.evidence(&tdx_policy, Some(&tdx_intermediates)),
        roots: &azure_roots,
    };

    let report = virtee_report();
    let chain = virtee_chain();
    let bare_policy = virtee_policy(&report);
    let bare_snp = PlatformEvidence::SevSnp {
        report: &report,
        endorsement: chain.endorsement(),
        policy: &bare_policy,
    };

    let quote = vector("tdx/tdx_quote");
    let collateral = tdx_collateral("tdx/tdx_quote_collateral.json");
    let bare_tdx = PlatformEvidence::Tdx {
        quote: &quote,
        collateral: &collateral,
        policy: &tdx_policy,
    };

    let cases: [(&str, Platform, &PlatformEvidence<'_>, &[u8], _); 5] = [
        ("gce", Platform::Gce, &gce_evidence, &GCE_NONCE[..], GCE_AT),
        (
            "azure-snp",
            Platform::AzureSnp,
            &azure_snp,
            &snp_nonce[..],
            AZURE_SNP_AT,
        ),
        (
            "azure-tdx (AK certificate too)",
            Platform::AzureTdx,
            &azure_tdx,
            &AZURE_NONCE[..],
            AZURE_TDX_AT,
        ),
        ("sev-snp", Platform::SevSnp, &bare_snp, &[][..], VIRTEE_AT),
        ("tdx", Platform::Tdx, &bare_tdx, &[][..], TDX_AT),
    ];
    let mut micros: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (_, platform, evidence, nonce, at)) in cases.iter().enumerate() {
            let start = Instant::now();
            for _ in 0..per_round {
                profile::verify(*platform, evidence, nonce, *at).unwrap();
            }
            micros[i].push(start.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
    }
    let medians: Vec<f64> = micros.iter_mut().map(|m| median(m)).collect();
    println!(
        "verifications of each platform's genuine evidence: {rounds} rounds x {per_round}, \
         interleaved; median (min-max) per verification"
    );
    println!("| profile | µs per verification | verifications/s | × gce |");
    println!("|---|---|---|---|");
    for (i, (name, ..)) in cases.iter().enumerate() {
        let (min, max) = min_max(&micros[i]);
        println!(
            "| {name} | {:.0} ({min:.0}–{max:.0}) | {:.0} | {:.1}× |",
            medians[i],
            1e6 / medians[i],
            medians[i] / medians[0]
        );
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)))
}
