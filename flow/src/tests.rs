//! The evaluator on hand-written programs (the compiler's output is tested in cli/).

use serde_json::{Value, json};

use crate::error::FlowError;
use crate::eval::{Event, Outcome, Position, resume};
use crate::ir::*;

fn prog(code: Vec<Instr>) -> Program {
    Program {
        ir: IR_VERSION,
        flow: "f".into(),
        version: "v".into(),
        max_iterations: 3,
        step_budget: 1000,
        code,
    }
}
fn call(a: &str) -> Instr {
    Instr::Call {
        actor: a.into(),
        line: 1,
    }
}
fn key(k: &str) -> Expr {
    Expr::Index(Box::new(Expr::State), Box::new(Expr::Const(json!(k))))
}
fn set(k: &str, v: Expr) -> Instr {
    Instr::Set {
        target: vec![Expr::Const(json!(k))],
        value: v,
        line: 2,
    }
}
fn eq(l: Expr, r: Value) -> Expr {
    Expr::Compare {
        left: Box::new(l),
        ops: vec![(CmpOp::Eq, Expr::Const(r))],
    }
}
fn err(ty: &str, mro: &[&str]) -> FlowError {
    FlowError {
        error_type: ty.into(),
        mro: mro.iter().map(|s| s.to_string()).collect(),
        message: "boom".into(),
        line: 0,
    }
}
fn again(s: &Value) -> Event {
    Event::Answer(s.clone())
}
fn called(o: &Outcome) -> &str {
    match o {
        Outcome::Call { actor } => actor,
        other => panic!("expected a call, got {other:?}"),
    }
}

#[test]
fn a_sequence_stops_at_each_call_and_mutations_run_between() {
    // a; state["n"] = state["n"] + 1; b
    let p = prog(vec![
        call("a"),
        set(
            "n",
            Expr::Bin(
                BinOp::Add,
                Box::new(key("n")),
                Box::new(Expr::Const(json!(1))),
            ),
        ),
        call("b"),
    ]);
    let mut at = Position::default();
    let mut s = json!({"n": 1});
    assert_eq!(
        called(&resume(&p, &mut at, &mut s, Event::Start).outcome),
        "a"
    );
    let ev = resume(&p, &mut at, &mut s, Event::Answer(json!({"n": 10})));
    assert_eq!(called(&ev.outcome), "b");
    assert_eq!(s, json!({"n": 11}));
    let ev = resume(&p, &mut at, &mut s, Event::Answer(json!({"n": 20})));
    assert_eq!(ev.outcome, Outcome::Done);
    assert_eq!(s, json!({"n": 20}));
}

#[test]
fn a_branch_chooses_by_the_state_and_leaves_a_trail() {
    // if state["k"] == "x": a  else: b ; c
    let p = prog(vec![
        Instr::Branch {
            cond: eq(key("k"), json!("x")),
            else_to: 3,
            line: 4,
            looping: false,
        },
        call("a"),
        Instr::Jump { to: 4 },
        call("b"),
        call("c"),
    ]);
    for (k, first, trail) in [("x", "a", "4:if"), ("y", "b", "4:else")] {
        let mut at = Position::default();
        let mut s = json!({ "k": k });
        let ev = resume(&p, &mut at, &mut s, Event::Start);
        assert_eq!(called(&ev.outcome), first);
        assert_eq!(ev.trail, vec![trail.to_string()]);
        let ev = {
            let e = again(&s);
            resume(&p, &mut at, &mut s, e)
        };
        assert_eq!(called(&ev.outcome), "c");
    }
}

/// while state["i"] < 10: guard; state["i"] += 1; a      (max_iterations 3)
fn counting_loop() -> Program {
    prog(vec![
        Instr::LoopEnter { id: 0 },
        Instr::LoopGuard { id: 0, line: 5 },
        Instr::Branch {
            cond: Expr::Compare {
                left: Box::new(key("i")),
                ops: vec![(CmpOp::Lt, Expr::Const(json!(10)))],
            },
            else_to: 6,
            line: 5,
            looping: true,
        },
        set(
            "i",
            Expr::Bin(
                BinOp::Add,
                Box::new(key("i")),
                Box::new(Expr::Const(json!(1))),
            ),
        ),
        call("a"),
        Instr::Jump { to: 1 },
        Instr::Return { line: 9 },
    ])
}

