//! Unit tests of [`VmConfig`]: the QEMU command lines configs become, and the configs refused.

use super::*;

fn paths(uefi: bool, tpm: bool) -> RuntimePaths {
    RuntimePaths {
        console_log: "/run/vm/console.log".into(),
        qmp_socket: "/run/vm/qmp.sock".into(),
        tpm_ctrl_socket: tpm.then(|| "/run/tpm/ctrl.sock".into()),
        ovmf_vars: uefi.then(|| "/run/vm/OVMF_VARS.fd".into()),
        esp_image: uefi.then(|| "/run/vm/esp.img".into()),
    }
}

fn args_string(config: &VmConfig, paths: &RuntimePaths) -> String {
    let args = config.qemu_args(paths).expect("args");
    args.iter()
        .map(|arg| arg.to_str().expect("utf-8").to_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value following `flag`, for every occurrence.
fn values_of(config: &VmConfig, paths: &RuntimePaths, flag: &str) -> Vec<String> {
    let args = config.qemu_args(paths).expect("args");
    args.windows(2)
        .filter(|pair| pair[0] == flag)
        .map(|pair| pair[1].to_str().expect("utf-8").to_owned())
        .collect()
}

#[test]
fn uefi_vm_has_firmware_esp_tpm_rng_and_no_network() {
    let config = VmConfig::uefi("/img/hawser.efi")
        .accel("tcg")
        .tpm(TpmConfig::default());
    let paths = paths(true, true);
    let args = args_string(&config, &paths);
    assert!(args.starts_with("-name hawser-vm -no-user-config -nodefaults -machine q35 -accel tcg -cpu max -m 1024 -smp 1 -display none -no-reboot"), "{args}");
    assert_eq!(
        values_of(&config, &paths, "-drive"),
        vec![
            "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
            "if=pflash,format=raw,unit=1,file=/run/vm/OVMF_VARS.fd",
            "if=none,id=esp,format=raw,file=/run/vm/esp.img",
        ]
    );
    assert_eq!(
        values_of(&config, &paths, "-device"),
        vec![
            "virtio-blk-pci,drive=esp,bootindex=0",
            "tpm-crb,tpmdev=tpm0",
            "virtio-rng-pci,rng=rng0",
        ]
    );
    assert_eq!(
        values_of(&config, &paths, "-chardev"),
        vec![
            "file,id=console,path=/run/vm/console.log",
            "socket,id=tpmchr,path=/run/tpm/ctrl.sock"
        ]
    );
    assert_eq!(
        values_of(&config, &paths, "-serial"),
        vec!["chardev:console"]
    );
    assert_eq!(
        values_of(&config, &paths, "-qmp"),
        vec!["unix:/run/vm/qmp.sock,server=on,wait=off"]
    );
    assert_eq!(
        values_of(&config, &paths, "-tpmdev"),
        vec!["emulator,id=tpm0,chardev=tpmchr"]
    );
    for forbidden in ["-netdev", "-nic", "-net ", "-kernel", "-nographic"] {
        assert!(!args.contains(forbidden), "{forbidden} in {args}");
    }
}

#[test]
fn uefi_disk_vm_boots_the_image_read_only_with_the_boot_serial_beside_a_state_disk() {
    let config = VmConfig::uefi_disk("/img/disk,1.raw")
        .tpm(TpmConfig::default())
        .disk("/disks/state.img", "hawser-state");
    assert_eq!(
        config.boot,
        VmConfig::uefi_with_esp(Esp::Image("/img/disk,1.raw".into())).boot
    );
    let mut paths = paths(true, true);
    paths.esp_image = Some("/img/disk,1.raw".into());
    assert_eq!(
        values_of(&config, &paths, "-drive"),
        vec![
            "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
            "if=pflash,format=raw,unit=1,file=/run/vm/OVMF_VARS.fd",
            "if=none,id=esp,format=raw,readonly=on,file=/img/disk,,1.raw",
            "if=none,id=disk0,format=raw,cache=unsafe,file=/disks/state.img",
        ]
    );
    let devices = values_of(&config, &paths, "-device");
    assert_eq!(
        devices[0],
        "virtio-blk-pci,drive=esp,bootindex=0,serial=hawser-boot"
    );
    assert!(devices.contains(&"virtio-blk-pci,drive=disk0,serial=hawser-state".to_owned()));

    // The boot disk's serial is taken; a second disk with it would make the guest's
    // by-id links ambiguous.
    let error = VmConfig::uefi_disk("/img/disk.raw")
        .disk("/disks/other.img", BOOT_DISK_SERIAL)
        .qemu_args(&paths)
        .unwrap_err();
    assert!(error.to_string().contains("used twice"), "{error}");
    let error = VmConfig::direct_kernel("/k", None, "")
        .disk("/a", "same")
        .disk("/b", "same")
        .qemu_args(&paths)
        .unwrap_err();
    assert!(
        error.to_string().contains("\"same\" of /b is used twice"),
        "{error}"
    );
    // Without a boot disk image the serial is free.
    VmConfig::uefi("/img/hawser.efi")
        .disk("/disks/x.img", BOOT_DISK_SERIAL)
        .qemu_args(&paths)
        .expect("hawser-boot is free without a boot disk image");
}

#[test]
fn direct_kernel_vm_has_kernel_initrd_and_cmdline_and_no_firmware() {
    let config = VmConfig::direct_kernel(
        "/k/vmlinuz",
        Some("/k/initrd.cpio".into()),
        "console=ttyS0 hawser.reboot_delay=0",
    )
    .memory_mib(2048)
    .cpus(2)
    .accel("kvm");
    let paths = paths(false, false);
    assert_eq!(values_of(&config, &paths, "-kernel"), vec!["/k/vmlinuz"]);
    assert_eq!(
        values_of(&config, &paths, "-initrd"),
        vec!["/k/initrd.cpio"]
    );
    assert_eq!(
        values_of(&config, &paths, "-append"),
        vec!["console=ttyS0 hawser.reboot_delay=0"]
    );
    assert_eq!(values_of(&config, &paths, "-m"), vec!["2048"]);
    assert_eq!(values_of(&config, &paths, "-smp"), vec!["2"]);
    assert_eq!(values_of(&config, &paths, "-accel"), vec!["kvm"]);
    let args = args_string(&config, &paths);
    assert!(!args.contains("pflash"), "{args}");
    assert!(!args.contains("tpm"), "{args}");
}

#[test]
fn tis_model_and_fw_cfg_entries_and_disks() {
    let mut config = VmConfig::direct_kernel("/k", None, "console=ttyS0")
        .tpm(TpmConfig {
            model: TpmModel::Tis,
            state_dir: None,
        })
        .fw_cfg_string("quote_nonce", "00ff,11")
        .fw_cfg_file("blob", "/data/a,b.bin")
        .disk("/disks/state.img", "hawser-state");
    config.disks.push(Disk {
        path: "/disks/rootfs.img".into(),
        serial: "rootfs".into(),
        read_only: true,
    });
    let paths = paths(false, true);
    assert!(values_of(&config, &paths, "-device").contains(&"tpm-tis,tpmdev=tpm0".to_owned()));
    assert_eq!(
        values_of(&config, &paths, "-fw_cfg"),
        vec![
            // Commas in values are doubled, as QEMU's option parser wants.
            "name=opt/hawser/quote_nonce,string=00ff,,11",
            "name=opt/hawser/blob,file=/data/a,,b.bin",
        ]
    );
    let drives = values_of(&config, &paths, "-drive");
    assert_eq!(
        drives,
        vec![
            "if=none,id=disk0,format=raw,cache=unsafe,file=/disks/state.img",
            "if=none,id=disk1,format=raw,cache=unsafe,readonly=on,file=/disks/rootfs.img",
        ]
    );
    let devices = values_of(&config, &paths, "-device");
    assert!(devices.contains(&"virtio-blk-pci,drive=disk0,serial=hawser-state".to_owned()));
    assert!(devices.contains(&"virtio-blk-pci,drive=disk1,serial=rootfs".to_owned()));
}

#[test]
fn invalid_configs_are_refused_with_the_offending_value() {
    let base = VmConfig::direct_kernel("/k", None, "");
    let long_key = "k".repeat(50);
    let cases: Vec<(VmConfig, &str)> = vec![
        (
            base.clone().fw_cfg_string(&long_key, "v"),
            "at most 55 bytes",
        ),
        (base.clone().fw_cfg_string("a,b", "v"), "without commas"),
        (
            base.clone().fw_cfg_string("x", "1").fw_cfg_string("x", "2"),
            "given twice",
        ),
        (
            base.clone()
                .disk("/d", "serial-that-is-too-long-for-virtio"),
            "1 to 20",
        ),
        (base.clone().disk("/d", "a b"), "\"a b\""),
        (base.clone().cpus(0), "at least one CPU"),
        (base.clone().name("my vm"), "\"my vm\""),
    ];
    for (config, needle) in cases {
        let error = config.qemu_args(&paths(false, false)).unwrap_err();
        assert!(error.to_string().contains(needle), "{needle}: {error}");
    }
    let error = VmConfig::uefi("/x")
        .qemu_args(&paths(false, false))
        .unwrap_err();
    assert!(error.to_string().contains("variable store"), "{error}");
    let error = base
        .clone()
        .tpm(TpmConfig::default())
        .qemu_args(&paths(false, false))
        .unwrap_err();
    assert!(
        error.to_string().contains("swtpm control socket"),
        "{error}"
    );
}

#[test]
fn reboot_passes_through_when_asked_and_extra_args_come_last() {
    let mut config = VmConfig::direct_kernel("/k", None, "");
    config.no_reboot = false;
    config.rng = false;
    config.cpu_model = None;
    config.extra_args = vec![
        "-netdev".into(),
        "socket,id=n0,listen=127.0.0.1:5555".into(),
    ];
    let args = args_string(&config, &paths(false, false));
    assert!(!args.contains("-no-reboot"), "{args}");
    assert!(!args.contains("virtio-rng"), "{args}");
    assert!(!args.contains("-cpu"), "{args}");
    assert!(
        args.ends_with("-netdev socket,id=n0,listen=127.0.0.1:5555"),
        "{args}"
    );
}

#[test]
fn relative_paths_become_absolute_for_qemus_work_directory() {
    let config = VmConfig::uefi_disk("out/hawser-disk.raw")
        .disk("state.img", "hawser-state")
        .fw_cfg_file("opt/hawser/x", "x.bin")
        .with_absolute_paths();
    let cwd = std::env::current_dir().unwrap();
    assert!(matches!(
        &config.boot,
        Boot::Uefi { esp: Esp::Image(p), .. } if *p == cwd.join("out/hawser-disk.raw")
    ));
    assert_eq!(config.disks[0].path, cwd.join("state.img"));
    assert!(matches!(&config.fw_cfg[0].value, FwCfgValue::File(p) if *p == cwd.join("x.bin")));
}
