//! The ACPI power button as a shutdown request.
//!
//! Pressing the power button (QEMU's `system_powerdown`, a cloud's "stop") raises an ACPI
//! event. The kernel does nothing with it by itself: no signal reaches PID 1. The ACPI `button`
//! driver turns it into a `KEY_POWER` key press on an input device named "Power Button", which
//! `evdev` exposes as `/dev/input/eventN`; this is what systemd-logind listens to, and what
//! hawser listens to. (The alternatives are worse: `/proc/acpi/event` is gone from modern
//! kernels, and the ACPI netlink family needs a generic-netlink client for one bit.)
//!
//! Ctrl-Alt-Del is handled elsewhere: PID 1 disables the kernel's immediate reboot, so the
//! kernel sends it SIGINT.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The input device name the ACPI button driver gives the power button.
pub const POWER_BUTTON_NAME: &str = "Power Button";

const EV_KEY: u16 = 0x01;
const KEY_POWER: u16 = 116;
/// `struct input_event` on 64-bit Linux: `struct timeval` (16 bytes), type, code (u16), value (i32).
const INPUT_EVENT_SIZE: usize = 24;

/// Whether one `struct input_event` is a power key press (value 1; 0 is release, 2 repeat).
pub fn is_power_key_press(event: &[u8; INPUT_EVENT_SIZE]) -> bool {
    let kind = u16::from_ne_bytes([event[16], event[17]]);
    let code = u16::from_ne_bytes([event[18], event[19]]);
    let value = i32::from_ne_bytes([event[20], event[21], event[22], event[23]]);
    kind == EV_KEY && code == KEY_POWER && value == 1
}

/// The `/dev/input/eventN` nodes of input devices named [`POWER_BUTTON_NAME`], found through
/// `<sysfs>/class/input/eventN/device/name`. There can be two: the ACPI fixed-feature button
/// (`LNXPWRBN`) and a `PNP0C0C` device.
pub fn find_power_buttons(sysfs: &Path, dev: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(sysfs.join("class/input")) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            if !name.starts_with("event") {
                return None;
            }
            let device_name =
                std::fs::read_to_string(sysfs.join("class/input").join(&name).join("device/name"))
                    .ok()?;
            (device_name.trim_end() == POWER_BUTTON_NAME).then(|| dev.join("input").join(name))
        })
        .collect();
    found.sort();
    found
}

/// Waits until the power button behind `event_file` reports a key press; an error if the file
/// cannot be opened or read.
pub async fn wait_for_press(event_file: &Path) -> io::Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(event_file)?;
    // SAFETY: the `File` owns its descriptor, keeps it open for as long as the AsyncFd owns the
    // File, and always returns the same descriptor from as_raw_fd.
    let fd = unsafe { AsyncFd::register_with_interest(file, Interest::READABLE) }?;
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| read_events(inner.get_ref())) {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => continue,
            Ok(Err(e)) => return Err(e),
            // Spurious readiness: wait again.
            Err(_would_block) => continue,
        }
    }
}

/// Reads all queued events; true if one was a power key press.
fn read_events(mut file: &File) -> io::Result<bool> {
    let mut buffer = [0u8; INPUT_EVENT_SIZE * 16];
    let mut pressed = false;
    loop {
        let n = match file.read(&mut buffer) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && pressed => return Ok(true),
            Err(e) => return Err(e),
        };
        // evdev only ever returns whole events.
        for chunk in buffer[..n].chunks_exact(INPUT_EVENT_SIZE) {
            let event: &[u8; INPUT_EVENT_SIZE] = chunk.try_into().map_err(io::Error::other)?;
            pressed |= is_power_key_press(event);
        }
        if pressed {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: u16, code: u16, value: i32) -> [u8; INPUT_EVENT_SIZE] {
        let mut e = [0u8; INPUT_EVENT_SIZE];
        e[16..18].copy_from_slice(&kind.to_ne_bytes());
        e[18..20].copy_from_slice(&code.to_ne_bytes());
        e[20..24].copy_from_slice(&value.to_ne_bytes());
        e
    }

    #[test]
    fn only_a_power_key_press_counts() {
        assert!(is_power_key_press(&event(EV_KEY, KEY_POWER, 1)));
        assert!(!is_power_key_press(&event(EV_KEY, KEY_POWER, 0)));
        assert!(!is_power_key_press(&event(EV_KEY, 115, 1)));
        // EV_SYN
        assert!(!is_power_key_press(&event(0, 0, 0)));
    }

    #[test]
    fn finds_power_buttons_by_name_in_sysfs() {
        let root = tempfile::tempdir().unwrap();
        let sysfs = root.path().join("sys");
        for (node, name) in [
            ("event0", "Power Button\n"),
            ("event1", "AT Translated Set 2 keyboard\n"),
            ("event2", "Power Button\n"),
            ("mouse0", "Power Button\n"),
        ] {
            let dir = sysfs.join("class/input").join(node).join("device");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("name"), name).unwrap();
        }
        let dev = Path::new("/dev");
        assert_eq!(
            find_power_buttons(&sysfs, dev),
            [
                PathBuf::from("/dev/input/event0"),
                PathBuf::from("/dev/input/event2")
            ]
        );
        assert!(find_power_buttons(&root.path().join("none"), dev).is_empty());
    }
}
