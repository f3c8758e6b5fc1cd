//! The QEMU command line a [`VmConfig`] becomes: [`VmConfig::qemu_args`], a pure function of
//! the config and the per-VM [`RuntimePaths`], one step per part of the machine (console and
//! QMP, firmware and boot disk or direct kernel, TPM, RNG, fw_cfg, disks), so it is unit-tested
//! without starting anything.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::{BOOT_DISK_SERIAL, Boot, Esp, FwCfgValue, Ovmf, TpmConfig, VmConfig};
use crate::QemuError;

impl VmConfig {
    /// The QEMU argument list (without the binary) for this config and these runtime paths.
    pub fn qemu_args(&self, paths: &RuntimePaths) -> Result<Vec<OsString>, QemuError> {
        self.validate()?;
        let mut args = Args::default();
        self.machine_args(&mut args);
        console_args(&mut args, paths);
        match &self.boot {
            Boot::Uefi { firmware, esp } => self.uefi_args(&mut args, paths, firmware, esp)?,
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
            tpm_args(&mut args, paths, tpm)?;
        }
        if self.rng {
            args.push_all(["-object", "rng-random,id=rng0,filename=/dev/urandom"]);
            args.push_all(["-device", "virtio-rng-pci,rng=rng0"]);
        }
        self.fw_cfg_args(&mut args);
        self.disk_args(&mut args);
        for arg in &self.extra_args {
            args.push(arg);
        }
        Ok(args.0)
    }

    /// The machine: name, q35 with nothing by default, accelerator, CPU, memory, no display.
    fn machine_args(&self, args: &mut Args) {
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
    }

    /// UEFI boot: OVMF's code (read-only) and the VM's own variable store as pflash, the ESP
    /// (or the caller's disk image, read-only, found by its serial) after the empty CD-ROMs
    /// asked for.
    fn uefi_args(
        &self,
        args: &mut Args,
        paths: &RuntimePaths,
        firmware: &Ovmf,
        esp_source: &Esp,
    ) -> Result<(), QemuError> {
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
        Ok(())
    }

    /// The fw_cfg entries, their values escaped for QEMU's option syntax.
    fn fw_cfg_args(&self, args: &mut Args) {
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
    }

    /// The raw virtio disks, each with its serial.
    fn disk_args(&self, args: &mut Args) {
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
    }
}

/// The serial console into its log file, and QMP on its unix socket.
fn console_args(args: &mut Args, paths: &RuntimePaths) {
    args.push("-chardev");
    args.push(opt("file,id=console,path=", &paths.console_log));
    args.push_all(["-serial", "chardev:console"]);
    args.push("-qmp");
    args.push(opt_suffix(
        "unix:",
        &paths.qmp_socket,
        ",server=on,wait=off",
    ));
}

/// The TPM: swtpm's control socket as the emulator backend of the configured model.
fn tpm_args(args: &mut Args, paths: &RuntimePaths, tpm: &TpmConfig) -> Result<(), QemuError> {
    let socket = paths
        .tpm_ctrl_socket
        .as_deref()
        .ok_or_else(|| QemuError::invalid("a TPM needs the swtpm control socket path"))?;
    args.push("-chardev");
    args.push(opt("socket,id=tpmchr,path=", socket));
    args.push_all(["-tpmdev", "emulator,id=tpm0,chardev=tpmchr"]);
    args.push_all(["-device", &format!("{},tpmdev=tpm0", tpm.model.device())]);
    Ok(())
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