#[test]
fn a_loop_counts_across_hops_and_its_guard_stops_it() {
    let p = counting_loop();
    let mut at = Position::default();
    let mut s = json!({"i": 8});
    assert_eq!(
        called(&resume(&p, &mut at, &mut s, Event::Start).outcome),
        "a"
    );
    assert_eq!(s["i"], 9);
    assert_eq!(
        called(
            &{
                let e = again(&s);
                resume(&p, &mut at, &mut s, e)
            }
            .outcome
        ),
        "a"
    );
    let ev = {
        let e = again(&s);
        resume(&p, &mut at, &mut s, e)
    };
    assert_eq!(ev.outcome, Outcome::Done);
    assert_eq!(ev.trail, vec!["5:exit".to_string()]);
    // From 0 the guard (3) stops it on the fourth iteration, whatever the condition says.
    let mut at = Position::default();
    let mut s = json!({"i": 0});
    let mut o = resume(&p, &mut at, &mut s, Event::Start).outcome;
    for _ in 0..2 {
        assert_eq!(called(&o), "a");
        o = {
            let e = again(&s);
            resume(&p, &mut at, &mut s, e)
        }
        .outcome;
    }
    assert_eq!(called(&o), "a");
    let o = {
        let e = again(&s);
        resume(&p, &mut at, &mut s, e)
    }
    .outcome;
    assert!(
        matches!(&o, Outcome::Abort(m) if m.contains("line 5") && m.contains("3")),
        "{o:?}"
    );
}

/// try: a; b  except KeyError: c  except LookupError, ValueError: d ; e
fn try_program() -> Program {
    prog(vec![
        Instr::TryEnter {
            handlers: vec![
                Handler {
                    types: Some(vec!["KeyError".into()]),
                    to: 4,
                    line: 10,
                },
                Handler {
                    types: Some(vec!["LookupError".into(), "ValueError".into()]),
                    to: 7,
                    line: 12,
                },
            ],
            line: 8,
        },
        call("a"),
        call("b"),
        Instr::TryExit,
        // 4: except KeyError
        call("c"),
        Instr::ExceptExit,
        Instr::Jump { to: 10 },
        // 7: except LookupError, ValueError
        call("d"),
        Instr::ExceptExit,
        Instr::Jump { to: 10 },
        // 10
        call("e"),
    ])
}

#[test]
fn an_error_reaches_the_first_except_that_matches_its_type_or_bases() {
    let p = try_program();
    let cases = [
        (
            err("KeyError", &["KeyError", "LookupError", "Exception"]),
            Some("c"),
        ),
        (
            err("IndexError", &["IndexError", "LookupError", "Exception"]),
            Some("d"),
        ),
        (
            err("Declined", &["Declined", "ValueError", "Exception"]),
            Some("d"),
        ),
        (
            err(
                "ConnectionError",
                &["ConnectionError", "OSError", "Exception"],
            ),
            None,
        ),
    ];
    for (e, to) in cases {
        let mut at = Position::default();
        let mut s = json!({});
        resume(&p, &mut at, &mut s, Event::Start);
        resume(&p, &mut at, &mut s, Event::Answer(json!({"after": "a"})));
        let ev = resume(&p, &mut at, &mut s, Event::Failed(e.clone()));
        match to {
            Some(actor) => {
                assert_eq!(called(&ev.outcome), actor, "{}", e.error_type);
                assert!(at.tries.is_empty());
                // The handler's state is the one before the failed call.
                assert_eq!(s, json!({"after": "a"}));
                let ev = {
                    let e = again(&s);
                    resume(&p, &mut at, &mut s, e)
                };
                assert_eq!(called(&ev.outcome), "e");
                assert!(at.handling.is_empty());
            }
            None => assert_eq!(ev.outcome, Outcome::Unhandled(e)),
        }
    }
    // After the try, an error is no longer caught.
    let mut at = Position::default();
    let mut s = json!({});
    resume(&p, &mut at, &mut s, Event::Start);
    resume(&p, &mut at, &mut s, Event::Answer(json!({})));
    resume(&p, &mut at, &mut s, Event::Answer(json!({})));
    let e = err("KeyError", &["KeyError"]);
    assert_eq!(
        resume(&p, &mut at, &mut s, Event::Failed(e.clone())).outcome,
        Outcome::Unhandled(e)
    );
}

#[test]
fn raise_reraises_to_the_outer_try_or_out_of_the_flow() {
    // try: (try: a  except ValueError: raise)  except Exception: b
    let p = prog(vec![
        Instr::TryEnter {
            handlers: vec![Handler {
                types: Some(vec!["Exception".into()]),
                to: 8,
                line: 20,
            }],
            line: 15,
        },
        Instr::TryEnter {
            handlers: vec![Handler {
                types: Some(vec!["ValueError".into()]),
                to: 4,
                line: 18,
            }],
            line: 16,
        },
        call("a"),
        Instr::TryExit,
        // 4
        Instr::Raise {
            new: None,
            line: 19,
        },
        Instr::ExceptExit,
        Instr::TryExit,
        Instr::Jump { to: 10 },
        // 8
        call("b"),
        Instr::ExceptExit,
    ]);
    let mut at = Position::default();
    let mut s = json!({});
    resume(&p, &mut at, &mut s, Event::Start);
    let e = err("ValueError", &["ValueError", "Exception"]);
    let ev = resume(&p, &mut at, &mut s, Event::Failed(e.clone()));
    assert_eq!(called(&ev.outcome), "b");
    assert_eq!(
        ev.trail,
        vec!["18:except ValueError", "20:except ValueError"]
    );
    // The inner handler's error was dropped when the raise left its body.
    assert_eq!(at.handling, vec![e]);
    // Without the outer try: the original error leaves the flow, unchanged.
    let inner = prog(p.code[1..8].iter().cloned().map(|i| shift(i, 1)).collect());
    let mut at = Position::default();
    resume(&inner, &mut at, &mut s, Event::Start);
    let e = err("ValueError", &["ValueError", "Exception"]);
    assert_eq!(
        resume(&inner, &mut at, &mut s, Event::Failed(e.clone())).outcome,
        Outcome::Unhandled(e)
    );
}

