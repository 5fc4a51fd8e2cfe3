//! The compiled form of a flow (docs/DESIGN.md §12): a flat list of instructions with jumps,
//! small enough to travel in the envelope and evaluated with a step budget. JSON on the wire,
//! externally tagged (`{"call": {...}}`) so a reader sees what each step does.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The IR's version: a sidecar refuses a program of another (x-sump, with the reason) rather
/// than guessing what it means.
pub const IR_VERSION: u32 = 1;

/// Loop guard when the compiler is not told otherwise (the original's `--max-iterations`).
pub const DEFAULT_MAX_ITERATIONS: u32 = 100;

/// Steps one evaluation may take (instructions plus expression nodes) before the envelope goes
/// to x-sump: a flow decides in microseconds, a program that does not is broken.
pub const DEFAULT_STEP_BUDGET: u32 = 10_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// Always [`IR_VERSION`] for programs this build writes.
    pub ir: u32,
    /// The flow function's name.
    pub flow: String,
    /// The program's content hash: envelopes under way keep the program they started with.
    pub version: String,
    /// Iterations a `while` may run (per entry into the loop).
    pub max_iterations: u32,
    /// Steps per evaluation.
    pub step_budget: u32,
    pub code: Vec<Instr>,
}

/// One instruction. `line` is the flow source's, for errors and `asya trace`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instr {
    /// `state = await actor(state)`: the evaluation stops; it resumes at the next instruction
    /// with the handler's answer as the state.
    Call {
        actor: String,
        line: u32,
    },
    /// `state[k1][k2] = value` (augmented assignments compile to a `Set` of the operation).
    Set {
        target: Vec<Expr>,
        value: Expr,
        line: u32,
    },
    /// `del state[k1][k2]`.
    Del {
        target: Vec<Expr>,
        line: u32,
    },
    Jump {
        to: usize,
    },
    /// Goes on when `cond` is true, else jumps to `else_to`. `looping`: a `while` test (for
    /// the trail: `while`/`exit` rather than `if`/`else`).
    Branch {
        cond: Expr,
        else_to: usize,
        line: u32,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        looping: bool,
    },
    /// Entering a `while` afresh: its iteration count starts again.
    LoopEnter {
        id: u32,
    },
    /// The top of each iteration: counts it, and stops the flow past the guard.
    LoopGuard {
        id: u32,
        line: u32,
    },
    /// Start of a `try` body: an error raised before the matching `TryExit` goes to the first
    /// handler that matches it.
    TryEnter {
        handlers: Vec<Handler>,
        line: u32,
    },
    /// End of the innermost `try` body (also before a `break`/`continue` that leaves it).
    TryExit,
    /// End of an `except` body: the error it handled is no longer the one `raise` re-raises.
    ExceptExit,
    /// `raise` (re-raise the error being handled) or `raise Name("message")`.
    Raise {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new: Option<NewError>,
        line: u32,
    },
    /// `return state`: to x-sink with the state as the payload.
    Return {
        line: u32,
    },
    /// Fan-out: one envelope per branch; the results, in source order, are set at `target`.
    FanOut {
        target: Vec<Expr>,
        branches: FanOutBranches,
        line: u32,
    },
}

/// One `except` clause: `types` `None` is a bare `except:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handler {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<String>>,
    pub to: usize,
    pub line: u32,
}

