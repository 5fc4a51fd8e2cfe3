//! Routing of envelopes in a flow (docs/DESIGN.md §12). Pure: the evaluator of `asya-flow`
//! runs the program the envelope carries after each handler, and this module turns its
//! outcome into sends: the next actor (the route gains it, so the route is the path taken),
//! x-sink, or x-sump with the error or the reason.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use asya_flow::{Carried, Event, FlowError, Outcome, Program};
use asya_transport::envelope::Envelope;
use asya_transport::fanin::{BranchReport, JoinAnswer};
use asya_transport::resiliency::Failure;

use crate::routing::{HandlerMode, Queues};

/// Where a flow envelope goes.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowStep {
    /// These sends (queue, envelope); none when a branch's result joined and the join waits
    /// for others.
    Routed(Vec<(String, Envelope)>),
    /// A fan-out: one envelope per branch (queue, envelope), sent only where a gateway
    /// gathers them.
    Branches(Vec<(String, Envelope)>),
    /// To x-sump: the envelope as it arrived (or `instead`, the flow's own envelope when a
    /// join failed), the reason and the error if a handler's.
    Sump {
        reason: String,
        failure: Option<Failure>,
        metric: &'static str,
        instead: Option<Box<Envelope>>,
    },
}

/// The envelope field of a fan-out branch: which join its result goes to, and what the flow
/// resumes with once every branch answered.
pub const FANIN_FIELD: &str = "fanin";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FanIn {
    /// The join's id: the fanning envelope's id (`{id}~{k}` for its k-th later fan-out).
    pub join: String,
    pub index: u32,
    pub total: u32,
    /// The fanning envelope: the flow continues as it, with the results set.
    pub parent: Parent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parent {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// The flow's state at the fan-out.
    pub state: Value,
}

/// The fan-in an envelope is a branch of: `None` when it is none, `Err` when the field is
/// there but malformed.
pub fn branch_of(env: &Envelope) -> Option<Result<FanIn, String>> {
    let v = env.extra.get(FANIN_FIELD)?;
    Some(
        serde_json::from_value::<FanIn>(v.clone())
            .map_err(|e| format!("the envelope's fanin is not a fan-out branch: {e}")),
    )
}

/// What the entry does with a new envelope.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// Its first call is this actor: run the handler on this envelope (flow attached,
    /// mutations before the first call applied).
    Handle(Box<Envelope>),
    /// It goes elsewhere first (a branch before the first call), or ends without a call.
    Step(FlowStep),
}

/// The flow an envelope carries: `None` when it is in none, `Err` when the field is there
/// but not a program this sidecar can run.
pub fn carried(env: &Envelope) -> Option<Result<Carried, String>> {
    let v = env.extra.get(asya_flow::ENVELOPE_FIELD)?;
    let c = serde_json::from_value::<Carried>(v.clone())
        .map_err(|e| format!("the envelope's flow is not a flow program: {e}"));
    Some(c.and_then(|c| c.program.check().map(|()| c)))
}

/// Starts `program` for an envelope arriving at its entry actor `actor`.
pub fn start(env: &Envelope, program: &Program, actor: &str, queues: &Queues) -> Start {
    let mut c = Carried::new(program.clone());
    let mut state = env.payload.clone();
    let ev = c.resume(&mut state, Event::Start);
    if let Outcome::Call { actor: first } = &ev.outcome
        && first == actor
    {
        let mut e = env.clone();
        e.payload = state;
        e.route.actors.truncate(e.route.current + 1);
        attach(&mut e, &c);
        return Start::Handle(Box::new(e));
    }
    Start::Step(apply(env, c, state, ev.outcome, None, queues))
}

