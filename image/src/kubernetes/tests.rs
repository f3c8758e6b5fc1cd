//! Tests of the Kubernetes lock and build plan (no network, no Go): the committed lock parses,
//! bad lines are named, the digest follows content not layout, and the plan's commands and
//! environment are the reproducible ones.

use std::path::{Path, PathBuf};

use super::Unpacked;
use super::build::{self, Binary};
use super::lock::{KubernetesLock, KubernetesLockError};

fn committed_lock() -> KubernetesLock {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kubernetes.lock");
    match KubernetesLock::load(&path) {
        Ok(lock) => lock,
        Err(e) => panic!("{}: {e:?}", path.display()),
    }
}

#[test]
fn committed_lock_pins_debian_source_and_go_1_19() {
    let lock = committed_lock();
    assert_eq!(lock.version, "v1.20.2");
    let dsc = lock.dsc().expect("a .dsc");
    assert_eq!(dsc.version, "1.20.5+really1.20.2-1.1+deb12u1");
    assert_eq!(
        lock.sources.len(),
        3,
        "the .dsc and the two tarballs it lists"
    );
    let names: Vec<&str> = lock.toolchain.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["golang-1.19-go", "golang-1.19-src"]);
    assert_eq!(lock.swaps.len(), 1);
    assert_eq!(lock.swaps[0].into, "vendor/github.com/modern-go/reflect2");
}

fn replace(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in the lock");
    text.replacen(from, to, 1)
}

fn lock_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kubernetes.lock");
    std::fs::read_to_string(path).expect("kubernetes.lock")
}

#[test]
fn a_bad_line_is_named() {
    let text = lock_text();
    // A TOML error names its line.
    let broken = replace(&text, "size = 1973", "size = \"1973\"");
    let err = KubernetesLock::parse(&broken).expect_err("a string size");
    let line = broken
        .lines()
        .position(|l| l == "size = \"1973\"")
        .expect("the line")
        + 1;
    assert!(
        err.to_string().contains(&format!("line {line}")),
        "{err} does not name line {line}"
    );
    // An unknown key is refused, not ignored.
    let unknown = replace(&text, "size = 1973", "size = 1973\nsha1 = \"x\"");
    assert!(matches!(
        KubernetesLock::parse(&unknown),
        Err(KubernetesLockError::Toml(_))
    ));
    let bad_sha = replace(
        &text,
        "19fa1da5aefcef673894ac9511986bd98a14410cf8eea0b626613c30df435257",
        "19FA",
    );
    let err = KubernetesLock::parse(&bad_sha).expect_err("short sha256");
    assert!(
        err.to_string()
            .contains("[[source]] kubernetes_1.20.5+really1.20.2-1.1+deb12u1.dsc"),
        "{err}"
    );
    let bad_url = replace(
        &text,
        "kubernetes_1.20.5%2breally1.20.2.orig.tar.gz\"",
        "x.tar.gz\"",
    );
    let err = KubernetesLock::parse(&bad_url).expect_err("url of another file");
    assert!(err.to_string().contains("orig.tar.gz: url"), "{err}");
    let bad_version = replace(&text, "version = \"v1.20.2\"", "version = \"1.20\"");
    let err = KubernetesLock::parse(&bad_version).expect_err("version");
    assert!(err.to_string().contains("\"1.20\""), "{err}");
    let escape = replace(
        &text,
        "into = \"vendor/github.com/modern-go/reflect2\"",
        "into = \"vendor/../cmd\"",
    );
    assert!(matches!(
        KubernetesLock::parse(&escape),
        Err(KubernetesLockError::Invalid(_))
    ));
}

#[test]
fn digest_follows_content_not_comments() {
    let text = lock_text();
    let lock = KubernetesLock::parse(&text).expect("lock");
    let commented = format!("# another comment\n{}", text.replace("\n\n", "\n\n\n"));
    assert_eq!(
        KubernetesLock::parse(&commented).expect("lock").digest(),
        lock.digest()
    );
    let changed = replace(&text, "size = 21300", "size = 21301");
    assert_ne!(
        KubernetesLock::parse(&changed).expect("lock").digest(),
        lock.digest()
    );
    assert_eq!(lock.digest().len(), 64);
}

#[test]
fn build_date_is_rfc3339_utc_of_the_epoch() {
    assert_eq!(build::build_date(0).unwrap(), "1970-01-01T00:00:00Z");
    assert_eq!(
        build::build_date(1_795_305_600).unwrap(),
        "2026-11-22T00:00:00Z"
    );
    assert_eq!(
        build::build_date(951_825_599).unwrap(),
        "2000-02-29T11:59:59Z"
    );
    assert!(build::build_date(u64::MAX).is_err());
}

