//! `asya-webhook inject`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct InjectArgs {
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    #[arg(long)]
    pub actor: Option<PathBuf>,
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_args: InjectArgs) -> ExitCode {
    eprintln!("asya-webhook inject: not yet implemented");
    ExitCode::from(2)
}
