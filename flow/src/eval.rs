//! The evaluator: runs a program from where the envelope is (its [`Position`]) until the next
//! actor call, the end, a fan-out or an error, within the program's step budget. Pure: the
//! sidecar does the sending.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::FlowError;
use crate::expr::{Scope, Stop, truthy};
use crate::ir::{Expr, FanOutBranches, Instr, Program};

/// Where an envelope is in its flow, carried with it (the envelope's `flow` field).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// The instruction to run when the handler answers.
    pub pc: usize,
    /// Iterations of each loop entered and not left, by loop id (a string: JSON keys).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub loops: BTreeMap<String, u32>,
    /// The `try` regions entered and not left, innermost last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tries: Vec<TryFrame>,
    /// The errors being handled (inside `except` bodies), innermost last: what `raise`
    /// re-raises.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handling: Vec<FlowError>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TryFrame {
    /// The `TryEnter` instruction (its handlers).
    pub at: usize,
    /// `handling`'s depth when the region was entered: an error leaving an `except` body
    /// through an outer handler drops what that body was handling, as Python does.
    pub depth: usize,
}

/// What happened since the last evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A new envelope at the flow's entry.
    Start,
    /// The handler called last answered: the new state.
    Answer(Value),
    /// The handler called last failed (after its retries).
    Failed(FlowError),
    /// Every branch of the fan-out at `pc - 1` answered: their results, in source order.
    Joined(Vec<Value>),
}

/// Where the envelope goes next.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// To this actor, with the state as the payload.
    Call { actor: String },
    /// The flow returned: to x-sink with the state.
    Done,
    /// An error no `except` caught: to x-sump with it.
    Unhandled(FlowError),
    /// A platform limit (budget, loop guard, malformed program): to x-sump with the reason.
    Abort(String),
    /// One envelope per branch, in order; their results join at `target` of the state.
    FanOut {
        target: Vec<Value>,
        branches: Vec<(String, Value)>,
    },
}

/// One decision of an evaluation, for `asya trace`: `"12:if"`/`"12:else"`, `"20:except
/// KeyError"`, `"15:while"`/`"15:exit"` (the condition's line and what it chose).
pub type Step = String;

#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub outcome: Outcome,
    /// The decisions taken, in order.
    pub trail: Vec<Step>,
    /// Budget steps used.
    pub steps: u32,
}

/// Runs `program` from `at` after `event`, changing `state` and `at`.
pub fn resume(program: &Program, at: &mut Position, state: &mut Value, event: Event) -> Evaluation {
    let mut m = Machine {
        program,
        at,
        state,
        steps: program.step_budget,
        trail: Vec::new(),
    };
    let outcome = m.run(event);
    Evaluation {
        outcome,
        steps: program.step_budget - m.steps,
        trail: m.trail,
    }
}

struct Machine<'a> {
    program: &'a Program,
    at: &'a mut Position,
    state: &'a mut Value,
    steps: u32,
    trail: Vec<Step>,
}

/// What one instruction leaves to do.
enum Next {
    Go(usize),
    Stop(Outcome),
}

