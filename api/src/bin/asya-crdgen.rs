//! Writes the CRDs generated from the Rust types into a directory (`make crds`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "deploy/crds".into()),
    );
    let crds = match asya_api::crd::crds() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("asya-crdgen: cannot render CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("asya-crdgen: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for (name, yaml) in crds {
        let path = dir.join(name);
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("asya-crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