fn unpacked() -> Unpacked {
    let dir = PathBuf::from("/cache/kubernetes/d1g");
    Unpacked {
        gopath: dir.join("gopath"),
        source: dir.join("gopath/src/k8s.io/kubernetes"),
        goroot: dir.join("toolchain/usr/lib/go-1.19"),
        dir,
        fresh: false,
    }
}

#[test]
fn go_build_plan_is_closed_and_reproducible() {
    let lock = committed_lock();
    let u = unpacked();
    let step =
        build::go_build_step(&u, &lock, 1_795_305_600, Binary::Kubeadm, Path::new("/o/k")).unwrap();
    assert_eq!(
        step.program,
        Path::new("/cache/kubernetes/d1g/toolchain/usr/lib/go-1.19/bin/go")
    );
    assert_eq!(step.cwd, u.source);
    assert_eq!(&step.args[..2], ["build", "-trimpath"]);
    assert_eq!(&step.args[4..], ["-o", "/o/k", "./cmd/kubeadm"]);
    let ld = &step.args[3];
    assert!(ld.starts_with("-s -w -buildid= "), "{ld}");
    for pkg in ["component-base/version", "client-go/pkg/version"] {
        let v = format!("k8s.io/kubernetes/vendor/k8s.io/{pkg}");
        for want in [
            format!("-X {v}.gitVersion=v1.20.2"),
            format!("-X {v}.gitCommit=faecb196815e248d3ecfb03c680a4507229c2a56"),
            format!("-X {v}.buildDate=2026-11-22T00:00:00Z"),
            format!("-X {v}.gitMajor=1"),
            format!("-X {v}.gitMinor=20"),
        ] {
            assert!(ld.contains(&want), "{want} not in {ld}");
        }
    }
    let env: Vec<(&str, &str)> = step
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        env,
        [
            ("CGO_ENABLED", "0"),
            ("GO111MODULE", "off"),
            ("GOARCH", "amd64"),
            ("GOCACHE", "/cache/kubernetes/d1g/gocache"),
            ("GOFLAGS", ""),
            ("GOOS", "linux"),
            ("GOPATH", "/cache/kubernetes/d1g/gopath"),
            ("GOROOT", "/cache/kubernetes/d1g/toolchain/usr/lib/go-1.19"),
            ("HOME", "/cache/kubernetes/d1g/home"),
            ("LC_ALL", "C"),
            (
                "PATH",
                "/cache/kubernetes/d1g/toolchain/usr/lib/go-1.19/bin:/usr/bin:/bin"
            ),
            ("TMPDIR", "/cache/kubernetes/d1g/tmp"),
        ]
    );
    // The environment is the whole environment: `env` run as a step prints exactly it.
    let probe = build::Step {
        program: PathBuf::from("/usr/bin/env"),
        args: Vec::new(),
        cwd: std::env::temp_dir(),
        ..step.clone()
    };
    let out = probe.command().output().expect("run /usr/bin/env");
    let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let planned: Vec<String> = step.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut printed_sorted = printed.clone();
    printed_sorted.sort();
    assert_eq!(
        printed_sorted, planned,
        "the step inherited or lost variables"
    );
}

#[test]
fn only_the_api_server_waits_for_openapi() {
    let needing: Vec<&str> = Binary::ALL
        .into_iter()
        .filter(|b| b.needs_openapi())
        .map(|b| b.name())
        .collect();
    assert_eq!(needing, ["kube-apiserver"]);
    assert_eq!(Binary::from_name("kube-proxy"), Some(Binary::KubeProxy));
    assert_eq!(Binary::from_name("kubectl"), None);
}

#[test]
fn openapi_plan_runs_the_vendored_generator_into_pkg_generated() {
    let u = unpacked();
    let tagged = vec![
        "k8s.io/kubernetes/pkg/apis/core".to_owned(),
        "k8s.io/kubernetes/vendor/k8s.io/api/core/v1".to_owned(),
    ];
    let steps = build::openapi_steps(&u, &tagged, Path::new("/r/report"));
    assert_eq!(steps.len(), 2);
    assert_eq!(
        steps[0].args.last().map(String::as_str),
        Some("./vendor/k8s.io/kube-openapi/cmd/openapi-gen")
    );
    assert_eq!(steps[1].program, u.dir.join("tools/openapi-gen"));
    let args = steps[1].args.join(" ");
    assert!(
        args.contains(
            "-i k8s.io/kubernetes/pkg/apis/core,k8s.io/kubernetes/vendor/k8s.io/api/core/v1 "
        ),
        "{args}"
    );
    assert!(
        args.contains("-p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi"),
        "{args}"
    );
    assert!(args.ends_with("-r /r/report"), "{args}");
}

