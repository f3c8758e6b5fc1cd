//! What a VM looks like ([`VmConfig`]) and the QEMU command line it becomes.
//!
//! The command line is built by a pure function ([`VmConfig::qemu_args`]) from the config and
//! the per-VM runtime paths, so it is unit-tested without starting anything.
//!
//! The machine is the hawser reference platform: q35, `-nodefaults` (no NIC, no VGA, no
//! monitor: nothing the config does not ask for), the serial console into a file, QMP on a
//! unix socket, virtio-rng (the guest's first `getrandom()` otherwise waits for entropy), and
//! optionally a swtpm-backed TPM, fw_cfg entries and raw virtio disks.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::QemuError;
use crate::esp::EspFile;
use crate::host::{OVMF_CODE, OVMF_VARS, QEMU_BINARY};

/// Environment variable choosing the default accelerator (`tcg` if unset; `kvm` where usable).
pub const ENV_ACCEL: &str = "HAWSER_QEMU_ACCEL";
/// Environment variable naming a directory where every VM's logs are kept after teardown.
pub const ENV_KEEP_LOGS: &str = "HAWSER_QEMU_KEEP_LOGS";
/// The fw_cfg directory hawser reads its unmeasured per-boot settings from.
pub const FW_CFG_PREFIX: &str = "opt/hawser/";
/// QEMU's limit for fw_cfg file names (FW_CFG_MAX_FILE_PATH minus the NUL).
const FW_CFG_NAME_MAX: usize = 55;
/// virtio-blk serial numbers are at most 20 bytes (VIRTIO_BLK_ID_BYTES).
const VIRTIO_BLK_SERIAL_MAX: usize = 20;
/// The virtio-blk serial of a whole boot disk image ([`Esp::Image`], [`VmConfig::uefi_disk`]):
/// the guest sees it as `/sys/block/vdX/serial` and `/dev/disk/by-id/virtio-hawser-boot`.
pub const BOOT_DISK_SERIAL: &str = "hawser-boot";

/// How the guest boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boot {
    /// Platform firmware (OVMF) booting an ESP disk: the real boot chain.
    Uefi {
        /// The firmware.
        firmware: Ovmf,
        /// The ESP disk.
        esp: Esp,
    },
    /// QEMU loads the kernel and initrd itself (no firmware, no UKI): the fast path for tests
    /// of PID 1 that do not need the measured boot chain.
    DirectKernel {
        /// The bzImage.
        kernel: PathBuf,
        /// The initramfs.
        initrd: Option<PathBuf>,
        /// The kernel command line.
        cmdline: String,
    },
}

/// OVMF firmware files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ovmf {
    /// The code volume, mapped read-only.
    pub code: PathBuf,
    /// The variable-store template; each VM boots a private copy of it.
    pub vars_template: PathBuf,
}

impl Default for Ovmf {
    /// Debian's `ovmf` package, 4 MiB build without Secure Boot.
    fn default() -> Self {
        Ovmf {
            code: PathBuf::from(OVMF_CODE),
            vars_template: PathBuf::from(OVMF_VARS),
        }
    }
}

/// The disk OVMF boots from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Esp {
    /// Build a GPT + FAT ESP with these files for this VM (see [`crate::build_esp_image`]).
    Files(Vec<EspFile>),
    /// Boot this existing whole-disk image (raw, e.g. the ESP + root + verity disk of
    /// `hawser_image::disk::build_disk_image`), attached read-only with the serial
    /// [`BOOT_DISK_SERIAL`]. Read-only keeps the image pristine, so several boots (also at the
    /// same time) can share it: OVMF and systemd-stub only read the ESP, and the root and
    /// verity partitions are read-only by design.
    Image(PathBuf),
}

/// The TPM interface the guest sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TpmModel {
    /// TPM 2.0 Command Response Buffer interface (what cloud vTPMs look like).
    #[default]
    Crb,
    /// The TPM Interface Specification (FIFO) interface.
    Tis,
}

impl TpmModel {
    fn device(self) -> &'static str {
        match self {
            TpmModel::Crb => "tpm-crb",
            TpmModel::Tis => "tpm-tis",
        }
    }
}

/// The VM's TPM: a swtpm started for this boot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TpmConfig {
    /// The interface.
    pub model: TpmModel,
    /// Keep the TPM state here (e.g. to boot the same node again); fresh state if `None`.
    pub state_dir: Option<PathBuf>,
}

