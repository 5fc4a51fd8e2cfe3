//! Routing of envelopes in a flow (docs/DESIGN.md §12). Pure: the evaluator of `asya-flow`
//! runs the program the envelope carries after each handler, and this module turns its
//! outcome into sends: the next actor (the route gains it, so the route is the path taken),
//! x-sink, or x-sump with the error or the reason.

use serde_json::Value;

use asya_flow::{Carried, Event, FlowError, Outcome, Program};
use asya_transport::envelope::Envelope;
use asya_transport::resiliency::Failure;

use crate::routing::{HandlerMode, Queues};

/// Where a flow envelope goes.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowStep {
    /// These sends (queue, envelope).
    Routed(Vec<(String, Envelope)>),
    /// To x-sump: the envelope as it arrived, the reason and the error if a handler's.
    Sump {
        reason: String,
        failure: Option<Failure>,
        metric: &'static str,
    },
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
            return FlowStep::Sump {
                reason: format!(
                    "a handler in flow {} returned {n} results; a flow fans out with its \
                     fan-out constructs, a handler answers one state",
                    c.program.flow
                ),
                failure: None,
                metric: "flow_error",
            };
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
            Err(v) => {
                return FlowStep::Sump {
                    reason: v.to_string(),
                    failure: None,
                    metric: "route_violation",
                };
            }
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
            FlowStep::Sump {
                reason: format!("unhandled {} in flow {flow}{at}", e.error_type),
                failure: Some(failure),
                metric: "flow_unhandled",
            }
        }
        Outcome::Abort(why) => FlowStep::Sump {
            reason: format!("flow {flow}: {why}"),
            failure: failure.cloned(),
            metric: "flow_error",
        },
        Outcome::FanOut { .. } => FlowStep::Sump {
            reason: format!(
                "flow {flow}: this sidecar does not gather fan-outs yet (the fan-in is not \
                 built); nothing was sent to the branches"
            ),
            failure: None,
            metric: "flow_error",
        },
    }
}

#[cfg(test)]
mod tests {
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
}