/// `raise ValueError("msg")`: the type and the message (a constant, or no argument).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewError {
    #[serde(rename = "type")]
    pub error_type: String,
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FanOutBranches {
    /// `[a(x), b(y)]` or `asyncio.gather(a(x), b(y))`: one branch per call, in order.
    Calls(Vec<BranchCall>),
    /// `[a(x) for x in items]`: one branch per item of `items`, `var` bound to it.
    Each {
        actor: String,
        var: String,
        items: Expr,
        input: Expr,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchCall {
    pub actor: String,
    pub input: Expr,
}

/// A bounded expression: no name but the state and a comprehension's variable, no call but
/// the listed builtins and methods. Each node evaluated costs one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expr {
    Const(Value),
    /// The flow's state (its parameter).
    State,
    /// A comprehension's variable.
    Var(String),
    /// `a[b]`.
    Index(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    /// `a < b <= c`: Python's chained comparison.
    Compare {
        left: Box<Expr>,
        ops: Vec<(CmpOp, Expr)>,
    },
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// `x if cond else y`.
    IfElse(Box<Expr>, Box<Expr>, Box<Expr>),
    List(Vec<Expr>),
    Dict(Vec<(Expr, Expr)>),
    /// A builtin function: `len(x)`.
    Builtin(Builtin, Vec<Expr>),
    /// A method of a value: `state.get("k", 0)`, `s.lower()`.
    Method(Box<Expr>, Method, Vec<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CmpOp {
    Eq,
    NotEq,
    Lt,
    LtE,
    Gt,
    GtE,
    In,
    NotIn,
    Is,
    IsNot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Builtin {
    Len,
    Abs,
    Min,
    Max,
    Int,
    Float,
    Str,
    Bool,
}

impl Builtin {
    pub fn from_name(name: &str) -> Option<Builtin> {
        Some(match name {
            "len" => Builtin::Len,
            "abs" => Builtin::Abs,
            "min" => Builtin::Min,
            "max" => Builtin::Max,
            "int" => Builtin::Int,
            "float" => Builtin::Float,
            "str" => Builtin::Str,
            "bool" => Builtin::Bool,
            _ => return None,
        })
    }
    pub const NAMES: &'static str = "len, abs, min, max, int, float, str, bool";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    Get,
    Lower,
    Upper,
    Strip,
    Startswith,
    Endswith,
}

impl Method {
    pub fn from_name(name: &str) -> Option<Method> {
        Some(match name {
            "get" => Method::Get,
            "lower" => Method::Lower,
            "upper" => Method::Upper,
            "strip" => Method::Strip,
            "startswith" => Method::Startswith,
            "endswith" => Method::Endswith,
            _ => return None,
        })
    }
    pub const NAMES: &'static str = "get, lower, upper, strip, startswith, endswith";
}

impl Program {
    /// Every actor the program may call (calls and fan-out branches), first use first.
    pub fn actors(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |a: &str| {
            if !out.iter().any(|x| x == a) {
                out.push(a.to_string());
            }
        };
        for i in &self.code {
            match i {
                Instr::Call { actor, .. } => add(actor),
                Instr::FanOut { branches, .. } => match branches {
                    FanOutBranches::Calls(calls) => calls.iter().for_each(|c| add(&c.actor)),
                    FanOutBranches::Each { actor, .. } => add(actor),
                },
                _ => {}
            }
        }
        out
    }

    /// The actor a new envelope goes to first: the first call on the way from the start when
    /// no branch comes before it (then the entry's own handler runs at once); otherwise the
    /// first call of the code, and an envelope that branches elsewhere takes one hop from it.
    /// `(actor, direct)`.
    pub fn entry(&self) -> Option<(String, bool)> {
        let mut pc = 0;
        for _ in 0..self.code.len() {
            match self.code.get(pc)? {
                Instr::Call { actor, .. } => return Some((actor.clone(), true)),
                Instr::Jump { to } => pc = *to,
                Instr::Set { .. }
                | Instr::Del { .. }
                | Instr::LoopEnter { .. }
                | Instr::LoopGuard { .. }
                | Instr::TryEnter { .. }
                | Instr::TryExit
                | Instr::ExceptExit => pc += 1,
                _ => break,
            }
        }
        self.actors().into_iter().next().map(|a| (a, false))
    }

    /// Checks what the evaluator relies on: the IR version and every jump inside the code.
    /// A program from an envelope is outside input: it is checked before it runs.
    pub fn check(&self) -> Result<(), String> {
        if self.ir != IR_VERSION {
            return Err(format!(
                "flow program ir {} is not this sidecar's ({IR_VERSION})",
                self.ir
            ));
        }
        let len = self.code.len();
        let bad = |to: usize| to > len;
        for (pc, i) in self.code.iter().enumerate() {
            let wrong = match i {
                Instr::Jump { to } => bad(*to),
                Instr::Branch { else_to, .. } => bad(*else_to),
                Instr::TryEnter { handlers, .. } => handlers.iter().any(|h| bad(h.to)),
                _ => false,
            };
            if wrong {
                return Err(format!(
                    "flow program: instruction {pc} jumps outside the code"
                ));
            }
        }
        Ok(())
    }
}