fn shift(i: Instr, by: usize) -> Instr {
    match i {
        Instr::TryEnter { handlers, line } => Instr::TryEnter {
            handlers: handlers
                .into_iter()
                .map(|h| Handler { to: h.to - by, ..h })
                .collect(),
            line,
        },
        Instr::Jump { to } => Instr::Jump { to: to - by },
        other => other,
    }
}

#[test]
fn the_flows_own_errors_are_python_exceptions_an_except_can_catch() {
    // try: state["x"] = state["missing"]  except KeyError: state["caught"] = True
    let p = prog(vec![
        Instr::TryEnter {
            handlers: vec![Handler {
                types: Some(vec!["LookupError".into()]),
                to: 3,
                line: 3,
            }],
            line: 1,
        },
        set("x", key("missing")),
        Instr::TryExit,
        set("caught", Expr::Const(json!(true))),
        Instr::ExceptExit,
    ]);
    let mut at = Position::default();
    let mut s = json!({});
    let ev = resume(&p, &mut at, &mut s, Event::Start);
    assert_eq!(ev.outcome, Outcome::Done);
    assert_eq!(s, json!({"caught": true}));
    // Uncaught, it leaves the flow with its type and line.
    let p = prog(vec![set("x", key("missing"))]);
    let mut s = json!({});
    match resume(&p, &mut Position::default(), &mut s, Event::Start).outcome {
        Outcome::Unhandled(e) => assert_eq!((e.error_type.as_str(), e.line), ("KeyError", 2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn raise_of_a_new_error_carries_its_builtin_bases() {
    let p = prog(vec![
        Instr::TryEnter {
            handlers: vec![Handler {
                types: Some(vec!["ArithmeticError".into()]),
                to: 2,
                line: 3,
            }],
            line: 1,
        },
        Instr::Raise {
            new: Some(NewError {
                error_type: "ZeroDivisionError".into(),
                message: "no".into(),
            }),
            line: 2,
        },
        call("handled"),
    ]);
    let mut s = json!({});
    assert_eq!(
        called(&resume(&p, &mut Position::default(), &mut s, Event::Start).outcome),
        "handled"
    );
}

#[test]
fn a_program_that_never_stops_exhausts_its_budget() {
    let mut p = prog(vec![Instr::Jump { to: 0 }]);
    p.step_budget = 50;
    let ev = resume(&p, &mut Position::default(), &mut json!({}), Event::Start);
    assert!(matches!(&ev.outcome, Outcome::Abort(m) if m.contains("budget")));
    assert_eq!(ev.steps, 50);
}

#[test]
fn fan_out_evaluates_each_branch_input_then_joins_in_order() {
    // state["r"] = [score(x) for x in state["items"]]; done
    let p = prog(vec![
        Instr::FanOut {
            target: vec![Expr::Const(json!("r"))],
            branches: FanOutBranches::Each {
                actor: "score".into(),
                var: "x".into(),
                items: key("items"),
                input: Expr::Dict(vec![(Expr::Const(json!("v")), Expr::Var("x".into()))]),
            },
            line: 3,
        },
        call("merge"),
    ]);
    let mut at = Position::default();
    let mut s = json!({"items": [1, 2]});
    let ev = resume(&p, &mut at, &mut s, Event::Start);
    assert_eq!(
        ev.outcome,
        Outcome::FanOut {
            target: vec![json!("r")],
            branches: vec![
                ("score".into(), json!({"v": 1})),
                ("score".into(), json!({"v": 2}))
            ],
        }
    );
    let ev = resume(
        &p,
        &mut at,
        &mut s,
        Event::Joined(vec![json!(10), json!(20)]),
    );
    assert_eq!(called(&ev.outcome), "merge");
    assert_eq!(s["r"], json!([10, 20]));
}

#[test]
fn the_carried_form_round_trips_and_is_checked() {
    let mut c = crate::Carried::new(counting_loop());
    let mut s = json!({"i": 0});
    c.resume(&mut s, Event::Start);
    let text = serde_json::to_string(&c).unwrap();
    let back: crate::Carried = serde_json::from_str(&text).unwrap();
    assert_eq!(back, c);
    assert!(back.program.check().is_ok());
    let mut bad = counting_loop();
    bad.code.push(Instr::Jump { to: 99 });
    assert!(bad.check().unwrap_err().contains("outside"));
    bad.ir = 2;
    assert!(bad.check().unwrap_err().contains("ir 2"));
}