/// A value for an fw_cfg entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FwCfgValue {
    /// Literal text.
    String(String),
    /// The contents of a host file.
    File(PathBuf),
}

/// An fw_cfg entry (`-fw_cfg name=…`); the guest reads it under
/// `/sys/firmware/qemu_fw_cfg/by_name/<name>/raw`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwCfgEntry {
    /// The full name, e.g. `opt/hawser/quote_nonce`.
    pub name: String,
    /// The value.
    pub value: FwCfgValue,
}

/// An extra raw disk, attached as virtio-blk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// The raw image file.
    pub path: PathBuf,
    /// The serial the guest sees (`/sys/block/vdX/serial`, `/dev/disk/by-id/virtio-<serial>`).
    pub serial: String,
    /// Attach read-only.
    pub read_only: bool,
}

/// A VM to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// A short name for logs, errors and kept log files.
    pub name: String,
    /// The QEMU binary (default `qemu-system-x86_64` from PATH).
    pub qemu_binary: PathBuf,
    /// Guest memory in MiB (default 1024).
    pub memory_mib: u32,
    /// Virtual CPUs (default 1).
    pub cpus: u32,
    /// `-accel` value (default: `$HAWSER_QEMU_ACCEL`, else `tcg`).
    pub accel: String,
    /// `-cpu` model (default `max`: everything the accelerator offers, e.g. AES-NI under TCG,
    /// which QEMU's default `qemu64` model lacks).
    pub cpu_model: Option<String>,
    /// How the guest boots.
    pub boot: Boot,
    /// The TPM, if any.
    pub tpm: Option<TpmConfig>,
    /// fw_cfg entries.
    pub fw_cfg: Vec<FwCfgEntry>,
    /// Extra raw disks.
    pub disks: Vec<Disk>,
    /// Attach virtio-rng fed from the host's `/dev/urandom` (default on).
    pub rng: bool,
    /// Make a guest reboot exit QEMU (`-no-reboot`, default on): a test then sees the reboot
    /// as an exit instead of a boot loop.
    pub no_reboot: bool,
    /// Console lines that mean the boot failed: `wait_for_line` fails early when it passes one
    /// (after checking it against the awaited pattern). Default: kernel panics.
    pub fail_patterns: Vec<String>,
    /// Copy the console, QEMU and swtpm logs here when the VM is dropped (default:
    /// `$HAWSER_QEMU_KEEP_LOGS`).
    pub keep_logs_dir: Option<PathBuf>,
    /// Appended verbatim to the QEMU command line (e.g. netdevs of later issues).
    pub extra_args: Vec<String>,
    /// Empty CD-ROM drives (AHCI) ahead of the ESP in the boot order: OVMF tries each, fails
    /// (no medium) and goes on, as a firmware with a removable-media option first does.
    /// Default 0. UEFI boots only.
    pub empty_cdroms_first: u8,
}

impl VmConfig {
    fn new(boot: Boot) -> Self {
        VmConfig {
            name: "hawser-vm".into(),
            qemu_binary: PathBuf::from(QEMU_BINARY),
            memory_mib: 1024,
            cpus: 1,
            accel: default_accel(),
            cpu_model: Some("max".into()),
            boot,
            tpm: None,
            fw_cfg: Vec::new(),
            disks: Vec::new(),
            rng: true,
            no_reboot: true,
            fail_patterns: vec!["Kernel panic - not syncing".into()],
            keep_logs_dir: std::env::var_os(ENV_KEEP_LOGS)
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
            extra_args: Vec::new(),
            empty_cdroms_first: 0,
        }
    }

    /// OVMF booting an ESP whose `\EFI\BOOT\BOOTX64.EFI` is `uki` (any EFI application).
    pub fn uefi(uki: impl Into<PathBuf>) -> Self {
        VmConfig::new(Boot::Uefi {
            firmware: Ovmf::default(),
            esp: Esp::Files(vec![EspFile::default_boot_loader(uki)]),
        })
    }

    /// OVMF booting a whole disk image (GPT with an ESP whose `\EFI\BOOT\BOOTX64.EFI` is the
    /// UKI), attached read-only as virtio-blk with the serial [`BOOT_DISK_SERIAL`]; the same as
    /// `uefi_with_esp(Esp::Image(disk))`.
    pub fn uefi_disk(disk: impl Into<PathBuf>) -> Self {
        VmConfig::uefi_with_esp(Esp::Image(disk.into()))
    }