impl Machine<'_> {
    fn run(&mut self, event: Event) -> Outcome {
        let mut pc = match event {
            Event::Start => {
                *self.at = Position::default();
                0
            }
            Event::Answer(v) => {
                *self.state = v;
                self.at.pc
            }
            Event::Failed(e) => match self.dispatch(e) {
                Next::Go(pc) => pc,
                Next::Stop(o) => return o,
            },
            Event::Joined(results) => {
                let Some(Instr::FanOut { target, line, .. }) = self
                    .at
                    .pc
                    .checked_sub(1)
                    .and_then(|p| self.program.code.get(p))
                else {
                    return Outcome::Abort(format!(
                        "flow position {} does not follow a fan-out",
                        self.at.pc
                    ));
                };
                match self.assign(target, Value::Array(results), *line) {
                    Ok(()) => self.at.pc,
                    Err(Stop::Raise(e)) => match self.dispatch(e) {
                        Next::Go(pc) => pc,
                        Next::Stop(o) => return o,
                    },
                    Err(Stop::Abort(why)) => return Outcome::Abort(why),
                }
            }
        };
        loop {
            if self.steps == 0 {
                return Outcome::Abort(format!(
                    "flow step budget of {} exhausted at instruction {pc}",
                    self.program.step_budget
                ));
            }
            self.steps -= 1;
            let Some(instr) = self.program.code.get(pc) else {
                return Outcome::Done;
            };
            let next = match self.exec(pc, instr) {
                Ok(n) => n,
                Err(Stop::Raise(e)) => self.dispatch(e),
                Err(Stop::Abort(why)) => Next::Stop(Outcome::Abort(why)),
            };
            match next {
                Next::Go(to) => pc = to,
                Next::Stop(o) => return o,
            }
        }
    }

    fn eval(&mut self, e: &Expr, line: u32) -> Result<Value, Stop> {
        Scope {
            state: self.state,
            var: None,
            line,
            steps: &mut self.steps,
        }
        .eval(e)
    }

    fn exec(&mut self, pc: usize, instr: &Instr) -> Result<Next, Stop> {
        let next = Next::Go(pc + 1);
        Ok(match instr {
            Instr::Call { actor, .. } => {
                self.at.pc = pc + 1;
                Next::Stop(Outcome::Call {
                    actor: actor.clone(),
                })
            }
            Instr::Set {
                target,
                value,
                line,
            } => {
                let v = self.eval(value, *line)?;
                self.assign(target, v, *line)?;
                next
            }
            Instr::Del { target, line } => {
                self.delete(target, *line)?;
                next
            }
            Instr::Jump { to } => Next::Go(*to),
            Instr::Branch {
                cond,
                else_to,
                line,
                looping,
            } => {
                let taken = truthy(&self.eval(cond, *line)?);
                self.trail.push(match (looping, taken) {
                    (false, true) => format!("{line}:if"),
                    (false, false) => format!("{line}:else"),
                    (true, true) => format!("{line}:while"),
                    (true, false) => format!("{line}:exit"),
                });
                if taken { next } else { Next::Go(*else_to) }
            }
            Instr::LoopEnter { id } => {
                self.at.loops.insert(id.to_string(), 0);
                next
            }
            Instr::LoopGuard { id, line } => {
                let n = self.at.loops.get(&id.to_string()).copied().unwrap_or(0) + 1;
                if n > self.program.max_iterations {
                    return Err(Stop::Abort(format!(
                        "the loop at line {line} ran {} times, its guard (max iterations {})",
                        self.program.max_iterations, self.program.max_iterations
                    )));
                }
                self.at.loops.insert(id.to_string(), n);
                next
            }
            Instr::TryEnter { .. } => {
                self.at.tries.push(TryFrame {
                    at: pc,
                    depth: self.at.handling.len(),
                });
                next
            }
            Instr::TryExit => {
                self.at.tries.pop();
                next
            }
            Instr::ExceptExit => {
                self.at.handling.pop();
                next
            }
            Instr::Raise { new, line } => {
                let err = match new {
                    Some(n) => FlowError::raised(&n.error_type, n.message.clone(), *line),
                    None => match self.at.handling.last() {
                        Some(e) => e.clone(),
                        None => FlowError::raised(
                            "RuntimeError",
                            "No active exception to reraise",
                            *line,
                        ),
                    },
                };
                return Err(Stop::Raise(err));
            }
            Instr::Return { .. } => Next::Stop(Outcome::Done),
            Instr::FanOut {
                target,
                branches,
                line,
            } => {
                let mut keys = Vec::with_capacity(target.len());
                for k in target {
                    keys.push(self.eval(k, *line)?);
                }
                let branches = self.branches(branches, *line)?;
                self.at.pc = pc + 1;
                Next::Stop(Outcome::FanOut {
                    target: keys,
                    branches,
                })
            }
        })
    }

    fn branches(&mut self, b: &FanOutBranches, line: u32) -> Result<Vec<(String, Value)>, Stop> {
        match b {
            FanOutBranches::Calls(calls) => calls
                .iter()
                .map(|c| Ok((c.actor.clone(), self.eval(&c.input, line)?)))
                .collect(),
            FanOutBranches::Each {
                actor,
                var,
                items,
                input,
            } => {
                let items = match self.eval(items, line)? {
                    Value::Array(a) => a,
                    other => {
                        return Err(Stop::Raise(FlowError::raised(
                            "TypeError",
                            format!("'{}' object is not iterable", crate::expr::py_type(&other)),
                            line,
                        )));
                    }
                };
                let mut out = Vec::with_capacity(items.len());
                for item in &items {
                    let v = Scope {
                        state: self.state,
                        var: Some((var, item)),
                        line,
                        steps: &mut self.steps,
                    }
                    .eval(input)?;
                    out.push((actor.clone(), v));
                }
                Ok(out)
            }
        }
    }

    /// Sends an error to the innermost `try` whose clause matches, as Python unwinds.
    fn dispatch(&mut self, err: FlowError) -> Next {
        while let Some(frame) = self.at.tries.pop() {
            let Some(Instr::TryEnter { handlers, .. }) = self.program.code.get(frame.at) else {
                return Next::Stop(Outcome::Abort(format!(
                    "flow try frame {} is not a try",
                    frame.at
                )));
            };
            let hit = handlers
                .iter()
                .find(|h| h.types.as_ref().is_none_or(|t| err.matches(t)));
            if let Some(h) = hit {
                self.at.handling.truncate(frame.depth);
                self.trail
                    .push(format!("{}:except {}", h.line, err.error_type));
                self.at.handling.push(err);
                return Next::Go(h.to);
            }
        }
        Next::Stop(Outcome::Unhandled(err))
    }

    fn keys(&mut self, target: &[Expr], line: u32) -> Result<Vec<Value>, Stop> {
        target.iter().map(|k| self.eval(k, line)).collect()
    }

    fn assign(&mut self, target: &[Expr], v: Value, line: u32) -> Result<(), Stop> {
        let keys = self.keys(target, line)?;
        let Some((last, parents)) = keys.split_last() else {
            *self.state = v;
            return Ok(());
        };
        let slot = walk(self.state, parents, line)?;
        match (slot, last) {
            (Value::Object(m), Value::String(k)) => {
                m.insert(k.clone(), v);
                Ok(())
            }
            (Value::Array(a), k) => {
                let i = list_index(a.len(), k, line)?;
                a[i] = v;
                Ok(())
            }
            (other, k) => Err(type_error(other, k, line)),
        }
    }

    fn delete(&mut self, target: &[Expr], line: u32) -> Result<(), Stop> {
        let keys = self.keys(target, line)?;
        let Some((last, parents)) = keys.split_last() else {
            return Err(Stop::Abort("del of the whole state".into()));
        };
        let slot = walk(self.state, parents, line)?;
        match (slot, last) {
            (Value::Object(m), Value::String(k)) => match m.remove(k) {
                Some(_) => Ok(()),
                None => Err(Stop::Raise(FlowError::raised(
                    "KeyError",
                    format!("'{k}'"),
                    line,
                ))),
            },
            (Value::Array(a), k) => {
                let i = list_index(a.len(), k, line)?;
                a.remove(i);
                Ok(())
            }
            (other, k) => Err(type_error(other, k, line)),
        }
    }
}