#[test]
fn openapi_tags_are_found_as_the_makefile_finds_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path();
    let files = [
        (
            "pkg/apis/core/types.go",
            "// +k8s:openapi-gen=true\npackage core\n",
        ),
        // The tag somewhere, a `// +k8s:` line elsewhere: counted (grep -l on the file).
        (
            "pkg/b/doc.go",
            "// +k8s:deepcopy-gen=package\n/* +k8s:openapi-gen=true */\npackage b\n",
        ),
        // No `// +k8s:` line at all: not counted.
        ("pkg/c/doc.go", "/* +k8s:openapi-gen=true */\npackage c\n"),
        (
            "staging/src/k8s.io/api/core/v1/doc.go",
            "//  +k8s:openapi-gen=true\npackage v1\n",
        ),
        (
            "staging/src/k8s.io/code-generator/x/doc.go",
            "// +k8s:openapi-gen=true\npackage x\n",
        ),
        (
            "staging/src/k8s.io/sample-apiserver/y/doc.go",
            "// +k8s:openapi-gen=true\npackage y\n",
        ),
        (
            "vendor/github.com/z/doc.go",
            "// +k8s:openapi-gen=true\npackage z\n",
        ),
        ("_output/w/doc.go", "// +k8s:openapi-gen=true\npackage w\n"),
        (".pc/v/doc.go", "// +k8s:openapi-gen=true\npackage v\n"),
        ("pkg/d/doc.txt", "// +k8s:openapi-gen=true\n"),
    ];
    for (path, text) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
    let found = build::openapi_tagged_packages(root).expect("walk");
    assert_eq!(
        found,
        [
            "k8s.io/kubernetes/pkg/apis/core",
            "k8s.io/kubernetes/pkg/b",
            "k8s.io/kubernetes/vendor/k8s.io/api/core/v1",
        ]
    );
}

#[test]
fn a_swap_replaces_the_vendored_files_and_keeps_subpackages() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let from = tmp.path().join("deb/usr/share/gocode/src/reflect2");
    let into = tmp.path().join("tree/vendor/reflect2");
    for (dir, files) in [
        (&from, &["reflect2.go", "go_above_118.go"][..]),
        (&into, &["reflect2.go", "go_below_17.go"][..]),
    ] {
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        for f in files {
            std::fs::write(dir.join(f), format!("{}", dir.display())).expect("write");
        }
    }
    std::fs::write(into.join("sub/kept.go"), "kept").expect("write");
    super::fetch::replace_dir(&from, &into).expect("swap");
    let mut names: Vec<String> = std::fs::read_dir(&into)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["go_above_118.go", "reflect2.go", "sub"]);
    assert_eq!(
        std::fs::read_to_string(into.join("reflect2.go")).expect("read"),
        from.display().to_string()
    );
    assert_eq!(
        std::fs::read_to_string(into.join("sub/kept.go")).expect("read"),
        "kept"
    );
    // A swap whose directory is missing is refused by name, not skipped.
    let err = super::fetch::replace_dir(&tmp.path().join("nowhere"), &into).expect_err("missing");
    assert!(err.to_string().contains("nowhere"), "{err}");
}

#[test]
fn an_unpack_without_a_go_toolchain_is_refused_by_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("gopath/src/k8s.io/kubernetes/cmd/kubeadm")).expect("mkdir");
    std::fs::create_dir_all(dir.join("toolchain/usr/lib/go-1.19/bin")).expect("mkdir");
    let err = super::fetch::locate(dir, false).expect_err("no go binary");
    assert!(err.to_string().contains("Go toolchain"), "{err}");
    std::fs::write(dir.join("toolchain/usr/lib/go-1.19/bin/go"), "").expect("write");
    std::fs::create_dir_all(dir.join("toolchain/usr/lib/go-1.19/src/runtime")).expect("mkdir");
    let found = super::fetch::locate(dir, false).expect("layout");
    assert_eq!(found.goroot, dir.join("toolchain/usr/lib/go-1.19"));
    assert_eq!(found.source, dir.join("gopath/src/k8s.io/kubernetes"));
}
