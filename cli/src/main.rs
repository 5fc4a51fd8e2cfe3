//! `asya`: see cli/README.md. Logs go to stderr (`RUST_LOG`), the result to stdout, errors
//! to stderr with the exit code of their kind.

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    asya_cli::main_with_args().await
}