/// After the handler answered `results`.
pub fn after_results(
    env: &Envelope,
    mut c: Carried,
    results: Vec<Value>,
    mode: HandlerMode,
    queues: &Queues,
) -> FlowStep {
    let mut results = results;
    let item = match results.len() {
        // Nothing to pass on: the flow ends here, visibly, in x-sink (as a route does).
        0 => {
            let mut done = env.clone();
            done.payload = Value::Null;
            return to_sink(done, queues);
        }
        1 => results.remove(0),
        n => {
            return sump(
                format!(
                    "a handler in flow {} returned {n} results; a flow fans out with its \
                     fan-out constructs, a handler answers one state",
                    c.program.flow
                ),
                None,
                "flow_error",
            );
        }
    };
    let mut base = env.clone();
    let state = match mode {
        HandlerMode::Payload => item,
        HandlerMode::Envelope => match crate::routing::from_handler_envelope(env, item, 0) {
            Ok(e) => {
                base.headers = e.headers;
                e.payload
            }
            Err(v) => return sump(v.to_string(), None, "route_violation"),
        },
    };
    let mut now = Value::Null;
    let ev = c.resume(&mut now, Event::Answer(state));
    let state = now;
    apply(&base, c, state, ev.outcome, None, queues)
}

/// After the handler failed for good (its retries over): the flow's `except` may catch it.
pub fn after_failure(env: &Envelope, mut c: Carried, f: &Failure, queues: &Queues) -> FlowStep {
    let err = FlowError {
        error_type: f.error_type.clone(),
        mro: f.mro.clone(),
        message: f.message.clone(),
        line: 0,
    };
    let mut state = env.payload.clone();
    let ev = c.resume(&mut state, Event::Failed(err));
    apply(env, c, state, ev.outcome, Some(f), queues)
}

fn attach(e: &mut Envelope, c: &Carried) {
    // A Carried is plain data: serialising it cannot fail.
    let v = serde_json::to_value(c).unwrap_or(Value::Null);
    e.extra.insert(asya_flow::ENVELOPE_FIELD.into(), v);
}

fn sump(reason: String, failure: Option<Failure>, metric: &'static str) -> FlowStep {
    FlowStep::Sump {
        reason,
        failure,
        metric,
        instead: None,
    }
}

/// A branch's report after its handler answered `results`: its one result (`null` for none);
/// several are a `TypeError` of the branch, which fails the join as a raise would.
pub fn branch_answer(
    env: &Envelope,
    fanin: &FanIn,
    results: Vec<Value>,
    mode: HandlerMode,
    namespace: &str,
) -> BranchReport {
    let mut results = results;
    let report = |result, error| BranchReport {
        total: fanin.total,
        namespace: namespace.to_string(),
        result,
        error,
    };
    let item = match results.len() {
        0 => Value::Null,
        1 => results.remove(0),
        n => {
            let message = format!(
                "fan-out branch {} of {} returned {n} results; a branch answers one",
                fanin.index, fanin.join
            );
            return report(
                None,
                Some(error_value("TypeError", &["TypeError"], &message)),
            );
        }
    };
    match mode {
        HandlerMode::Payload => report(Some(item), None),
        HandlerMode::Envelope => match crate::routing::from_handler_envelope(env, item, 0) {
            Ok(e) => report(Some(e.payload), None),
            Err(v) => {
                let message = v.to_string();
                report(
                    None,
                    Some(error_value("ValueError", &["ValueError"], &message)),
                )
            }
        },
    }
}

/// A branch's report after its handler failed for good (its retries over).
pub fn branch_failure(fanin: &FanIn, f: &Failure, namespace: &str) -> BranchReport {
    let mut e = json!({"type": f.error_type, "mro": f.mro, "message": f.message, "code": f.code});
    if let (Some(t), Some(o)) = (&f.traceback, e.as_object_mut()) {
        o.insert("traceback".into(), Value::String(t.clone()));
    }
    BranchReport {
        total: fanin.total,
        namespace: namespace.to_string(),
        result: None,
        error: Some(e),
    }
}

fn error_value(error_type: &str, mro: &[&str], message: &str) -> Value {
    let mut mro: Vec<&str> = mro.to_vec();
    mro.extend(["Exception", "BaseException"]);
    json!({"type": error_type, "mro": mro, "message": message, "code": "flow_error"})
}

