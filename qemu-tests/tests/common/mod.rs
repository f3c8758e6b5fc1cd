//! Helpers shared by the QEMU test suites: the workspace, scratch directories under the target
//! directory (so `cargo clean` removes them), and building the image under test.
// Each suite is its own test binary and uses a different subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hawser_image::build::BuildOutput;
use hawser_image::pipeline::{self, PipelineOptions};

/// The hawser workspace this crate lives in.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("qemu-tests lives in the workspace")
        .to_owned()
}

/// `<target dir>/<suite>/<name>`, created if missing.
pub fn scratch(suite: &str, name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let dir = target.join(suite).join(name);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Like [`scratch`], emptied first (disk images and TPM state from an earlier run must not leak
/// into this one).
pub fn fresh_scratch(suite: &str, name: &str) -> PathBuf {
    let dir = scratch(suite, name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Builds the image from this workspace into `dir`, with `cmdline` or the default measured one.
pub fn build_image(dir: &Path, cmdline: Option<&str>) -> BuildOutput {
    let mut opts = PipelineOptions::new(&workspace(), dir);
    if let Some(cmdline) = cmdline {
        opts.cmdline = cmdline.to_owned();
    }
    let (output, timeline) =
        pipeline::build_image(&opts).unwrap_or_else(|e| panic!("image build failed: {e}"));
    eprintln!("image built in {}: {timeline:?}", dir.display());
    output
}