    /// OVMF booting an ESP with these files.
    pub fn uefi_with_esp(esp: Esp) -> Self {
        VmConfig::new(Boot::Uefi {
            firmware: Ovmf::default(),
            esp,
        })
    }

    /// QEMU's direct kernel boot (no firmware).
    pub fn direct_kernel(
        kernel: impl Into<PathBuf>,
        initrd: Option<PathBuf>,
        cmdline: impl Into<String>,
    ) -> Self {
        VmConfig::new(Boot::DirectKernel {
            kernel: kernel.into(),
            initrd,
            cmdline: cmdline.into(),
        })
    }

    /// Sets the name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the memory size.
    pub fn memory_mib(mut self, memory_mib: u32) -> Self {
        self.memory_mib = memory_mib;
        self
    }

    /// Sets the number of vCPUs.
    pub fn cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    /// Sets the accelerator (`tcg`, `kvm`).
    pub fn accel(mut self, accel: impl Into<String>) -> Self {
        self.accel = accel.into();
        self
    }

    /// Adds a TPM.
    pub fn tpm(mut self, tpm: TpmConfig) -> Self {
        self.tpm = Some(tpm);
        self
    }

    /// Adds `opt/hawser/<key>` with a string value.
    pub fn fw_cfg_string(mut self, key: &str, value: impl Into<String>) -> Self {
        self.fw_cfg.push(FwCfgEntry {
            name: format!("{FW_CFG_PREFIX}{key}"),
            value: FwCfgValue::String(value.into()),
        });
        self
    }

    /// Adds `opt/hawser/<key>` with a file's contents.
    pub fn fw_cfg_file(mut self, key: &str, path: impl Into<PathBuf>) -> Self {
        self.fw_cfg.push(FwCfgEntry {
            name: format!("{FW_CFG_PREFIX}{key}"),
            value: FwCfgValue::File(path.into()),
        });
        self
    }

    /// Adds a raw read-write virtio disk.
    pub fn disk(mut self, path: impl Into<PathBuf>, serial: impl Into<String>) -> Self {
        self.disks.push(Disk {
            path: path.into(),
            serial: serial.into(),
            read_only: false,
        });
        self
    }

    /// Puts `n` empty CD-ROM drives before the ESP in the boot order (see
    /// [`VmConfig::empty_cdroms_first`]).
    pub fn empty_cdroms_first(mut self, n: u8) -> Self {
        self.empty_cdroms_first = n;
        self
    }