fn type_error(of: &Value, key: &Value, line: u32) -> Stop {
    Stop::Raise(FlowError::raised(
        "TypeError",
        format!(
            "'{}' object does not support item assignment with a {} key",
            crate::expr::py_type(of),
            crate::expr::py_type(key)
        ),
        line,
    ))
}

fn list_index(len: usize, k: &Value, line: u32) -> Result<usize, Stop> {
    let mut steps = 1;
    let scope = Scope {
        state: &Value::Null,
        var: None,
        line,
        steps: &mut steps,
    };
    match scope.position(len, k)? {
        Some(i) => Ok(i),
        None => Err(Stop::Raise(FlowError::raised(
            "IndexError",
            "list assignment index out of range",
            line,
        ))),
    }
}

/// The container `keys` lead to, each step as Python's `a[k]` (a missing one raises).
fn walk<'v>(mut at: &'v mut Value, keys: &[Value], line: u32) -> Result<&'v mut Value, Stop> {
    for k in keys {
        at = match (at, k) {
            (Value::Object(m), Value::String(s)) => match m.get_mut(s) {
                Some(v) => v,
                None => {
                    return Err(Stop::Raise(FlowError::raised(
                        "KeyError",
                        format!("'{s}'"),
                        line,
                    )));
                }
            },
            (Value::Array(a), k) => {
                let i = list_index(a.len(), k, line)?;
                &mut a[i]
            }
            (other, k) => return Err(type_error(other, k, line)),
        };
    }
    Ok(at)
}
