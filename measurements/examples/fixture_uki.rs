//! Re-assembles the UKI of the `tests/fixtures/ovmf-boot` event-log fixture and writes it to the
//! path given as the only argument:
//!
//! ```sh
//! cargo run -p hawser-measurements --example fixture_uki -- /tmp/fixture.efi
//! hawser local up --image /tmp/fixture.efi --once   # the console shows HAWSER_EVENT_LOG …
//! ```
//!
//! The UKI is `hawser_image::uki::assemble_uki` of the pinned systemd-stub 257 and Linux 6.12
//! from the input cache (`hawser image fetch`) with the fixture's own `.osrel`, `.cmdline` and
//! `.initrd` (a 9 KiB freestanding /init that prints the PCRs and the event log, see
//! `evinit.c`), so the tests can rebuild it bit for bit and predict its measurements.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or("usage: fixture_uki OUT.efi")?;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ovmf-boot");
    let lock = hawser_image::inputs::InputLock::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock"),
    )?;
    let cached = hawser_image::inputs::cached(&lock, &hawser_image::inputs::cache_dir())?;
    let stub = std::fs::read(&cached.stub)?;
    let linux = std::fs::read(&cached.kernel_image)?;
    let sections = hawser_image::uki::UkiSections {
        osrel: std::fs::read(fixture.join("osrel"))?,
        cmdline: std::fs::read(fixture.join("cmdline"))?,
        uname: cached.kernel_release.as_bytes().to_vec(),
        linux,
        initrd: std::fs::read(fixture.join("initrd.cpio.zst"))?,
    };
    let uki = hawser_image::uki::assemble_uki(&stub, &sections)?;
    std::fs::write(&out, &uki)?;
    println!("{} ({} bytes)", out.display(), uki.len());
    Ok(())
}
