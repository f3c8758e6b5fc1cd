//! What a VM looks like ([`VmConfig`]) and the QEMU command line it becomes.
//!
//! The command line is built by a pure function ([`VmConfig::qemu_args`]) from the config and
//! the per-VM runtime paths, so it is unit-tested without starting anything.
//!
//! The machine is the hawser reference platform: q35, `-nodefaults` (no NIC, no VGA, no
//! monitor: nothing the config does not ask for), the serial console into a file, QMP on a
//! unix socket, virtio-rng (the guest's first `getrandom()` otherwise waits for entropy), and
//! optionally a swtpm-backed TPM, fw_cfg entries and raw virtio disks.

use std::path::PathBuf;

use crate::QemuError;
use crate::esp::EspFile;
use crate::host::{OVMF_CODE, OVMF_VARS, QEMU_BINARY};

mod command_line;
pub use command_line::RuntimePaths;

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
}

/// The accelerator from `$HAWSER_QEMU_ACCEL`, else `tcg`.
pub fn default_accel() -> String {
    std::env::var(ENV_ACCEL)
        .ok()
        .filter(|accel| !accel.trim().is_empty())
        .unwrap_or_else(|| "tcg".into())
}

#[cfg(test)]
mod tests;
