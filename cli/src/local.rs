pub fn run(_: LocalCommand) -> anyhow::Result<()> {
    Ok(())
}
#[derive(clap::Subcommand)]
pub enum LocalCommand {
    Up,
}
