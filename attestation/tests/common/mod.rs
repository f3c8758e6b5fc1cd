//! A real swtpm for the TPM tests: the harness's TCP swtpm (one private instance per test on a
//! free loopback port pair, started up, killed on drop), plus a tpm2-tools runner.

use std::path::Path;
use std::process::Command;

pub struct Swtpm(hawser_harness::Swtpm);

impl Swtpm {
    /// Starts `swtpm socket --tpm2` with fresh state, already started up (TPM2_Startup(CLEAR)).
    pub fn start() -> Swtpm {
        Swtpm(
            hawser_harness::Swtpm::start(&hawser_harness::SwtpmOptions::tcp())
                .unwrap_or_else(|e| panic!("swtpm: {e}")),
        )
    }

    /// The TCTI string for `Tpm::open` / tpm2-tools.
    pub fn tcti(&self) -> String {
        self.0.tcti().expect("a TCP swtpm has a TCTI")
    }

    /// Runs a tpm2-tools command against this swtpm (no Tpm connection may be open: swtpm
    /// serves one client at a time).
    pub fn tpm2_tool(&self, tool: &str, args: &[&str], cwd: &Path) -> std::process::Output {
        // A missing tool fails naming its Debian package (tpm2-tools).
        let binary = hawser_harness::find_binary(Path::new(tool)).unwrap_or_else(|e| panic!("{e}"));
        Command::new(binary)
            .args(args)
            .env("TPM2TOOLS_TCTI", self.tcti())
            .current_dir(cwd)
            .output()
            .unwrap_or_else(|e| panic!("{tool} runs: {e}"))
    }
}
