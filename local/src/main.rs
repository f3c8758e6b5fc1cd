//! `hawser-local`: the local-cluster simulator's binary, also run as `hawser local …`. This file
//! only parses arguments, sets up logging and maps errors to exit codes.

use clap::Parser;
use hawser_local::command::{self, LocalCommand};

#[derive(Parser)]
#[command(
    name = "hawser-local",
    version,
    about = "Boot the image locally in QEMU with a software TPM (also run as `hawser local`)"
)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `debug` or `hawser_image=debug`.
    #[arg(long, global = true, env = "HAWSER_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: LocalCommand,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
    match command::run(cli.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
