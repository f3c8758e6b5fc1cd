//! Unit tests of the tier rules: each rule refuses the dependency it forbids, and the table in
//! code is well formed.

use super::*;

fn member(dir: &str, deps: &[(&str, Kind)]) -> Member {
    let package = CRATES
        .iter()
        .find(|row| row.dir == dir)
        .map_or(format!("hawser-{dir}"), |row| row.package.to_owned());
    Member {
        dir: dir.into(),
        package,
        dependencies: deps
            .iter()
            .map(|(dir, kind)| Dependency {
                dir: (*dir).into(),
                kind: *kind,
            })
            .collect(),
    }
}

/// Every row as a member with no dependencies, then `extra` in place of its row's member.
fn workspace(extra: Member) -> Vec<Member> {
    CRATES
        .iter()
        .map(|row| {
            if row.dir == extra.dir {
                extra.clone()
            } else {
                member(row.dir, &[])
            }
        })
        .collect()
}

/// The violations of one dependency of `from` on `to`, as (crate, dependency, rule).
fn refused(from: &str, to: &str, kind: Kind) -> Vec<(String, Option<String>, Rule)> {
    check(CRATES, &workspace(member(from, &[(to, kind)])))
        .into_iter()
        .map(|v| (v.krate, v.dependency, v.rule))
        .collect()
}

fn one(from: &str, to: &str, rule: Rule) -> Vec<(String, Option<String>, Rule)> {
    vec![(from.into(), Some(to.into()), rule)]
}

#[test]
fn the_table_names_each_crate_once_and_its_exclusions_point_down() {
    let mut dirs: Vec<&str> = CRATES.iter().map(|row| row.dir).collect();
    dirs.sort_unstable();
    dirs.dedup();
    assert_eq!(dirs.len(), CRATES.len(), "a directory twice in the table");
    for row in CRATES {
        for never in row.never {
            let target = CRATES.iter().find(|r| r.dir == *never);
            assert!(
                target.is_some_and(|t| t.tier <= row.tier),
                "{}: `never` names {never}, which is no lower row",
                row.dir
            );
        }
    }
    // Tiers appear in order: the table is an order the crates can be built in.
    assert!(CRATES.windows(2).all(|w| w[0].tier <= w[1].tier));
}

#[test]
fn allowed_dependencies_pass() {
    assert_eq!(refused("luks2", "disk-format", Kind::Normal), vec![]);
    assert_eq!(refused("init", "attestation", Kind::Normal), vec![]);
    assert_eq!(refused("proto", "mesh", Kind::Normal), vec![]);
    assert_eq!(refused("local", "harness", Kind::Normal), vec![]);
    assert_eq!(refused("local", "cli", Kind::Normal), vec![]);
    assert_eq!(refused("qemu-tests", "harness", Kind::Dev), vec![]);
    assert_eq!(refused("harness", "image", Kind::Normal), vec![]);
}

#[test]
fn dev_dependencies_are_free() {
    assert_eq!(refused("attestation", "harness", Kind::Dev), vec![]);
    assert_eq!(refused("joinservice", "init", Kind::Dev), vec![]);
    assert_eq!(refused("standin", "joinservice", Kind::Dev), vec![]);
}

#[test]
fn an_upward_dependency_is_refused() {
    assert_eq!(
        refused("pcr", "measurements", Kind::Normal),
        one(
            "pcr",
            "measurements",
            Rule::Upward {
                from: Tier::Format,
                to: Tier::Engine
            }
        )
    );
    // Build dependencies count as normal ones.
    assert_eq!(
        refused("image", "cli", Kind::Build),
        one(
            "image",
            "cli",
            Rule::Upward {
                from: Tier::Engine,
                to: Tier::Program
            }
        )
    );
}

#[test]
fn a_later_row_of_the_same_tier_is_refused() {
    assert_eq!(
        refused("mesh", "proto", Kind::Normal),
        one("mesh", "proto", Rule::LaterInTier(Tier::Format))
    );
    assert_eq!(
        refused("cli", "local", Kind::Normal),
        one("cli", "local", Rule::LaterInTier(Tier::Program))
    );
}

#[test]
fn the_cli_may_not_link_the_harness_the_tests_or_the_join_service() {
    assert_eq!(
        refused("cli", "harness", Kind::Normal),
        one("cli", "harness", Rule::Harness)
    );
    assert_eq!(
        refused("cli", "qemu-tests", Kind::Normal),
        one("cli", "qemu-tests", Rule::OnTests)
    );
    assert_eq!(
        refused("cli", "joinservice", Kind::Normal),
        one("cli", "joinservice", Rule::Never)
    );
}

#[test]
fn pid_1_links_neither_the_image_builder_nor_the_prediction_engine() {
    assert_eq!(
        refused("init", "measurements", Kind::Normal),
        one("init", "measurements", Rule::Never)
    );
    assert_eq!(
        refused("init", "image", Kind::Normal),
        one("init", "image", Rule::Never)
    );
    assert_eq!(
        refused("init", "harness", Kind::Normal),
        one("init", "harness", Rule::Harness)
    );
}

#[test]
fn the_standalone_crates_stay_apart() {
    assert_eq!(
        refused("standin", "kube-types", Kind::Normal),
        one("standin", "kube-types", Rule::FromStandalone)
    );
    assert_eq!(
        refused("local", "tiers", Kind::Normal),
        one("local", "tiers", Rule::OnStandalone)
    );
    assert_eq!(
        refused("joinservice", "harness", Kind::Normal),
        one("joinservice", "harness", Rule::Harness)
    );
}

#[test]
fn members_and_rows_must_match() {
    let mut members = workspace(member("tiers", &[]));
    members.retain(|m| m.dir != "local");
    members.push(member("newcomer", &[("pe", Kind::Normal)]));
    members.push(Member {
        dir: "pe".into(),
        package: "hawser-pe-renamed".into(),
        dependencies: vec![],
    });
    members.retain(|m| !(m.dir == "pe" && m.package == "hawser-pe"));
    let violations: Vec<String> = check(CRATES, &members)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        violations,
        [
            "local: every row of the tier table is a workspace member",
            "newcomer: every workspace member is a row of the tier table",
            "pe: the table names the package `hawser-pe`, its Cargo.toml `hawser-pe-renamed`",
        ]
    );
}

#[test]
fn a_violation_names_crate_dependency_and_rule() {
    let violations = check(
        CRATES,
        &workspace(member("cli", &[("qemu-tests", Kind::Normal)])),
    );
    assert_eq!(
        violations[0].to_string(),
        "cli → qemu-tests: no crate's normal dependencies point at the QEMU tests"
    );
}

#[test]
fn the_markdown_table_has_a_row_per_crate_in_order() {
    let table = markdown_table(CRATES);
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(rows.len(), CRATES.len());
    assert!(rows[0].starts_with("| `disk-format/` | hawser-disk-format | format | "));
    assert!(
        table.contains("| `init/` | hawser-init | program | "),
        "{table}"
    );
    assert!(table.contains("| `image/`, `measurements/` |"), "{table}");
}
