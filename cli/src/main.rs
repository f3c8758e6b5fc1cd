//! `hawser`: the admin and image-developer CLI. Each subcommand is a thin layer over a library
//! crate; this file only parses arguments, sets up logging and maps errors to exit codes.

mod admin;
mod image;
mod lifecycle_cli;
mod measurements;

use std::ffi::OsString;

use hawser_cli::{local, peers};

use clap::parser::ValueSource;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hawser",
    version,
    about = "Boot path of a confidential Kubernetes node"
)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `debug` or `hawser_image=debug`.
    #[arg(long, global = true, env = "HAWSER_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Verify a node waiting on port 9000 and initialize a new cluster on it.
    Init(Box<admin::InitArgs>),
    /// Verify a node of an existing cluster and let it reopen its state disk (no join service).
    Recover(admin::RecoverArgs),
    /// Build, fetch inputs for, and inspect the measured image.
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Boot the image locally in QEMU with a software TPM (runs `hawser-local`; `hawser local
    /// --help` shows its commands).
    #[command(disable_help_flag = true)]
    Local {
        /// What `hawser-local` is given, e.g. `up --nodes 3` or `--help`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// Predict PCR values from a UKI, check them against the committed reference, explain an
    /// event log.
    #[command(subcommand)]
    Measurements(measurements::MeasurementsCommand),
    /// Show the WireGuard mesh as the join service sees it: every member, its last poll and
    /// its tunnel's handshakes and traffic.
    Peers(peers::PeersArgs),
    /// The releases (node images) the cluster's join services accept: list, add, retire.
    #[command(subcommand)]
    Release(lifecycle_cli::ReleaseCommand),
    /// Revoke or readmit a node; list the nodes the cluster store knows.
    #[command(subcommand)]
    Node(lifecycle_cli::NodeCommand),
    /// Ask running nodes for a fresh quote and check it against the accepted releases and the
    /// cluster's lock; exits non-zero if any node fails.
    Verify(lifecycle_cli::VerifyArgs),
}

fn main() -> std::process::ExitCode {
    let matches = Cli::command().get_matches();
    // A `--log` typed before `local` reaches hawser-local; otherwise it reads its own flags
    // and HAWSER_LOG, as `hawser` did.
    let log_given = matches.value_source("log") == Some(ValueSource::CommandLine);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Init(args) => admin::init(*args),
        Command::Recover(args) => admin::recover(args),
        Command::Image(cmd) => image::run(cmd),
        // Returns only if hawser-local could not be started.
        Command::Local { args } => {
            Err(local::exec(&args, log_given.then_some(cli.log.as_str())).into())
        }
        Command::Measurements(cmd) => measurements::run(cmd),
        Command::Peers(args) => peers::run(args),
        Command::Release(cmd) => lifecycle_cli::release(cmd),
        Command::Node(cmd) => lifecycle_cli::node(cmd),
        Command::Verify(args) => lifecycle_cli::verify(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