    /// Keeps the logs in `dir` after teardown.
    pub fn keep_logs_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.keep_logs_dir = Some(dir.into());
        self
    }

    /// Checks what QEMU would only report at run time, or misparse.
    /// The same configuration with every host file path absolute: QEMU runs in the VM's work
    /// directory, where a path relative to the caller's would name nothing.
    pub fn with_absolute_paths(mut self) -> Self {
        fn absolute(path: &mut PathBuf) {
            if let Ok(abs) = std::path::absolute(&*path) {
                *path = abs;
            }
        }
        match &mut self.boot {
            Boot::Uefi {
                esp: Esp::Image(image),
                ..
            } => absolute(image),
            Boot::Uefi { .. } => {}
            Boot::DirectKernel { kernel, initrd, .. } => {
                absolute(kernel);
                if let Some(initrd) = initrd {
                    absolute(initrd);
                }
            }
        }
        for disk in &mut self.disks {
            absolute(&mut disk.path);
        }
        for entry in &mut self.fw_cfg {
            if let FwCfgValue::File(path) = &mut entry.value {
                absolute(path);
            }
        }
        self
    }

    pub fn validate(&self) -> Result<(), QemuError> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(QemuError::invalid(format!(
                "VM name {:?} must be non-empty ASCII letters, digits, '-', '_' or '.'",
                self.name
            )));
        }
        if self.memory_mib < 64 {
            return Err(QemuError::invalid(format!(
                "{} MiB of memory is too little",
                self.memory_mib
            )));
        }
        if self.cpus == 0 {
            return Err(QemuError::invalid("a VM needs at least one CPU"));
        }
        let mut names = std::collections::BTreeSet::new();
        for entry in &self.fw_cfg {
            if !entry.name.starts_with("opt/") || entry.name.len() > FW_CFG_NAME_MAX {
                return Err(QemuError::invalid(format!(
                    "fw_cfg name {:?} must start with \"opt/\" and be at most {FW_CFG_NAME_MAX} bytes",
                    entry.name
                )));
            }
            if !entry.name.chars().all(|c| c.is_ascii_graphic() && c != ',') {
                return Err(QemuError::invalid(format!(
                    "fw_cfg name {:?} must be printable ASCII without commas",
                    entry.name
                )));
            }
            if !names.insert(&entry.name) {
                return Err(QemuError::invalid(format!(
                    "fw_cfg name {:?} is given twice",
                    entry.name
                )));
            }
        }
        let mut serials = std::collections::BTreeSet::new();
        if let Boot::Uefi {
            esp: Esp::Image(_), ..
        } = &self.boot
        {
            serials.insert(BOOT_DISK_SERIAL);
        }
        for disk in &self.disks {
            if !serials.insert(disk.serial.as_str()) {
                return Err(QemuError::invalid(format!(
                    "disk serial {:?} of {} is used twice",
                    disk.serial,
                    disk.path.display()
                )));
            }
            if disk.serial.is_empty()
                || disk.serial.len() > VIRTIO_BLK_SERIAL_MAX
                || !disk
                    .serial
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
            {
                return Err(QemuError::invalid(format!(
                    "disk serial {:?} of {} must be 1 to {VIRTIO_BLK_SERIAL_MAX} ASCII letters, digits, '-' or '_'",
                    disk.serial,
                    disk.path.display()
                )));
            }
        }
        if let Boot::DirectKernel { cmdline, .. } = &self.boot
            && cmdline.contains('\n')
        {
            return Err(QemuError::invalid(
                "the kernel command line contains a newline",
            ));
        }
        Ok(())
    }

    /// The QEMU argument list (without the binary) for this config and these runtime paths.
    pub fn qemu_args(&self, paths: &RuntimePaths) -> Result<Vec<OsString>, QemuError> {
        self.validate()?;
        let mut args = Args::default();
        args.push_all(["-name", &self.name]);
        // No default devices (NIC, VGA, monitor, parallel port) and no host config file:
        // the VM has exactly what this function adds.
        args.push_all(["-no-user-config", "-nodefaults"]);
        args.push_all(["-machine", "q35"]);
        args.push_all(["-accel", &self.accel]);
        if let Some(cpu) = &self.cpu_model {
            args.push_all(["-cpu", cpu]);
        }
        args.push_all(["-m", &self.memory_mib.to_string()]);
        args.push_all(["-smp", &self.cpus.to_string()]);
        args.push_all(["-display", "none"]);
        if self.no_reboot {
            args.push("-no-reboot");
        }

        args.push("-chardev");
        args.push(opt("file,id=console,path=", &paths.console_log));
        args.push_all(["-serial", "chardev:console"]);
        args.push("-qmp");
        args.push(opt_suffix(
            "unix:",
            &paths.qmp_socket,
            ",server=on,wait=off",
        ));

        match &self.boot {
            Boot::Uefi {
                firmware,
                esp: esp_source,
            } => {
                let vars = paths.ovmf_vars.as_deref().ok_or_else(|| {
                    QemuError::invalid("UEFI boot needs a per-VM copy of the OVMF variable store")
                })?;
                let esp = paths
                    .esp_image
                    .as_deref()
                    .ok_or_else(|| QemuError::invalid("UEFI boot needs an ESP image"))?;
                args.push("-drive");
                args.push(opt_suffix(
                    "if=pflash,format=raw,unit=0,readonly=on,file=",
                    &firmware.code,
                    "",
                ));
                args.push("-drive");
                args.push(opt("if=pflash,format=raw,unit=1,file=", vars));
                // A caller's image is never written to, and the guest finds it by its serial.
                // The per-VM ESP stays writable like a real one (boot loaders write e.g. a
                // random seed to it).
                let (read_only, serial) = if matches!(esp_source, Esp::Image(_)) {
                    (",readonly=on", format!(",serial={BOOT_DISK_SERIAL}"))
                } else {
                    ("", String::new())
                };
                args.push("-drive");
                args.push(opt(
                    &format!("if=none,id=esp,format=raw{read_only},file="),
                    esp,
                ));
                // OVMF's boot order (from fw_cfg "bootorder") follows bootindex: the empty
                // CD-ROMs first if asked for, then the ESP.
                for i in 0..self.empty_cdroms_first {
                    args.push_all([
                        "-drive",
                        &format!("if=none,id=cdrom{i},media=cdrom,readonly=on"),
                        "-device",
                        &format!("ide-cd,drive=cdrom{i},bus=ide.{i},bootindex={i}"),
                    ]);
                }
                args.push_all([
                    "-device",
                    &format!(
                        "virtio-blk-pci,drive=esp,bootindex={}{serial}",
                        self.empty_cdroms_first
                    ),
                ]);
            }
            Boot::DirectKernel {
                kernel,
                initrd,
                cmdline,
            } => {
                args.push("-kernel");
                args.push(kernel.as_os_str().to_owned());
                if let Some(initrd) = initrd {
                    args.push("-initrd");
                    args.push(initrd.as_os_str().to_owned());
                }
                args.push_all(["-append", cmdline]);
            }
        }

        if let Some(tpm) = &self.tpm {
            let socket = paths
                .tpm_ctrl_socket
                .as_deref()
                .ok_or_else(|| QemuError::invalid("a TPM needs the swtpm control socket path"))?;
            args.push("-chardev");
            args.push(opt("socket,id=tpmchr,path=", socket));
            args.push_all(["-tpmdev", "emulator,id=tpm0,chardev=tpmchr"]);
            args.push_all(["-device", &format!("{},tpmdev=tpm0", tpm.model.device())]);
        }

        if self.rng {
            args.push_all(["-object", "rng-random,id=rng0,filename=/dev/urandom"]);
            args.push_all(["-device", "virtio-rng-pci,rng=rng0"]);
        }

        for entry in &self.fw_cfg {
            args.push("-fw_cfg");
            let head = format!("name={},", entry.name);
            args.push(match &entry.value {
                FwCfgValue::String(value) => {
                    let mut arg = OsString::from(format!("{head}string="));
                    arg.push(escape(OsStr::new(value)));
                    arg
                }
                FwCfgValue::File(path) => opt(&format!("{head}file="), path),
            });
        }

        for (index, disk) in self.disks.iter().enumerate() {
            let read_only = if disk.read_only { ",readonly=on" } else { "" };
            args.push("-drive");
            args.push(opt(
                &format!("if=none,id=disk{index},format=raw,cache=unsafe{read_only},file="),
                &disk.path,
            ));
            args.push_all([
                "-device",
                &format!("virtio-blk-pci,drive=disk{index},serial={}", disk.serial),
            ]);
        }

        for arg in &self.extra_args {
            args.push(arg);
        }
        Ok(args.0)
    }
}

