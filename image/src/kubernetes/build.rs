//! Building the Kubernetes binaries reproducibly from an unpacked input.
//!
//! The build is data first ([`go_build_step`], [`openapi_steps`]): each step a program, its
//! arguments, its directory and a closed environment (nothing from the caller's: `PATH`,
//! `GOROOT`, `GOPATH`, `HOME`, `GOCACHE`, `GOFLAGS` set, the rest cleared). GOPATH mode
//! (`GO111MODULE=off`: module mode asks to update `go.mod`), `CGO_ENABLED=0` (static binaries),
//! `-trimpath`, and `-ldflags "-s -w -buildid="` with the version variables of both version
//! packages set from the lock and the build date from `SOURCE_DATE_EPOCH`. kube-apiserver first
//! needs `pkg/generated/openapi/zz_generated.openapi.go`, which the release tarball lacks: the
//! vendored `openapi-gen` makes it from the packages tagged
//! `+k8s:openapi-gen=`, and its rule-violation report must equal the tree's known list.
//!
//! Each binary is kept at `<lock dir>/bin/<name>` with its sha256 in `bin/manifest.json`; a
//! binary there whose sha256 matches the manifest is reused, not rebuilt.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::fetch::IMPORT_PATH;
use super::{KubernetesError, KubernetesLock, Unpacked};
use crate::tool::{self, io_error};

// Where `Binary` used to be; the lock names binaries too, and must not import the build.
pub use super::binary::Binary;

/// One command of the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What the progress line says.
    pub label: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// The complete environment; nothing else is inherited.
    pub env: BTreeMap<String, String>,
}

impl Step {
    /// The command to run: the plan's environment only.
    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .current_dir(&self.cwd)
            .env_clear()
            .envs(&self.env);
        cmd
    }
}

