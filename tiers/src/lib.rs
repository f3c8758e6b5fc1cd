//! hawser-tiers: the workspace's crates in tiers, as data, and the rule their manifests keep.
//!
//! [`CRATES`] is THE tier table: every workspace member, its tier and its role in one line, in
//! order. `docs/architecture.md` shows the same table (a test checks the two are equal), and
//! `tests/tiers.rs` reads every member's `Cargo.toml` ([`manifest`]) and holds its
//! dependencies against [`check`]:
//!
//! - a crate's normal and build dependencies point only at crates of a lower tier, or earlier
//!   in its own tier (so the order of the table is an order the crates can be built in);
//! - no crate's normal dependencies point at the QEMU tests (`qemu-tests`, tier
//!   [`Tier::Tests`]) or at a stand-alone crate (`standin`, `tiers`), and a stand-alone crate
//!   imports no hawser crate: the stand-ins stay a second opinion;
//! - the VM harness is a normal dependency only of the local-cluster simulator (`local`);
//!   anyone may use it as a dev-dependency (the QEMU tests do);
//! - a row's [`Crate::never`] names crates of lower tiers it must still not use (PID 1 links
//!   neither the image builder nor the prediction engine; the admin CLI does not link the join
//!   service).
//!
//! Dev-dependencies are free: a test may use anything. [`sizes`] holds the size rules for
//! source files, [`modules`] the check that no two modules of one directory import each other
//! around a circle; `tests/sizes.rs` and `tests/modules.rs` apply them to the tree.

pub mod manifest;
pub mod modules;
pub mod sizes;

use std::collections::BTreeMap;
use std::fmt;

/// A crate's tier. Formats are at the bottom; a dependency points down (or, within a tier, to
/// an earlier row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Pure formats: no I/O, so that the program that writes a format and the one that reads
    /// it share one definition.
    Format,
    /// Engines: the libraries that do the work (TPM evidence, prediction, builds, the join
    /// service, the tunnel), over the formats.
    Engine,
    /// The VM harness: QEMU, swtpm, OVMF, QMP, the console.
    Harness,
    /// Programs: PID 1, the admin CLI, the local-cluster simulator.
    Program,
    /// The QEMU end-to-end tests and benchmarks: nothing depends on them.
    Tests,
    /// Beside the tiers: imports no hawser crate and is imported by none.
    Standalone,
}

impl Tier {
    /// The word the tables use.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Format => "format",
            Tier::Engine => "engine",
            Tier::Harness => "harness",
            Tier::Program => "program",
            Tier::Tests => "tests",
            Tier::Standalone => "standalone",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One row of the tier table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crate {
    /// The member's directory, as the root `Cargo.toml` lists it.
    pub dir: &'static str,
    /// The package name in its `Cargo.toml`.
    pub package: &'static str,
    /// Its tier.
    pub tier: Tier,
    /// What it is, in one line.
    pub role: &'static str,
    /// Directories of crates it must not depend on even though their tier is lower.
    pub never: &'static [&'static str],
}

const fn row(dir: &'static str, package: &'static str, tier: Tier, role: &'static str) -> Crate {
    Crate {
        dir,
        package,
        tier,
        role,
        never: &[],
    }
}

