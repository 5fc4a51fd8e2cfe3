//! `asya-webhook validate -f FILE…` (issue 2): prints every rejection and warning for the
//! AsyncActors in the files, exit 1 if anything is rejected. Owned by the API/CLI issue; this
//! placeholder keeps the subcommand wired until that lands.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Files or directories of YAML documents to check.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Cluster configuration YAML (DESIGN §7); the built-in default when absent.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(_args: ValidateArgs) -> ExitCode {
    eprintln!("asya-webhook validate: not yet implemented");
    ExitCode::from(2)
}