/// `buildDate` of the version packages: `SOURCE_DATE_EPOCH` as RFC 3339 UTC.
pub fn build_date(epoch: u64) -> Result<String, KubernetesError> {
    i64::try_from(epoch)
        .ok()
        .and_then(|secs| time::OffsetDateTime::from_unix_timestamp(secs).ok())
        .and_then(|at| {
            at.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .ok_or(KubernetesError::BuildDate(epoch))
}

/// The `-ldflags` of every binary: stripped, no build ID, the version of the lock.
pub fn ldflags(lock: &KubernetesLock, epoch: u64) -> Result<String, KubernetesError> {
    let date = build_date(epoch)?;
    let mut flags = String::from("-s -w -buildid=");
    let v = lock.version.trim_start_matches('v');
    let mut parts = v.split('.');
    let (major, minor) = (parts.next().unwrap_or("0"), parts.next().unwrap_or("0"));
    for pkg in ["component-base/version", "client-go/pkg/version"] {
        let var = format!("{IMPORT_PATH}/vendor/k8s.io/{pkg}");
        for (name, value) in [
            ("gitVersion", lock.version.as_str()),
            ("gitCommit", lock.git_commit.as_str()),
            ("gitTreeState", "clean"),
            ("buildDate", date.as_str()),
            ("gitMajor", major),
            ("gitMinor", minor),
        ] {
            flags.push_str(&format!(" -X {var}.{name}={value}"));
        }
    }
    Ok(flags)
}

/// The closed environment of every Go command.
pub fn go_env(unpacked: &Unpacked) -> BTreeMap<String, String> {
    let s = |p: &Path| p.display().to_string();
    let dir = &unpacked.dir;
    [
        ("PATH", format!("{}/bin:/usr/bin:/bin", s(&unpacked.goroot))),
        ("GOROOT", s(&unpacked.goroot)),
        ("GOPATH", s(&unpacked.gopath)),
        ("HOME", s(&dir.join("home"))),
        ("GOCACHE", s(&dir.join("gocache"))),
        ("TMPDIR", s(&dir.join("tmp"))),
        ("GOFLAGS", String::new()),
        ("GO111MODULE", "off".into()),
        ("CGO_ENABLED", "0".into()),
        ("GOOS", "linux".into()),
        ("GOARCH", "amd64".into()),
        ("LC_ALL", "C".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Where a binary is kept.
pub fn binary_path(unpacked: &Unpacked, binary: Binary) -> PathBuf {
    unpacked.dir.join("bin").join(binary.name())
}

/// The `go build` of one binary, writing it to `out`.
pub fn go_build_step(
    unpacked: &Unpacked,
    lock: &KubernetesLock,
    epoch: u64,
    binary: Binary,
    out: &Path,
) -> Result<Step, KubernetesError> {
    Ok(Step {
        label: format!("build {}", binary.name()),
        program: unpacked.goroot.join("bin/go"),
        args: vec![
            "build".into(),
            "-trimpath".into(),
            "-ldflags".into(),
            ldflags(lock, epoch)?,
            "-o".into(),
            out.display().to_string(),
            format!("./cmd/{}", binary.name()),
        ],
        cwd: unpacked.source.clone(),
        env: go_env(unpacked),
    })
}

/// The OpenAPI generation: build the vendored openapi-gen, then run it over `tagged` (import
/// paths) into `pkg/generated/openapi`, its violation report to `report`.
pub fn openapi_steps(unpacked: &Unpacked, tagged: &[String], report: &Path) -> Vec<Step> {
    let tool = unpacked.dir.join("tools/openapi-gen");
    let env = go_env(unpacked);
    vec![
        Step {
            label: "build openapi-gen".into(),
            program: unpacked.goroot.join("bin/go"),
            args: vec![
                "build".into(),
                "-trimpath".into(),
                "-o".into(),
                tool.display().to_string(),
                "./vendor/k8s.io/kube-openapi/cmd/openapi-gen".into(),
            ],
            cwd: unpacked.source.clone(),
            env: env.clone(),
        },
        Step {
            label: format!("openapi-gen over {} packages", tagged.len()),
            program: tool,
            args: vec![
                "--logtostderr".into(),
                "-i".into(),
                tagged.join(","),
                "-p".into(),
                format!("{IMPORT_PATH}/{OPENAPI_PKG}"),
                "-O".into(),
                "zz_generated.openapi".into(),
                "-h".into(),
                "vendor/k8s.io/code-generator/hack/boilerplate.go.txt".into(),
                "-r".into(),
                report.display().to_string(),
            ],
            cwd: unpacked.source.clone(),
            env,
        },
    ]
}

const OPENAPI_PKG: &str = "pkg/generated/openapi";
const KNOWN_VIOLATIONS: &str = "api/api-rules/violation_exceptions.list";

/// The import paths of the packages tagged `+k8s:openapi-gen=`, as the tree's
/// `build/root/Makefile.generated_files` finds them for `pkg/generated/openapi`: `.go` files
/// with a `// +k8s:` tag line, outside top-level `_*`, `.*` and `vendor/` (the staging tree
/// counts as `vendor/`), the code generator's and sample API server's left out; sorted.
pub fn openapi_tagged_packages(source: &Path) -> Result<Vec<String>, KubernetesError> {
    let mut dirs = std::collections::BTreeSet::new();
    let mut stack = vec![source.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io_error("list", &dir))? {
            let entry = entry.map_err(io_error("list", &dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let ty = entry.file_type().map_err(io_error("stat", &path))?;
            if ty.is_dir() {
                let top = dir == source;
                if !(top && (name.starts_with('_') || name.starts_with('.') || name == "vendor")) {
                    stack.push(path);
                }
            } else if ty.is_file() && name.ends_with(".go") {
                let text = std::fs::read(&path).map_err(io_error("read", &path))?;
                let text = String::from_utf8_lossy(&text);
                let tagged = text.lines().any(|l| {
                    l.strip_prefix("//")
                        .is_some_and(|r| r.trim_start_matches(' ').starts_with("+k8s:"))
                });
                if tagged && text.contains("+k8s:openapi-gen=") {
                    let rel = dir
                        .strip_prefix(source)
                        .unwrap_or(&dir)
                        .display()
                        .to_string();
                    let rel = match rel.strip_prefix("staging/src/") {
                        Some(r) => format!("vendor/{r}"),
                        None => rel,
                    };
                    if !(rel.starts_with("vendor/k8s.io/code-generator/")
                        || rel.starts_with("vendor/k8s.io/sample-apiserver/"))
                    {
                        dirs.insert(format!("{IMPORT_PATH}/{rel}"));
                    }
                }
            }
        }
    }
    Ok(dirs.into_iter().collect())
}

/// One built binary.
#[derive(Debug, Clone)]
pub struct BuiltBinary {
    pub binary: Binary,
    pub path: PathBuf,
    pub sha256: String,
    /// Taken from the cache, not built by this call.
    pub cached: bool,
}

/// What a build did: the binaries and the timeline (step, time).
#[derive(Debug, Clone, Default)]
pub struct BuildReport {
    pub binaries: Vec<BuiltBinary>,
    pub timeline: Vec<(String, Duration)>,
}

/// The binary at `path` if the manifest records it and its sha256 still matches (verified
/// now); `None` (after a warning naming both sha256 when they differ, and what happens
/// `instead`) when it must be made again.
pub(super) fn cached_binary(
    manifest: &BTreeMap<String, String>,
    binary: Binary,
    path: &Path,
    instead: &str,
) -> Result<Option<BuiltBinary>, KubernetesError> {
    let Some(expected) = manifest.get(binary.name()) else {
        return Ok(None);
    };
    if !path.is_file() {
        return Ok(None);
    }
    let actual = sha256_file(path)?;
    if &actual != expected {
        tracing::warn!(
            "kubernetes: cached {} has sha256 {actual}, the manifest {expected}: {instead}",
            binary.name()
        );
        return Ok(None);
    }
    tracing::info!(
        "kubernetes: {} cached ({}, sha256 {actual} verified)",
        binary.name(),
        path.display()
    );
    Ok(Some(BuiltBinary {
        binary,
        path: path.to_owned(),
        sha256: actual,
        cached: true,
    }))
}

/// Builds `binaries` (each once, in [`Binary::ALL`] order) unless cached, and records them in
/// the manifest.
pub fn build(
    unpacked: &Unpacked,
    lock: &KubernetesLock,
    epoch: u64,
    binaries: &[Binary],
) -> Result<BuildReport, KubernetesError> {
    let mut wanted: Vec<Binary> = binaries.to_vec();
    wanted.sort();
    wanted.dedup();
    for d in ["bin", "tools", "home", "tmp", "gocache"] {
        let p = unpacked.dir.join(d);
        std::fs::create_dir_all(&p).map_err(io_error("create directory", &p))?;
    }
    let manifest_path = unpacked.dir.join("bin/manifest.json");
    let mut manifest = read_manifest(&manifest_path)?;
    let mut report = BuildReport::default();
    for binary in wanted {
        let path = binary_path(unpacked, binary);
        let t = Instant::now();
        if let Some(built) = cached_binary(&manifest, binary, &path, "rebuilding")? {
            report
                .timeline
                .push((format!("{} (cached)", binary.name()), t.elapsed()));
            report.binaries.push(built);
            continue;
        }
        if binary.needs_openapi() {
            let t = Instant::now();
            if generate_openapi(unpacked)? {
                report.timeline.push(("openapi-gen".into(), t.elapsed()));
            }
        }
        let t = Instant::now();
        let partial = path.with_extension("partial");
        run_step(&go_build_step(unpacked, lock, epoch, binary, &partial)?)?;
        std::fs::rename(&partial, &path).map_err(io_error("rename the binary to", &path))?;
        let sha256 = sha256_file(&path)?;
        if let Some(expected) = manifest.get(binary.name())
            && expected != &sha256
        {
            return Err(KubernetesError::NotReproduced {
                name: binary.name().into(),
                expected: expected.clone(),
                actual: sha256,
            });
        }
        tracing::info!(
            "kubernetes: built {} in {:.1}s (sha256 {sha256})",
            binary.name(),
            t.elapsed().as_secs_f64()
        );
        report
            .timeline
            .push((format!("build {}", binary.name()), t.elapsed()));
        manifest.insert(binary.name().to_owned(), sha256.clone());
        write_manifest(&manifest_path, &manifest)?;
        report.binaries.push(BuiltBinary {
            binary,
            path,
            sha256,
            cached: false,
        });
    }
    Ok(report)
}

/// Generates `pkg/generated/openapi/zz_generated.openapi.go` unless present; true if it ran.
fn generate_openapi(unpacked: &Unpacked) -> Result<bool, KubernetesError> {
    let out = unpacked
        .source
        .join(OPENAPI_PKG)
        .join("zz_generated.openapi.go");
    if out.is_file() {
        return Ok(false);
    }
    let tagged = openapi_tagged_packages(&unpacked.source)?;
    let report = unpacked.dir.join("tools/openapi-violations.report");
    for step in openapi_steps(unpacked, &tagged, &report) {
        run_step(&step)?;
    }
    let known = unpacked.source.join(KNOWN_VIOLATIONS);
    let same = std::fs::read(&report).map_err(io_error("read", &report))?
        == std::fs::read(&known).map_err(io_error("read", &known))?;
    if !same {
        let _ = std::fs::remove_file(&out);
        return Err(KubernetesError::OpenApiViolations { report, known });
    }
    tracing::info!(
        "kubernetes: {OPENAPI_PKG}/zz_generated.openapi.go from {} packages (sha256 {}); its rule \
         violations equal {KNOWN_VIOLATIONS}",
        tagged.len(),
        sha256_file(&out)?
    );
    Ok(true)
}

fn run_step(step: &Step) -> Result<(), KubernetesError> {
    tracing::info!("kubernetes: {} …", step.label);
    tool::run_tool(&mut step.command())
        .map(|_| ())
        .map_err(|source| KubernetesError::Tool {
            step: step.label.clone(),
            package: "golang-1.19-go (unpacked from kubernetes.lock)",
            source,
        })
}

pub(super) fn read_manifest(path: &Path) -> Result<BTreeMap<String, String>, KubernetesError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| KubernetesError::Manifest {
            path: path.to_owned(),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(io_error("read", path)(e).into()),
    }
}

pub(super) fn write_manifest(
    path: &Path,
    manifest: &BTreeMap<String, String>,
) -> Result<(), KubernetesError> {
    let json = serde_json::to_vec_pretty(manifest).map_err(|source| KubernetesError::Manifest {
        path: path.to_owned(),
        source,
    })?;
    std::fs::write(path, json).map_err(io_error("write", path))?;
    Ok(())
}

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String, KubernetesError> {
    let mut file = std::fs::File::open(path).map_err(io_error("open", path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io_error("read", path))?;
    Ok(hex::encode(hasher.finalize()))
}
