//! Flows (docs/DESIGN.md §12): a flow is one Python function whose `await`s are actor calls.
//! `asya flow compile` turns it into a [`Program`] (a bounded IR: calls, mutations,
//! branches, loops with a guard, try regions, raise, return, fan-out); the envelope carries
//! the program and its [`Position`], and the sidecar runs [`resume`] after each handler, so a
//! branch, a loop or a mutation costs no queue hop and no pod.
//!
//! Pure: no I/O. Shared by the compiler (cli) and the sidecar; neither imports the other.

pub mod error;
pub mod eval;
pub mod expr;
pub mod ir;
pub mod trace;

pub use error::FlowError;
pub use eval::{Evaluation, Event, Outcome, Position, resume};
pub use ir::{Expr, Instr, Program};

use serde::{Deserialize, Serialize};

/// The envelope field a flow travels in: `{"program": {...}, "pc": 3, ...}`.
pub const ENVELOPE_FIELD: &str = "flow";

/// The entry actor's sidecar variable holding the flow's program (JSON): an envelope that
/// arrives there without a `flow` field starts the flow.
pub const PROGRAM_ENV: &str = "ASYA_FLOW_PROGRAM";

/// The decisions of the last evaluations, kept in the envelope for `asya trace` (the most
/// recent [`MAX_TRAIL`]).
pub const MAX_TRAIL: usize = 64;

/// What an envelope in a flow carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Carried {
    pub program: Program,
    #[serde(flatten)]
    pub at: Position,
    /// Decisions taken so far (`"12:else"`, `"20:except KeyError"`), oldest first, bounded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trail: Vec<String>,
    /// Fan-outs this envelope has made so far: the next one's join is told apart from the
    /// earlier ones' (the same envelope id fans out again after a join, or in a loop).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fan_outs: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Carried {
    pub fn new(program: Program) -> Carried {
        Carried {
            program,
            at: Position::default(),
            trail: Vec::new(),
            fan_outs: 0,
        }
    }

    /// Runs the program after `event` and records its decisions.
    pub fn resume(&mut self, state: &mut serde_json::Value, event: Event) -> Evaluation {
        let ev = resume(&self.program, &mut self.at, state, event);
        self.trail.extend(ev.trail.iter().cloned());
        if self.trail.len() > MAX_TRAIL {
            let cut = self.trail.len() - MAX_TRAIL;
            self.trail.drain(..cut);
        }
        ev
    }
}

#[cfg(test)]
mod tests;
