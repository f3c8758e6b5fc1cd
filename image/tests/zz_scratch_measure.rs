use hawser_image::build::{self, BuildInputs};
#[test]
fn measure() {
    let c = std::path::Path::new("/tmp/hawser-cache/inputs");
    let k = c.join("linux-image-6.12.117+deb13-cloud-amd64_6.12.117-1");
    let kver = "6.12.117+deb13-cloud-amd64";
    let mut roots: Vec<_> = std::fs::read_dir(c).unwrap().flatten().map(|e| e.path())
        .filter(|p| { let n = p.file_name().unwrap().to_string_lossy(); !n.starts_with("linux-") && !n.starts_with("systemd-") }).collect();
    roots.sort();
    let init = std::env::var("INIT").unwrap();
    let t = std::time::Instant::now();
    let out = build::build(&BuildInputs {
        init_binary: init.into(), kernel_image: k.join(format!("boot/vmlinuz-{kver}")), kernel_release: kver.into(),
        modules_dir: k.join(format!("usr/lib/modules/{kver}")), lib_roots: roots,
        stub: c.join("systemd-boot-efi_257.13-1~deb13u1/usr/lib/systemd/boot/efi/linuxx64.efi.stub"),
        cmdline: "console=ttyS0".into(), os_release: build::default_os_release("0.1.0"), source_date_epoch: 1767225600 },
        std::path::Path::new("/tmp/hawser-measure/out")).unwrap();
    eprintln!("{:?} in {:?}", out, t.elapsed());
}
