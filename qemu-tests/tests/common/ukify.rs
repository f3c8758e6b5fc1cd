//! ukify 257 as users run it, and the inputs of the options that add sections to a UKI:
//! microcode (`.ucode`), devicetrees (`.dtb`, `.dtbauto`), hardware IDs (`.hwids`), a signed
//! PCR policy (`.pcrsig`, `.pcrpkey`) and profiles (`.profile`). Every input is made with the
//! tool a user would use (`dtc`, `openssl`, systemd's `systemd-measure` through ukify), except
//! the microcode, whose contents no stub or kernel in a VM looks at.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_image::build::BuildOutput;
use hawser_image::cpio::CpioArchive;

/// The parts every UKI of a test is assembled from: hawser's, from the image build.
pub struct Parts {
    pub linux: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: PathBuf,
    pub osrel: PathBuf,
}

impl Parts {
    /// hawser's kernel, initramfs, command line and os-release, from `image`'s build.
    pub fn of(image: &BuildOutput, dir: &Path) -> Parts {
        let uki = std::fs::read(&image.uki.path).expect("read hawser's UKI");
        let osrel = hawser_image::uki::read_uki_sections(&uki)
            .expect("hawser's UKI parses")
            .into_iter()
            .find(|s| s.name == ".osrel")
            .expect("hawser's UKI has .osrel")
            .data;
        let osrel_path = dir.join("os-release");
        std::fs::write(&osrel_path, osrel.strip_suffix(b"\0").unwrap_or(&osrel)).unwrap();
        Parts {
            linux: image.kernel.path.clone(),
            initrd: image.initrd.path.clone(),
            cmdline: image.cmdline.path.clone(),
            osrel: osrel_path,
        }
    }

    /// The command line, as text.
    pub fn cmdline_text(&self) -> String {
        std::fs::read_to_string(&self.cmdline)
            .unwrap()
            .trim_end()
            .to_owned()
    }
}

/// Runs `command`, failing the test with its output (and what to install) if it fails; its
/// output.
pub fn run(mut command: Command, what: &str) -> std::process::Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `ukify build --stub <stub> <args…> --output <out>` with the pinned ukify 257.
pub fn build(ukify: &Path, stub: &Path, args: &[OsString], out: &Path) {
    let mut c = Command::new("/usr/bin/python3");
    c.arg(ukify).arg("build").arg("--stub").arg(stub);
    c.args(args);
    c.arg("--output").arg(out);
    run(
        c,
        "ukify 257 (systemd-ukify; needs python3-pefile, and for --pcr-private-key systemd's systemd-measure)",
    );
}

/// `--linux --initrd --cmdline --os-release` of `parts`.
pub fn base_args(parts: &Parts) -> Vec<OsString> {
    vec![
        "--linux".into(),
        parts.linux.clone().into(),
        "--initrd".into(),
        parts.initrd.clone().into(),
        format!("--cmdline=@{}", parts.cmdline.display()).into(),
        format!("--os-release=@{}", parts.osrel.display()).into(),
    ]
}

/// An early-microcode cpio as distributions prepend it (`kernel/x86/microcode/AuthenticAMD.bin`,
/// uncompressed newc). Its payload is a placeholder with AMD's container magic: the stub passes
/// the bytes on without looking, and a kernel in a VM loads no microcode.
pub fn microcode(dir: &Path) -> PathBuf {
    let mut cpio = CpioArchive::new();
    for d in ["kernel", "kernel/x86", "kernel/x86/microcode"] {
        cpio.add_dir(d, 0o755).unwrap();
    }
    let mut payload = b"DMA\0".to_vec();
    payload.extend(b"hawser test microcode placeholder".iter());
    cpio.add_file("kernel/x86/microcode/AuthenticAMD.bin", 0o644, payload)
        .unwrap();
    let path = dir.join("ucode.cpio");
    std::fs::write(&path, cpio.to_bytes(0).unwrap()).unwrap();
    path
}

/// A devicetree blob whose root node is `compatible`, compiled by `dtc`.
pub fn devicetree(dir: &Path, name: &str, compatible: &str) -> PathBuf {
    let source = dir.join(format!("{name}.dts"));
    std::fs::write(
        &source,
        format!(
            "/dts-v1/;\n/ {{\n\tcompatible = \"{compatible}\";\n\tmodel = \"hawser test {name}\";\n\t#address-cells = <1>;\n\t#size-cells = <1>;\n}};\n"
        ),
    )
    .unwrap();
    let out = dir.join(format!("{name}.dtb"));
    let mut c = Command::new("dtc");
    c.args(["-I", "dts", "-O", "dtb", "-o"])
        .arg(&out)
        .arg(&source);
    run(c, "dtc (apt-get install device-tree-compiler)");
    out
}

/// A directory of ukify `--hwids` files: one JSON per device (name, compatible, CHIDs as
/// GUID strings).
pub fn hwids(dir: &Path, devices: &[(&str, &str, [u8; 16])]) -> PathBuf {
    let hwids = dir.join("hwids");
    let _ = std::fs::remove_dir_all(&hwids);
    std::fs::create_dir_all(&hwids).unwrap();
    for (i, (name, compatible, chid)) in devices.iter().enumerate() {
        let doc = serde_json::json!({
            "type": "devicetree",
            "name": name,
            "compatible": compatible,
            "hwids": [hawser_measurements::hwids::chid_uuid(chid)],
        });
        std::fs::write(hwids.join(format!("device-{i}.json")), doc.to_string()).unwrap();
    }
    hwids
}

/// A signed PCR policy (`.pcrsig`'s JSON) of `parts` with `devicetree` and `public` as
/// `.pcrpkey`, made by this host's `systemd-measure sign` (systemd 252: it measures the
/// sections 252 knows, so the policy is genuine in form, not the PCR 11 of a 257 boot).
pub fn pcr_signature(
    dir: &Path,
    parts: &Parts,
    devicetree: &Path,
    private: &Path,
    public: &Path,
) -> PathBuf {
    let mut c = Command::new("/usr/lib/systemd/systemd-measure");
    c.arg("sign")
        .arg(format!("--linux={}", parts.linux.display()))
        .arg(format!("--osrel={}", parts.osrel.display()))
        .arg(format!("--cmdline={}", parts.cmdline.display()))
        .arg(format!("--initrd={}", parts.initrd.display()))
        .arg(format!("--dtb={}", devicetree.display()))
        .arg(format!("--pcrpkey={}", public.display()))
        .arg("--bank=sha256")
        .arg(format!("--private-key={}", private.display()))
        .arg(format!("--public-key={}", public.display()));
    let out = run(c, "systemd-measure sign (apt-get install systemd)");
    let path = dir.join("pcrsig.json");
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// A PCR-signing key pair (RSA 2048, PEM), made by `openssl`: (private, public).
pub fn pcr_signing_key(dir: &Path) -> (PathBuf, PathBuf) {
    let private = dir.join("pcr-signing.key.pem");
    let public = dir.join("pcr-signing.pub.pem");
    if !private.exists() || !public.exists() {
        let mut c = Command::new("openssl");
        c.args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&private);
        run(c, "openssl genpkey (apt-get install openssl)");
        let mut c = Command::new("openssl");
        c.args(["pkey", "-pubout", "-in"])
            .arg(&private)
            .arg("-out")
            .arg(&public);
        run(c, "openssl pkey -pubout");
    }
    (private, public)
}