/// A branch's error as the handler failure the flow dispatches.
fn failure_of(error: &Value) -> Failure {
    let text = |k: &str| error.get(k).and_then(Value::as_str).map(str::to_string);
    Failure {
        code: text("code").unwrap_or_else(|| "flow_error".into()),
        error_type: text("type").unwrap_or_else(|| "Exception".into()),
        message: text("message").unwrap_or_default(),
        traceback: text("traceback"),
        mro: error
            .get("mro")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// What the branch `env` does with the gateway's answer: nothing while the join waits or
/// after another branch fired it; the flow's next step, as the fanning envelope (its id, its
/// route up to the fan-out), when this branch completed or failed the join.
pub fn after_join(
    env: &Envelope,
    mut c: Carried,
    fanin: &FanIn,
    answer: JoinAnswer,
    queues: &Queues,
) -> FlowStep {
    let mut parent = env.clone();
    parent.id = fanin.parent.id.clone();
    parent.parent_id = fanin.parent.parent_id.clone();
    parent.extra.remove(FANIN_FIELD);
    parent.route.actors.truncate(env.route.current);
    parent.route.current = env.route.current.saturating_sub(1);
    parent.payload = fanin.parent.state.clone();
    let mut state = fanin.parent.state.clone();
    let (ev, failure) = match answer {
        JoinAnswer::Waiting { .. } | JoinAnswer::Joined => return FlowStep::Routed(Vec::new()),
        JoinAnswer::Complete { results } => (c.resume(&mut state, Event::Joined(results)), None),
        JoinAnswer::Failed { error, .. } => {
            let f = failure_of(&error);
            let err = FlowError {
                error_type: f.error_type.clone(),
                mro: f.mro.clone(),
                message: f.message.clone(),
                line: 0,
            };
            (c.resume(&mut state, Event::Failed(err)), Some(f))
        }
    };
    attach(&mut parent, &c);
    match apply(&parent, c, state, ev.outcome, failure.as_ref(), queues) {
        FlowStep::Sump {
            reason,
            failure,
            metric,
            ..
        } => FlowStep::Sump {
            reason,
            failure,
            metric,
            instead: Some(Box::new(parent)),
        },
        step => step,
    }
}

fn to_sink(mut e: Envelope, queues: &Queues) -> FlowStep {
    e.route.actors.truncate(e.route.current + 1);
    e.route.current = e.route.actors.len();
    FlowStep::Routed(vec![(queues.sink(), e)])
}

/// The outcome of an evaluation as sends. `env` is the envelope as it arrived (what x-sump
/// keeps, ready to replay), `failure` the handler's error being routed.
fn apply(
    env: &Envelope,
    c: Carried,
    state: Value,
    outcome: Outcome,
    failure: Option<&Failure>,
    queues: &Queues,
) -> FlowStep {
    let flow = c.program.flow.clone();
    let mut next = env.clone();
    next.payload = state;
    match outcome {
        Outcome::Call { actor } => {
            next.route.actors.truncate(next.route.current + 1);
            next.route.actors.push(actor.clone());
            next.route.current += 1;
            attach(&mut next, &c);
            FlowStep::Routed(vec![(queues.actor(&actor), next)])
        }
        Outcome::Done => {
            attach(&mut next, &c);
            to_sink(next, queues)
        }
        Outcome::Unhandled(e) => {
            // The handler's own error keeps its code and traceback; one the flow raised gets
            // the flow's line.
            let same = failure.filter(|f| f.error_type == e.error_type && e.line == 0);
            let failure = match same {
                Some(f) => f.clone(),
                None => Failure {
                    code: "flow_error".into(),
                    error_type: e.error_type.clone(),
                    message: e.message.clone(),
                    traceback: None,
                    mro: e.mro.clone(),
                },
            };
            let at = if e.line > 0 {
                format!(" (line {})", e.line)
            } else {
                String::new()
            };
            sump(
                format!("unhandled {} in flow {flow}{at}", e.error_type),
                Some(failure),
                "flow_unhandled",
            )
        }
        Outcome::Abort(why) => sump(
            format!("flow {flow}: {why}"),
            failure.cloned(),
            "flow_error",
        ),
        Outcome::FanOut { branches, .. } => {
            fan_out(env, c, next.payload, branches, failure, queues)
        }
    }
}

/// One envelope per branch: id `{join}-{i}`, the fanning envelope as parent, the route up to
/// here plus the branch's actor, the branch's input as payload, the program at the fan-out's
/// next instruction, and the `fanin` field (join, index, total, the state to resume with).
/// No branch (a comprehension over nothing) joins at once with no results.
fn fan_out(
    env: &Envelope,
    mut c: Carried,
    state: Value,
    branches: Vec<(String, Value)>,
    failure: Option<&Failure>,
    queues: &Queues,
) -> FlowStep {
    if branches.is_empty() {
        let mut state = state;
        let ev = c.resume(&mut state, Event::Joined(Vec::new()));
        return apply(env, c, state, ev.outcome, failure, queues);
    }
    let total = branches.len();
    if total > asya_transport::fanin::MAX_BRANCHES as usize {
        return sump(
            format!(
                "flow {}: a fan-out of {total} branches; at most {} are gathered",
                c.program.flow,
                asya_transport::fanin::MAX_BRANCHES
            ),
            None,
            "flow_error",
        );
    }
    let join = match c.fan_outs {
        0 => env.id.clone(),
        k => format!("{}~{k}", env.id),
    };
    c.fan_outs += 1;
    let parent = Parent {
        id: env.id.clone(),
        parent_id: env.parent_id.clone(),
        state,
    };
    let sends = branches
        .into_iter()
        .enumerate()
        .map(|(i, (actor, input))| {
            let mut b = env.clone();
            b.id = format!("{join}-{i}");
            b.parent_id = Some(env.id.clone());
            b.payload = input;
            b.route.actors.truncate(b.route.current + 1);
            b.route.actors.push(actor.clone());
            b.route.current += 1;
            attach(&mut b, &c);
            let fanin = FanIn {
                join: join.clone(),
                index: i as u32,
                total: total as u32,
                parent: parent.clone(),
            };
            // Plain data: serialising it cannot fail.
            let v = serde_json::to_value(&fanin).unwrap_or(Value::Null);
            b.extra.insert(FANIN_FIELD.into(), v);
            (queues.actor(&actor), b)
        })
        .collect();
    FlowStep::Branches(sends)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use asya_flow::ir::{CmpOp, Expr, Handler, IR_VERSION, Instr};
    use serde_json::json;

    fn q() -> Queues {
        Queues {
            namespace: "ns".into(),
        }
    }

    /// state["n"] = 1; try: a  except ValueError: (if state["n"] == 1: b) ; c
    fn program() -> Program {
        Program {
            ir: IR_VERSION,
            flow: "f".into(),
            version: "v1".into(),
            max_iterations: 10,
            step_budget: 100,
            code: vec![
                Instr::Set {
                    target: vec![Expr::Const(json!("n"))],
                    value: Expr::Const(json!(1)),
                    line: 1,
                },
                Instr::TryEnter {
                    handlers: vec![Handler {
                        types: Some(vec!["ValueError".into()]),
                        to: 5,
                        line: 4,
                    }],
                    line: 2,
                },
                Instr::Call {
                    actor: "a".into(),
                    line: 3,
                },
                Instr::TryExit,
                Instr::Jump { to: 9 },
                Instr::Branch {
                    cond: Expr::Compare {
                        left: Box::new(Expr::Index(
                            Box::new(Expr::State),
                            Box::new(Expr::Const(json!("n"))),
                        )),
                        ops: vec![(CmpOp::Eq, Expr::Const(json!(1)))],
                    },
                    else_to: 7,
                    line: 5,
                    looping: false,
                },
                Instr::Call {
                    actor: "b".into(),
                    line: 6,
                },
                Instr::ExceptExit,
                Instr::Jump { to: 9 },
                Instr::Call {
                    actor: "c".into(),
                    line: 7,
                },
            ],
        }
    }

    fn env(actors: &[&str], payload: Value) -> Envelope {
        serde_json::from_value(json!({
            "id": "e1", "route": {"actors": actors, "current": 0}, "payload": payload
        }))
        .unwrap()
    }

    fn failure(ty: &str, mro: &[&str]) -> Failure {
        Failure {
            code: "handler_error".into(),
            error_type: ty.into(),
            message: "m".into(),
            traceback: Some("tb".into()),
            mro: mro.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn routed(s: FlowStep) -> Vec<(String, Envelope)> {
        match s {
            FlowStep::Routed(v) => v,
            other => panic!("not routed: {other:?}"),
        }
    }

    #[test]
    fn the_entry_runs_the_mutations_before_its_own_handler() {
        let Start::Handle(e) = start(&env(&["a", "x"], json!({})), &program(), "a", &q()) else {
            panic!("the entry's own handler should run")
        };
        assert_eq!(e.payload, json!({"n": 1}));
        // The route is the flow's from here: whatever followed the entry is dropped.
        assert_eq!(e.route.actors, ["a"]);
        let c = carried(&e).unwrap().unwrap();
        assert_eq!((c.at.pc, c.at.tries.len()), (3, 1));
    }

    #[test]
    fn an_entry_that_is_not_the_first_call_passes_the_envelope_on() {
        let Start::Step(step) = start(&env(&["z"], json!({})), &program(), "z", &q()) else {
            panic!("z is not the first call")
        };
        let out = routed(step);
        assert_eq!(out[0].0, "asya-ns-a");
        assert_eq!(out[0].1.route.actors, ["z", "a"]);
        assert_eq!(out[0].1.route.current, 1);
    }

    #[test]
    fn after_a_handler_the_next_actor_is_appended_to_the_route() {
        let Start::Handle(e) = start(&env(&["a"], json!({})), &program(), "a", &q()) else {
            panic!()
        };
        let c = carried(&e).unwrap().unwrap();
        let out = routed(after_results(
            &e,
            c,
            vec![json!({"n": 2})],
            HandlerMode::Payload,
            &q(),
        ));
        let (queue, next) = &out[0];
        assert_eq!(queue, "asya-ns-c");
        assert_eq!(next.route.actors, ["a", "c"]);
        assert_eq!(next.route.current, 1);
        assert_eq!(next.payload, json!({"n": 2}));
        // c is the last call: its answer ends the flow in x-sink, the route past its end.
        let c = carried(next).unwrap().unwrap();
        let out = routed(after_results(
            next,
            c,
            vec![json!("fin")],
            HandlerMode::Payload,
            &q(),
        ));
        assert_eq!(out[0].0, "asya-ns-x-sink");
        assert_eq!(out[0].1.payload, json!("fin"));
        assert_eq!(out[0].1.route.current, 2);
    }

    #[test]
    fn a_failure_takes_the_matching_except_path_or_goes_to_x_sump_as_it_was() {
        let Start::Handle(e) = start(&env(&["a"], json!({})), &program(), "a", &q()) else {
            panic!()
        };
        let c = carried(&e).unwrap().unwrap();
        let caught = failure("Declined", &["Declined", "ValueError", "Exception"]);
        let out = routed(after_failure(&e, c.clone(), &caught, &q()));
        assert_eq!(out[0].0, "asya-ns-b");
        let trail = carried(&out[0].1).unwrap().unwrap().trail;
        assert_eq!(trail, ["4:except Declined", "5:if"]);
        let other = failure("KeyError", &["KeyError", "LookupError", "Exception"]);
        match after_failure(&e, c, &other, &q()) {
            FlowStep::Sump {
                reason, failure, ..
            } => {
                assert_eq!(reason, "unhandled KeyError in flow f");
                // The handler's own error, traceback and all.
                assert_eq!(failure, Some(other));
            }
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn a_broken_flow_field_is_reported_not_run() {
        let mut e = env(&["a"], json!({}));
        e.extra.insert("flow".into(), json!({"program": 3}));
        assert!(carried(&e).unwrap().is_err());
        e.extra.remove("flow");
        assert!(carried(&e).is_none());
    }

    #[test]
    fn several_results_in_a_flow_are_refused() {
        let Start::Handle(e) = start(&env(&["a"], json!({})), &program(), "a", &q()) else {
            panic!()
        };
        let c = carried(&e).unwrap().unwrap();
        let s = after_results(&e, c, vec![json!(1), json!(2)], HandlerMode::Payload, &q());
        assert!(
            matches!(s, FlowStep::Sump { reason, .. } if reason.contains("returned 2 results"))
        );
    }

    /// a; try: state["r"] = [double(x) for x in state["items"]] except ValueError:
    /// state["failed"] = True; then a second fan-out over the same items; return.
    pub(crate) fn fan_program() -> Program {
        let items = Expr::Index(Box::new(Expr::State), Box::new(Expr::Const(json!("items"))));
        let each = || asya_flow::ir::FanOutBranches::Each {
            actor: "double".into(),
            var: "x".into(),
            items: items.clone(),
            input: Expr::Var("x".into()),
        };
        Program {
            ir: IR_VERSION,
            flow: "fan".into(),
            version: "v1".into(),
            max_iterations: 10,
            step_budget: 100,
            code: vec![
                Instr::Call {
                    actor: "a".into(),
                    line: 1,
                },
                Instr::TryEnter {
                    handlers: vec![Handler {
                        types: Some(vec!["ValueError".into()]),
                        to: 5,
                        line: 4,
                    }],
                    line: 2,
                },
                Instr::FanOut {
                    target: vec![Expr::Const(json!("r"))],
                    branches: each(),
                    line: 3,
                },
                Instr::TryExit,
                Instr::Jump { to: 8 },
                Instr::Set {
                    target: vec![Expr::Const(json!("failed"))],
                    value: Expr::Const(json!(true)),
                    line: 5,
                },
                Instr::ExceptExit,
                Instr::Return { line: 6 },
                Instr::FanOut {
                    target: vec![Expr::Const(json!("again"))],
                    branches: each(),
                    line: 7,
                },
                Instr::Return { line: 8 },
            ],
        }
    }

    /// The branches of `fan_program` after `a` answered `state`.
    fn fanned(state: Value) -> (Envelope, Vec<(String, Envelope)>) {
        let Start::Handle(e) = start(&env(&["a"], json!({})), &fan_program(), "a", &q()) else {
            panic!()
        };
        let c = carried(&e).unwrap().unwrap();
        match after_results(&e, c, vec![state], HandlerMode::Payload, &q()) {
            FlowStep::Branches(b) => (*e, b),
            other => panic!("not a fan-out: {other:?}"),
        }
    }

    fn fanin_of(e: &Envelope) -> FanIn {
        branch_of(e).unwrap().unwrap()
    }

    #[test]
    fn a_fan_out_sends_one_envelope_per_branch_with_its_join() {
        let (_, b) = fanned(json!({"items": [3, 1, 2], "k": "v"}));
        assert_eq!(b.len(), 3);
        for (i, (queue, e)) in b.iter().enumerate() {
            assert_eq!(queue, "asya-ns-double");
            assert_eq!(e.id, format!("e1-{i}"));
            assert_eq!(e.parent_id.as_deref(), Some("e1"));
            assert_eq!(
                (e.route.actors.clone(), e.route.current),
                (vec!["a".to_string(), "double".into()], 1)
            );
            let f = fanin_of(e);
            assert_eq!((f.join.as_str(), f.index, f.total), ("e1", i as u32, 3));
            assert_eq!(f.parent.state, json!({"items": [3, 1, 2], "k": "v"}));
            // The program goes with it, at the instruction after the fan-out.
            assert_eq!(carried(e).unwrap().unwrap().at.pc, 3);
        }
        let inputs: Vec<_> = b.iter().map(|(_, e)| e.payload.clone()).collect();
        assert_eq!(inputs, [json!(3), json!(1), json!(2)]);
    }

    #[test]
    fn a_branch_reports_one_result_or_its_error() {
        let (_, b) = fanned(json!({"items": [1]}));
        let (e, f) = (&b[0].1, fanin_of(&b[0].1));
        let r = branch_answer(e, &f, vec![json!(2)], HandlerMode::Payload, "ns");
        assert_eq!((r.total, r.result, r.error), (1, Some(json!(2)), None));
        let none = branch_answer(e, &f, vec![], HandlerMode::Payload, "ns");
        assert_eq!(none.result, Some(Value::Null));
        let two = branch_answer(e, &f, vec![json!(1), json!(2)], HandlerMode::Payload, "ns");
        assert_eq!(two.error.unwrap()["type"], "TypeError");
        let err = branch_failure(
            &f,
            &failure("Neg", &["Neg", "ValueError", "Exception"]),
            "ns",
        );
        assert_eq!(
            err.error,
            Some(
                json!({"type": "Neg", "mro": ["Neg", "ValueError", "Exception"],
                        "message": "m", "code": "handler_error", "traceback": "tb"})
            )
        );
    }

    #[test]
    fn the_completing_branch_sends_the_flow_on_as_the_fanning_envelope() {
        let (_, b) = fanned(json!({"items": [3, 1]}));
        let e = &b[1].1;
        let c = carried(e).unwrap().unwrap();
        let f = fanin_of(e);
        let wait = after_join(
            e,
            c.clone(),
            &f,
            JoinAnswer::Waiting {
                stored: 1,
                total: 2,
            },
            &q(),
        );
        assert_eq!(routed(wait), []);
        assert_eq!(
            routed(after_join(e, c.clone(), &f, JoinAnswer::Joined, &q())),
            []
        );
        let done = JoinAnswer::Complete {
            results: vec![json!(6), json!(2)],
        };
        // The flow goes on to the second fan-out: its join is told apart from the first.
        let FlowStep::Branches(again) = after_join(e, c, &f, done, &q()) else {
            panic!("the second fan-out")
        };
        let (_, next) = &again[0];
        assert_eq!(next.id, "e1~1-0");
        assert_eq!(next.parent_id.as_deref(), Some("e1"));
        let f2 = fanin_of(next);
        assert_eq!(f2.join, "e1~1");
        assert_eq!(f2.parent.state, json!({"items": [3, 1], "r": [6, 2]}));
        assert_eq!(next.route.actors, ["a", "double"]);
        // Its join completes: the flow returns, to x-sink, as e1 with both results.
        let c2 = carried(next).unwrap().unwrap();
        let done = JoinAnswer::Complete {
            results: vec![json!("x"), json!("y")],
        };
        let out = routed(after_join(next, c2, &f2, done, &q()));
        let (queue, fin) = &out[0];
        assert_eq!(queue, "asya-ns-x-sink");
        assert_eq!((fin.id.as_str(), fin.parent_id.as_deref()), ("e1", None));
        assert_eq!(
            fin.payload,
            json!({"items": [3, 1], "r": [6, 2], "again": ["x", "y"]})
        );
        assert!(branch_of(fin).is_none());
    }

    #[test]
    fn a_failed_join_takes_the_except_path_or_goes_to_x_sump_as_the_fanning_envelope() {
        let (_, b) = fanned(json!({"items": [3, -1]}));
        let e = &b[1].1;
        let c = carried(e).unwrap().unwrap();
        let f = fanin_of(e);
        let caught = JoinAnswer::Failed {
            index: 1,
            error: json!({"type": "Neg", "mro": ["Neg", "ValueError", "Exception"], "message": "m"}),
        };
        let out = routed(after_join(e, c.clone(), &f, caught, &q()));
        assert_eq!(out[0].0, "asya-ns-x-sink");
        assert_eq!(out[0].1.id, "e1");
        assert_eq!(out[0].1.payload, json!({"items": [3, -1], "failed": true}));
        let other = JoinAnswer::Failed {
            index: 1,
            error: json!({"type": "KeyError", "mro": ["KeyError", "LookupError", "Exception"],
                          "message": "'k'", "traceback": "tb", "code": "handler_error"}),
        };
        match after_join(e, c, &f, other, &q()) {
            FlowStep::Sump {
                reason,
                failure,
                instead,
                ..
            } => {
                assert_eq!(reason, "unhandled KeyError in flow fan");
                let failure = failure.unwrap();
                assert_eq!(
                    (failure.traceback.as_deref(), failure.code.as_str()),
                    (Some("tb"), "handler_error")
                );
                let instead = instead.unwrap();
                assert_eq!(
                    (instead.id.as_str(), instead.route.actors.clone()),
                    ("e1", vec!["a".to_string()])
                );
            }
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn a_fan_out_over_nothing_joins_at_once() {
        let Start::Handle(e) = start(&env(&["a"], json!({})), &fan_program(), "a", &q()) else {
            panic!()
        };
        let c = carried(&e).unwrap().unwrap();
        let out = routed(after_results(
            &e,
            c,
            vec![json!({"items": []})],
            HandlerMode::Payload,
            &q(),
        ));
        assert_eq!(out[0].0, "asya-ns-x-sink");
        assert_eq!(out[0].1.payload, json!({"items": [], "r": [], "again": []}));
    }
}