/// THE tier table, in order: every workspace member once.
pub const CRATES: &[Crate] = &[
    row(
        "disk-format",
        "hawser-disk-format",
        Tier::Format,
        "GUID, GPT and partition types, root hash to PARTUUID, the dm-verity superblock",
    ),
    row(
        "luks2",
        "hawser-luks2",
        Tier::Format,
        "the LUKS2 header hawser writes and reads: parse, validate, write",
    ),
    row(
        "pe",
        "hawser-pe",
        Tier::Format,
        "the PE/COFF reader for UKIs and stubs: headers, sections, offsets",
    ),
    row(
        "pcr",
        "hawser-pcr",
        Tier::Format,
        "PCR indices, the sha256 extend, boot-phase words, the node lock's PCR 15, the event log's console marker",
    ),
    row(
        "kube-types",
        "hawser-kube-types",
        Tier::Format,
        "bootstrap token, CA cert hash, CIDR, DNS name, endpoint, version, the join ticket",
    ),
    row(
        "keys",
        "hawser-keys",
        Tier::Format,
        "HKDF key derivation from the cluster master secret",
    ),
    row(
        "kmod",
        "hawser-kmod",
        Tier::Format,
        "kernel-module dependency resolution",
    ),
    row(
        "mesh",
        "hawser-mesh",
        Tier::Format,
        "WireGuard keys, VPN addresses, the versioned peer registry, peer updates, the polling agent's logic",
    ),
    row(
        "proto",
        "hawser-proto",
        Tier::Format,
        "the wire formats: protobuf and gRPC (the mesh's messages convert to mesh/'s types)",
    ),
    row(
        "attestation",
        "hawser-attestation",
        Tier::Engine,
        "TPM evidence: issuer (TPM 2.0 commands, pure Rust), verifier, boot report, aTLS",
    ),
    row(
        "cluster-store",
        "hawser-cluster-store",
        Tier::Engine,
        "the join service's cluster state (files or etcd): disks, approvals, the mesh's members",
    ),
    row(
        "platforms",
        "hawser-platforms",
        Tier::Engine,
        "confidential-computing platforms' evidence (GCE, Azure, SEV-SNP, TDX): verifiers behind the validator, the node side's reads",
    ),
    row(
        "measurements",
        "hawser-measurements",
        Tier::Engine,
        "PCR prediction from a UKI, event logs, reference measurement files",
    ),
    row(
        "image",
        "hawser-image",
        Tier::Engine,
        "reproducible builds: inputs, initramfs, UKI, rootfs, disk image",
    ),
    row(
        "discovery",
        "hawser-discovery",
        Tier::Engine,
        "finding the join service: mDNS advert and browser, DNS SRV",
    ),
    row(
        "mesh-device",
        "hawser-mesh-device",
        Tier::Engine,
        "the mesh's tunnel: a batched packet loop on boringtun's noise, tun offloads, netlink",
    ),
    row(
        "joinservice",
        "hawser-joinservice",
        Tier::Engine,
        "hawser-joind: verifies joining nodes, derives disk keys, issues join tickets",
    ),
    row(
        "harness",
        "hawser-harness",
        Tier::Harness,
        "the VM harness: QEMU, swtpm, OVMF, QMP, console",
    ),
    Crate {
        never: &["image", "measurements"],
        ..row(
            "init",
            "hawser-init",
            Tier::Program,
            "PID 1 in the initramfs: bring-up, TPM, state disk, pivot, node",
        )
    },
    Crate {
        never: &["joinservice"],
        ..row(
            "cli",
            "hawser-cli",
            Tier::Program,
            "hawser, the admin and image-developer CLI",
        )
    },
    row(
        "local",
        "hawser-local",
        Tier::Program,
        "hawser-local, the local-cluster simulator behind `hawser local`",
    ),
    row(
        "qemu-tests",
        "hawser-qemu",
        Tier::Tests,
        "the QEMU end-to-end tests and benchmarks",
    ),
    row(
        "standin",
        "hawser-standin",
        Tier::Standalone,
        "honest stand-ins for kubeadm and kubelet, a second opinion",
    ),
    row(
        "tiers",
        "hawser-tiers",
        Tier::Standalone,
        "this table, checked against the manifests, and the size rules",
    ),
];

/// The crates the VM harness may be a normal dependency of.
pub const HARNESS_USERS: &[&str] = &["local"];

/// How a dependency is declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `[dependencies]` (also optional and target-specific ones).
    Normal,
    /// `[build-dependencies]`.
    Build,
    /// `[dev-dependencies]`: tests, benches and examples only.
    Dev,
}

/// A dependency of a member on another member.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dependency {
    /// The directory of the member it points at.
    pub dir: String,
    /// How it is declared.
    pub kind: Kind,
}

/// A workspace member as its manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its directory, as the root `Cargo.toml` lists it.
    pub dir: String,
    /// Its package name.
    pub package: String,
    /// Its dependencies on other members (registry crates are left out).
    pub dependencies: Vec<Dependency>,
}

/// Which rule a member or a dependency breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// A member the table does not list.
    NotInTable,
    /// A row of the table that is not a member.
    NotAMember,
    /// The manifest's package name is not the table's.
    PackageName {
        /// The table's name.
        expected: &'static str,
        /// The manifest's.
        found: String,
    },
    /// A dependency on a crate of a higher tier.
    Upward {
        /// The crate's tier.
        from: Tier,
        /// The dependency's.
        to: Tier,
    },
    /// A dependency on a later row of the same tier.
    LaterInTier(Tier),
    /// A normal dependency on the QEMU tests.
    OnTests,
    /// A normal dependency on a stand-alone crate.
    OnStandalone,
    /// A stand-alone crate with a normal dependency on a hawser crate.
    FromStandalone,
    /// The harness as a normal dependency of a crate other than [`HARNESS_USERS`].
    Harness,
    /// A dependency the row's [`Crate::never`] excludes.
    Never,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::NotInTable => write!(f, "every workspace member is a row of the tier table"),
            Rule::NotAMember => write!(f, "every row of the tier table is a workspace member"),
            Rule::PackageName { expected, found } => write!(
                f,
                "the table names the package `{expected}`, its Cargo.toml `{found}`"
            ),
            Rule::Upward { from, to } => write!(
                f,
                "a crate depends only on lower tiers or earlier rows of its own ({from} may not \
                 use {to})"
            ),
            Rule::LaterInTier(tier) => write!(
                f,
                "within the {tier} tier a crate depends only on earlier rows of the table"
            ),
            Rule::OnTests => write!(f, "no crate's normal dependencies point at the QEMU tests"),
            Rule::OnStandalone => write!(
                f,
                "no crate's normal dependencies point at a stand-alone crate (standin, tiers)"
            ),
            Rule::FromStandalone => write!(
                f,
                "a stand-alone crate imports no hawser crate in its normal dependencies"
            ),
            Rule::Harness => write!(
                f,
                "the VM harness is a normal dependency only of {} (a dev-dependency of anyone)",
                HARNESS_USERS.join(" and ")
            ),
            Rule::Never => write!(f, "the tier table's row excludes this dependency"),
        }
    }
}