/// The accelerator from `$HAWSER_QEMU_ACCEL`, else `tcg`.
pub fn default_accel() -> String {
    std::env::var(ENV_ACCEL)
        .ok()
        .filter(|accel| !accel.trim().is_empty())
        .unwrap_or_else(|| "tcg".into())
}

/// Per-VM files the command line refers to (created by [`crate::Vm::start`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimePaths {
    /// The serial console log QEMU writes.
    pub console_log: PathBuf,
    /// The QMP unix socket QEMU listens on.
    pub qmp_socket: PathBuf,
    /// swtpm's control socket, with a TPM.
    pub tpm_ctrl_socket: Option<PathBuf>,
    /// The VM's copy of the OVMF variable store, for UEFI boot.
    pub ovmf_vars: Option<PathBuf>,
    /// The ESP disk image, for UEFI boot.
    pub esp_image: Option<PathBuf>,
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push(&mut self, arg: impl Into<OsString>) {
        self.0.push(arg.into());
    }

    fn push_all<'a>(&mut self, args: impl IntoIterator<Item = &'a str>) {
        self.0.extend(args.into_iter().map(OsString::from));
    }
}

/// Escapes a value for QEMU's option syntax, where `,` separates options and `,,` is a comma.
fn escape(value: &OsStr) -> OsString {
    let mut out = Vec::with_capacity(value.len());
    for &byte in value.as_bytes() {
        out.push(byte);
        if byte == b',' {
            out.push(b',');
        }
    }
    OsString::from_vec(out)
}

/// `prefix` + escaped `path`.
fn opt(prefix: &str, path: &Path) -> OsString {
    opt_suffix(prefix, path, "")
}

/// `prefix` + escaped `path` + `suffix`.
fn opt_suffix(prefix: &str, path: &Path, suffix: &str) -> OsString {
    let mut arg = OsString::from(prefix);
    arg.push(escape(path.as_os_str()));
    arg.push(suffix);
    arg
}

#[cfg(test)]
mod tests {
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
}
