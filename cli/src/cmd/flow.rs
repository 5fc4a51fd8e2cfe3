//! `asya flow compile|validate`: reads the flow file, compiles it, writes the files.

use std::path::Path;

use crate::args::{FlowCommand, FlowSource};
use crate::error::{CliError, Exit, Result};
use crate::flow::compile::{self, Compiled, Options};
use crate::flow::manifests::{self, Deploy};

pub fn run(c: &FlowCommand) -> Result<(String, Exit)> {
    match c {
        FlowCommand::Validate { source } => {
            let compiled = load(source)?;
            Ok((summary(&compiled, source), Exit::Ok))
        }
        FlowCommand::Compile {
            source,
            output_dir,
            image,
            overwrite,
        } => {
            let compiled = load(source)?;
            let files = manifests::files(
                &compiled,
                &Deploy {
                    image: image.clone(),
                },
            );
            write(output_dir, &files, *overwrite)?;
            let mut out = summary(&compiled, source);
            for f in &files {
                out += &format!("wrote {}\n", output_dir.join(&f.name).display());
            }
            Ok((out, Exit::Ok))
        }
    }
}

fn load(s: &FlowSource) -> Result<Compiled> {
    let text = std::fs::read_to_string(&s.file).map_err(|e| CliError::NotFound {
        what: format!("flow file {}", s.file.display()),
        why: e.to_string(),
    })?;
    let name = s.file.display().to_string();
    let opts = Options {
        flow: s.flow.clone(),
        module: s.module.clone(),
        max_iterations: s.max_iterations,
    };
    compile::compile(&text, &name, &opts).map_err(|refusals| {
        let lines: Vec<String> = refusals.iter().map(|r| format!("{name}:{r}")).collect();
        CliError::Usage(format!(
            "{} does not compile ({} refused):\n{}",
            name,
            refusals.len(),
            lines.join("\n")
        ))
    })
}

fn summary(c: &Compiled, s: &FlowSource) -> String {
    let p = &c.program;
    let entry = match p.entry() {
        Some((a, true)) => a,
        Some((a, false)) => format!("{a} (a branch before the first call: one hop from it)"),
        None => "-".into(),
    };
    let actors: Vec<String> = c
        .actors
        .iter()
        .map(|a| format!("{} ({})", a.actor, a.handler))
        .collect();
    format!(
        "flow {} from {}: version {}, {} instructions, entry {entry}\nactors: {}\n",
        p.flow,
        s.file.display(),
        p.version,
        p.code.len(),
        actors.join(", ")
    )
}

fn write(dir: &Path, files: &[manifests::File], overwrite: bool) -> Result<()> {
    let fail = |what: &Path, e: std::io::Error| {
        CliError::Failed(format!("cannot write {}: {e}", what.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e))?;
    if !overwrite && let Some(f) = files.iter().find(|f| dir.join(&f.name).exists()) {
        return Err(CliError::Usage(format!(
            "{} exists; pass --overwrite to replace the files in {}",
            dir.join(&f.name).display(),
            dir.display()
        )));
    }
    for f in files {
        let path = dir.join(&f.name);
        std::fs::write(&path, &f.text).map_err(|e| fail(&path, e))?;
    }
    Ok(())
}