/// A broken rule, naming the crate, the dependency (if the rule is about one) and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The member's directory (or the table row's).
    pub krate: String,
    /// The dependency's directory, for a rule about a dependency.
    pub dependency: Option<String>,
    /// The rule.
    pub rule: Rule,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.dependency {
            Some(dependency) => write!(f, "{} → {}: {}", self.krate, dependency, self.rule),
            None => write!(f, "{}: {}", self.krate, self.rule),
        }
    }
}

/// Holds `members` against the tier table `table`: every member a row and every row a member,
/// the package names, and each normal and build dependency against the rules (module docs).
/// Empty when all hold.
pub fn check(table: &[Crate], members: &[Member]) -> Vec<Violation> {
    let rows: BTreeMap<&str, (usize, &Crate)> = table
        .iter()
        .enumerate()
        .map(|(at, row)| (row.dir, (at, row)))
        .collect();
    let mut violations = Vec::new();
    let violation = |krate: &str, dependency: Option<&str>, rule| Violation {
        krate: krate.to_owned(),
        dependency: dependency.map(str::to_owned),
        rule,
    };
    for row in table {
        if !members.iter().any(|m| m.dir == row.dir) {
            violations.push(violation(row.dir, None, Rule::NotAMember));
        }
    }
    for member in members {
        let Some(&(at, row)) = rows.get(member.dir.as_str()) else {
            violations.push(violation(&member.dir, None, Rule::NotInTable));
            continue;
        };
        if member.package != row.package {
            violations.push(violation(
                &member.dir,
                None,
                Rule::PackageName {
                    expected: row.package,
                    found: member.package.clone(),
                },
            ));
        }
        for dependency in &member.dependencies {
            if dependency.kind == Kind::Dev {
                continue;
            }
            let Some(&(dep_at, dep_row)) = rows.get(dependency.dir.as_str()) else {
                // Not a row: reported once, as a member missing from the table.
                continue;
            };
            if let Some(rule) = broken_rule((at, row), (dep_at, dep_row)) {
                violations.push(violation(&member.dir, Some(&dependency.dir), rule));
            }
        }
    }
    violations
}

/// The first rule a normal or build dependency of `row` (at index `at`) on `dep` breaks.
fn broken_rule((at, row): (usize, &Crate), (dep_at, dep): (usize, &Crate)) -> Option<Rule> {
    if dep.tier == Tier::Tests {
        return Some(Rule::OnTests);
    }
    if dep.tier == Tier::Standalone {
        return Some(Rule::OnStandalone);
    }
    if row.tier == Tier::Standalone {
        return Some(Rule::FromStandalone);
    }
    if dep.tier == Tier::Harness && !HARNESS_USERS.contains(&row.dir) {
        return Some(Rule::Harness);
    }
    if row.never.contains(&dep.dir) {
        return Some(Rule::Never);
    }
    if dep.tier > row.tier {
        return Some(Rule::Upward {
            from: row.tier,
            to: dep.tier,
        });
    }
    if dep.tier == row.tier && dep_at >= at {
        return Some(Rule::LaterInTier(row.tier));
    }
    None
}

/// The tier table as `docs/architecture.md` shows it: a Markdown table with the columns
/// `crate | package | tier | role` (and `never`), one row per line of `CRATES`.
pub fn markdown_table(table: &[Crate]) -> String {
    let mut out = String::from(
        "| crate | package | tier | role | never depends on |\n|---|---|---|---|---|\n",
    );
    for row in table {
        let never: Vec<String> = row.never.iter().map(|dir| format!("`{dir}/`")).collect();
        out.push_str(&format!(
            "| `{}/` | {} | {} | {} | {} |\n",
            row.dir,
            row.package,
            row.tier,
            row.role,
            never.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests;
