//! `asya flow`: the flow compiler (Python source → the IR of `asya-flow`), the manifests it
//! writes and the graphs beside them. Pure: the command in `cmd/flow.rs` reads and writes
//! the files.

pub mod compile;
pub mod graph;
pub mod manifests;

#[cfg(test)]
mod tests;
