//! The compiler, construct by construct: what it accepts is run with the evaluator the
//! sidecar uses (so the test checks the meaning, not the instruction list); what it refuses
//! names the line, the construct and the alternative.

use serde_json::{Value, json};

use asya_flow::{Event, Outcome, Position, Program, resume};

use super::compile::{Options, compile};

fn ok(src: &str) -> Program {
    match compile(src, "t.py", &Options::default()) {
        Ok(c) => c.program,
        Err(r) => panic!(
            "refused: {}",
            r.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

/// The refusals' text, one per line.
fn refused(src: &str) -> String {
    match compile(src, "t.py", &Options::default()) {
        Ok(_) => panic!("compiled but should be refused:\n{src}"),
        Err(r) => r
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// Runs a program as the sidecars would: each actor in `actors` answers with `f(state)`
/// (or an error); returns the actors called, in order, and how it ended.
fn run(
    p: &Program,
    mut state: Value,
    answer: impl Fn(&str, &Value, usize) -> Result<Value, asya_flow::FlowError>,
) -> (Vec<String>, Outcome, Value) {
    let mut at = Position::default();
    let mut calls = Vec::new();
    let mut ev = resume(p, &mut at, &mut state, Event::Start);
    for _ in 0..50 {
        match ev.outcome {
            Outcome::Call { ref actor } => {
                calls.push(actor.clone());
                let n = calls.iter().filter(|a| *a == actor).count();
                let e = match answer(actor, &state, n) {
                    Ok(v) => Event::Answer(v),
                    Err(e) => Event::Failed(e),
                };
                ev = resume(p, &mut at, &mut state, e);
            }
            Outcome::FanOut { ref branches, .. } => {
                let results: Vec<Value> = branches
                    .iter()
                    .map(|(a, input)| {
                        calls.push(a.clone());
                        json!({ "from": a, "in": input })
                    })
                    .collect();
                ev = resume(p, &mut at, &mut state, Event::Joined(results));
            }
            o => return (calls, o, state),
        }
    }
    panic!("did not end")
}

fn echo(_: &str, s: &Value, _: usize) -> Result<Value, asya_flow::FlowError> {
    Ok(s.clone())
}

fn exc(ty: &str, mro: &[&str]) -> asya_flow::FlowError {
    asya_flow::FlowError {
        error_type: ty.into(),
        mro: mro.iter().map(|s| s.to_string()).collect(),
        message: format!("{ty}!"),
        line: 0,
    }
}

const ORDER_REVIEW: &str = include_str!("../../../deploy/examples/flows/order_review.py");

/// The handlers of deploy/examples/handlers/orders.py, as the evaluator sees them.
fn orders(actor: &str, s: &Value, _: usize) -> Result<Value, asya_flow::FlowError> {
    let mut s = s.clone();
    match actor {
        "validate" => {
            let Some(items) = s.get("items").and_then(Value::as_array) else {
                return Err(exc("KeyError", &["KeyError", "LookupError", "Exception"]));
            };
            let total: i64 = items.iter().filter_map(|i| i["price"].as_i64()).sum();
            s["total"] = json!(total);
        }
        "charge" => {
            let card = s.get("card").and_then(Value::as_str).unwrap_or("ok");
            if card == "declined" || (card == "declined-once" && s["attempt"] == 1) {
                return Err(exc(
                    "PaymentDeclined",
                    &["PaymentDeclined", "PaymentError", "ValueError", "Exception"],
                ));
            }
            s["charged"] = s["total"].clone();
        }
        "express-ship" => s["shipping"] = json!("express"),
        "standard-ship" => s["shipping"] = json!("standard"),
        "notify" => s["notified"] = json!(true),
        other => panic!("unexpected actor {other}"),
    }
    Ok(s)
}

#[test]
fn the_worked_example_compiles_and_each_path_ends_as_python_would() {
    let c = compile(
        ORDER_REVIEW,
        "order_review.py",
        &Options {
            module: "orders".into(),
            ..Options::default()
        },
    )
    .unwrap();
    let names: Vec<_> = c
        .actors
        .iter()
        .map(|a| (a.actor.as_str(), a.handler.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("validate", "orders.validate"),
            ("charge", "orders.charge"),
            ("express-ship", "orders.express_ship"),
            ("standard-ship", "orders.standard_ship"),
            ("notify", "orders.notify"),
        ]
    );
    let p = c.program;
    assert_eq!(p.flow, "review_order");
    assert_eq!(p.entry(), Some(("validate".into(), true)));
    let item = |price: i64| json!({ "price": price });

    // Big order: express, charged at once.
    let (calls, end, s) = run(&p, json!({"items": [item(60), item(50)]}), orders);
    assert_eq!(calls, ["validate", "charge", "express-ship", "notify"]);
    assert_eq!(end, Outcome::Done);
    assert_eq!(
        (
            s["status"].clone(),
            s["shipping"].clone(),
            s["attempt"].clone()
        ),
        (json!("done"), json!("express"), json!(1))
    );

    // Declined once: the except path loops once more; US: standard shipping.
    let (calls, end, s) = run(
        &p,
        json!({"items": [item(5)], "card": "declined-once", "country": "US"}),
        orders,
    );
    assert_eq!(
        calls,
        ["validate", "charge", "charge", "standard-ship", "notify"]
    );
    assert_eq!(
        (end, s["attempt"].clone(), s["shipping"].clone()),
        (Outcome::Done, json!(2), json!("standard"))
    );

    // Elsewhere: the mutation branch (no actor).
    let (calls, _, s) = run(&p, json!({"items": [item(5)], "country": "DE"}), orders);
    assert_eq!(calls, ["validate", "charge", "notify"]);
    assert_eq!(s["shipping"], "pickup");

    // Always declined: three attempts, then `raise` re-raises the handler's own error.
    let (calls, end, _) = run(&p, json!({"items": [item(5)], "card": "declined"}), orders);
    assert_eq!(calls, ["validate", "charge", "charge", "charge"]);
    match end {
        Outcome::Unhandled(e) => assert_eq!(e.error_type, "PaymentDeclined"),
        other => panic!("{other:?}"),
    }

    // No items: validate's KeyError takes the early return.
    let (calls, end, s) = run(&p, json!({}), orders);
    assert_eq!((calls, end), (vec!["validate".to_string()], Outcome::Done));
    assert_eq!(s["status"], "rejected");
}

#[test]
fn the_same_source_gives_the_same_version() {
    let a = ok(ORDER_REVIEW);
    assert_eq!(a.version, ok(ORDER_REVIEW).version);
    let b = ok(&ORDER_REVIEW.replace("\"attempt\"] >= 3", "\"attempt\"] >= 4"));
    assert_ne!(a.version, b.version);
}

#[test]
fn sequences_accept_await_or_not_and_any_parameter_name() {
    let p = ok("def f(p: dict) -> dict:\n    p = a(p)\n    p = await b(p)\n    return p\n");
    assert_eq!(run(&p, json!({}), echo).0, ["a", "b"]);
}

#[test]
fn mutations_set_augment_nest_and_delete() {
    let p = ok(r#"
async def f(state: dict) -> dict:
    state["n"] = 1
    state["n"] += 2
    state["n"] *= 10
    state["m"] = {"a": [1, 2]}
    state["m"]["a"][0] = state["n"] // 4
    state["s"] = "x" + str(state["n"]) if len(state["m"]["a"]) == 2 else "no"
    state["t"] = state.get("missing", "dflt").upper()
    del state["m"]["a"][1]
    state = await a(state)
    return state
"#);
    let (_, end, s) = run(&p, json!({}), echo);
    assert_eq!(end, Outcome::Done);
    assert_eq!(
        s,
        json!({"n": 30, "m": {"a": [7]}, "s": "x30", "t": "DFLT"})
    );
}

#[test]
fn if_elif_else_and_early_return() {
    let p = ok(r#"
async def f(state: dict) -> dict:
    if state.get("skip"):
        return state
    if state["k"] == 1:
        state = await one(state)
    elif state["k"] == 2 and not state.get("x"):
        state = await two(state)
    else:
        state = await other(state)
    state = await last(state)
    return state
"#);
    assert_eq!(run(&p, json!({"skip": true}), echo).0, Vec::<String>::new());
    assert_eq!(run(&p, json!({"k": 1}), echo).0, ["one", "last"]);
    assert_eq!(run(&p, json!({"k": 2}), echo).0, ["two", "last"]);
    assert_eq!(run(&p, json!({"k": 2, "x": 1}), echo).0, ["other", "last"]);
}

#[test]
fn while_with_break_continue_and_the_guard() {
    let src = r#"
async def f(state: dict) -> dict:
    state["i"] = 0
    while state["i"] < 5:
        state["i"] += 1
        if state["i"] == 2:
            continue
        state = await step(state)
        if state.get("stop"):
            break
    return state
"#;
    let p = ok(src);
    assert_eq!(run(&p, json!({}), echo).0, ["step"; 4]);
    let stop_at_3 = |_: &str, s: &Value, _| {
        let mut s = s.clone();
        s["stop"] = json!(s["i"] == 3);
        Ok(s)
    };
    assert_eq!(run(&p, json!({}), stop_at_3).0, ["step"; 2]);
    // `while True` is bounded by the guard.
    let p = compile(
        "async def f(state: dict) -> dict:\n    while True:\n        state = await poll(state)\n    return state\n",
        "t.py",
        &Options { max_iterations: 4, ..Options::default() },
    )
    .unwrap()
    .program;
    let (calls, end, _) = run(&p, json!({}), echo);
    assert_eq!(calls.len(), 4);
    assert!(matches!(end, Outcome::Abort(m) if m.contains("line 2")));
}

#[test]
fn try_except_by_type_and_bases_else_bare_and_tuple() {
    let p = ok(r#"
async def f(state: dict) -> dict:
    try:
        state = await risky(state)
    except (KeyError, IndexError):
        state["caught"] = "lookup"
    except ValueError:
        state["caught"] = "value"
        state = await fallback(state)
    except:
        state["caught"] = "any"
    else:
        state["caught"] = "none"
    state = await after(state)
    return state
"#);
    let failing = |mro: &'static [&'static str]| {
        move |a: &str, s: &Value, _| {
            if a == "risky" {
                Err(exc(mro[0], mro))
            } else {
                Ok(s.clone())
            }
        }
    };
    let (calls, _, s) = run(
        &p,
        json!({}),
        failing(&["IndexError", "LookupError", "Exception"]),
    );
    assert_eq!(
        (calls, s["caught"].clone()),
        (vec!["risky".into(), "after".into()], json!("lookup"))
    );
    let (calls, _, s) = run(
        &p,
        json!({}),
        failing(&["Declined", "ValueError", "Exception"]),
    );
    assert_eq!((calls.len(), s["caught"].clone()), (3, json!("value")));
    let (_, _, s) = run(&p, json!({}), failing(&["OSError", "Exception"]));
    assert_eq!(s["caught"], "any");
    let (_, _, s) = run(&p, json!({}), echo);
    assert_eq!(s["caught"], "none");
}

#[test]
fn raise_new_and_reraise() {
    let p = ok(r#"
async def f(state: dict) -> dict:
    try:
        state = await a(state)
        if state["bad"]:
            raise ValueError("bad order")
    except ValueError:
        state = await log_it(state)
        raise
    return state
"#);
    let (calls, end, _) = run(&p, json!({"bad": true}), echo);
    assert_eq!(calls, ["a", "log-it"]);
    match end {
        Outcome::Unhandled(e) => assert_eq!(
            (e.error_type.as_str(), e.message.as_str(), e.line),
            ("ValueError", "bad order", 6)
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn sub_flows_are_inlined_and_their_return_resumes_the_caller() {
    let p = ok(r#"
async def enrich(s: dict) -> dict:
    if s.get("done"):
        return s
    s = await lookup(s)
    return s

@flow
async def main(state: dict) -> dict:
    state = await enrich(state)
    state = await enrich(state)
    state = await finish(state)
    return state
"#);
    assert_eq!(run(&p, json!({}), echo).0, ["lookup", "lookup", "finish"]);
    assert_eq!(run(&p, json!({"done": 1}), echo).0, ["finish"]);
}

#[test]
fn class_methods_and_module_functions_name_actors() {
    let c = compile(
        "async def f(state: dict) -> dict:\n    model = Model()\n    state = await model.predict(state)\n    state = await tools.clean_up(state)\n    return state\n",
        "t.py",
        &Options::default(),
    )
    .unwrap();
    let names: Vec<_> = c
        .actors
        .iter()
        .map(|a| (a.actor.as_str(), a.handler.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("model-predict", "handlers.Model.predict"),
            ("tools-clean-up", "tools.clean_up")
        ]
    );
}

#[test]
fn fan_out_from_a_list_a_comprehension_and_gather() {
    let p = ok(r#"
import asyncio

async def f(state: dict) -> dict:
    state["a"] = [left(state["x"]), right(state["y"])]
    state["b"] = [score(i) for i in state["items"]]
    state["c"] = await asyncio.gather(left(state["x"]), right({"k": state["y"]}))
    state["d"] = await asyncio.gather(*[score(i) for i in state["items"]])
    state = await merge(state)
    return state
"#);
    let (calls, end, s) = run(&p, json!({"x": 1, "y": 2, "items": [10, 20]}), echo);
    assert_eq!(end, Outcome::Done);
    assert_eq!(
        calls,
        [
            "left", "right", "score", "score", "left", "right", "score", "score", "merge"
        ]
    );
    assert_eq!(
        s["b"],
        json!([{"from": "score", "in": 10}, {"from": "score", "in": 20}])
    );
    assert_eq!(s["c"][1], json!({"from": "right", "in": {"k": 2}}));
}

#[test]
fn each_unsupported_construct_is_refused_with_line_construct_and_alternative() {
    let head = "async def f(state: dict) -> dict:\n";
    let cases: &[(&str, &str)] = &[
        (
            "    for x in state['items']:\n        state = await a(state)\n",
            "a `for` loop",
        ),
        ("    with lock():\n        pass\n", "a `with` block"),
        (
            "    try:\n        state = await a(state)\n    finally:\n        pass\n",
            "`finally`",
        ),
        (
            "    try:\n        state = await a(state)\n    except ValueError as e:\n        pass\n",
            "`except ... as NAME`",
        ),
        (
            "    state = await a(b(state))\n",
            "an actor call with other arguments",
        ),
        (
            "    state = await a(state, 1)\n",
            "an actor call with other arguments",
        ),
        ("    x, y = state\n", "this assignment target"),
        (
            "    m = MyClass(param=1)\n",
            "an instantiation with arguments",
        ),
        ("    yield state\n", "`yield`"),
        ("    import os\n", "an `import` inside the flow"),
        ("    global g\n", "`global`/`nonlocal`"),
        ("    a(state)\n", "a call whose result is not assigned"),
        ("    raise\n", "a bare `raise` outside `except`"),
        ("    break\n", "`break` outside a loop"),
        ("    state['s'] = f'{state}'\n", "an f-string"),
        ("    state['f'] = lambda: 1\n", "this expression (lambda)"),
        ("    state['n'] = counter\n", "the name `counter`"),
        ("    state['n'] = state['a'][1:2]\n", "a slice"),
        (
            "    state['n'] = state['a'] is state['b']\n",
            "`is` with a value other than None, True or False",
        ),
        ("    state['n'] = state['a'] ** 2\n", "the operator Pow"),
        (
            "    state['n'] = compute(state['a'])\n",
            "the call `compute(...)` inside an expression",
        ),
        (
            "    state['n'] = await a(state)\n",
            "`await` of something other than an actor call",
        ),
        ("    state['n'] = (1, 2)\n", "a tuple"),
        (
            "    state['n'] = state['a'].split()\n",
            "the method `.split()`",
        ),
        (
            "    while state['x']:\n        state = await a(state)\n    else:\n        pass\n",
            "`while` ... `else`",
        ),
        (
            "    state = await a(state)\n    return None\n",
            "this `return`",
        ),
        (
            "    state['r'] = [a(x) for x in state['i'] if x]\n",
            "a filtered comprehension",
        ),
        ("    assert state['x']\n", "`assert`"),
        ("    state = {}\n", "an assignment to the state itself"),
        ("    raise ValueError(state['m'])\n", "this `raise`"),
    ];
    for (body, construct) in cases {
        let msg = refused(&format!("{head}{body}"));
        assert!(msg.starts_with("line "), "{msg}");
        assert!(
            msg.contains(&format!("{construct} is not supported in a flow")),
            "{construct}: {msg}"
        );
        assert!(msg.contains("; instead: "), "{msg}");
    }
    // The line is the statement's own.
    let msg = refused(&format!(
        "{head}    state = await a(state)\n\n    for x in y:\n        pass\n"
    ));
    assert!(msg.starts_with("line 4: a `for` loop"), "{msg}");
    // Every refusal at once.
    assert_eq!(
        refused(&format!("{head}    import os\n    global g\n"))
            .lines()
            .count(),
        2
    );
}

#[test]
fn files_without_one_flow_and_recursion_are_refused() {
    assert!(refused("x = 1\n").contains("no flow function"));
    let two = "async def a(s: dict) -> dict:\n    s = await x(s)\n    return s\nasync def b(s: dict) -> dict:\n    s = await y(s)\n    return s\n";
    assert!(refused(two).contains("several flow functions (a, b)"));
    let rec = "async def a(s: dict) -> dict:\n    s = await a(s)\n    return s\n@flow\nasync def m(s: dict) -> dict:\n    s = await a(s)\n    return s\n";
    assert!(refused(rec).contains("the recursive call of sub-flow a"));
    assert!(
        refused("async def f(state: dict) -> dict:\n    state['x'] = 1\n    return state\n")
            .contains("a flow without an actor call")
    );
    assert!(
        refused("async def f(state: dict) -> dict:\n    state = = 1\n")
            .contains("not valid Python")
    );
}

#[test]
fn the_output_dir_flag_is_o_only_after_flow_compile() {
    let argv = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
    assert_eq!(
        crate::args::flow_output_dir(argv(&["asya", "flow", "compile", "f.py", "-o", "d"])),
        argv(&["asya", "flow", "compile", "f.py", "--output-dir", "d"])
    );
    let other = argv(&["asya", "sump", "list", "-o", "json"]);
    assert_eq!(crate::args::flow_output_dir(other.clone()), other);
}

/// The compiled example the sidecar's flow tests run (they may not use the compiler: the
/// sidecar does not import the CLI) is what the compiler makes of the example today.
#[test]
fn the_compiled_example_fixture_is_up_to_date() {
    let fixture: Program = serde_json::from_str(include_str!(
        "../../../flow/fixtures/order_review.program.json"
    ))
    .unwrap();
    let now = compile(
        ORDER_REVIEW,
        "order_review.py",
        &Options {
            module: "orders".into(),
            ..Options::default()
        },
    )
    .unwrap()
    .program;
    assert_eq!(
        fixture, now,
        "regenerate: asya flow compile deploy/examples/flows/order_review.py --module orders -o DIR, \
         then the program.json of DIR/flow-program.yaml into flow/fixtures/order_review.program.json"
    );
}

/// The same for the fan-out fixture (sidecar/tests/flows_fanout.rs).
#[test]
fn the_compiled_fan_out_fixture_is_up_to_date() {
    let fixture: Program =
        serde_json::from_str(include_str!("../../../flow/fixtures/fan_out.program.json")).unwrap();
    let now = compile(
        include_str!("../../../flow/fixtures/fan_out.py"),
        "fan_out.py",
        &Options {
            module: "fanout".into(),
            ..Options::default()
        },
    )
    .unwrap()
    .program;
    assert_eq!(
        fixture, now,
        "regenerate: asya flow compile flow/fixtures/fan_out.py --module fanout -o DIR, then the \
         program.json of DIR/flow-program.yaml into flow/fixtures/fan_out.program.json"
    );
}

/// What `compile` writes is admitted as users deploy it: each AsyncActor passes the same
/// review as the webhook's (no errors), and the entry reads the program from the ConfigMap.
#[test]
fn the_compiled_manifests_pass_the_admission_review() {
    use super::manifests::{Deploy, files};
    let c = compile(
        ORDER_REVIEW,
        "order_review.py",
        &Options {
            module: "orders".into(),
            ..Options::default()
        },
    )
    .unwrap();
    let out = files(
        &c,
        &Deploy {
            image: "asya-examples:latest".into(),
        },
    );
    let names: Vec<&str> = out.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "flow-program.yaml",
            "actor-validate.yaml",
            "actor-charge.yaml",
            "actor-express-ship.yaml",
            "actor-standard-ship.yaml",
            "actor-notify.yaml",
            "flow.mmd",
            "flow.dot"
        ]
    );
    let yaml = |name: &str| -> Value {
        serde_yaml::from_str(&out.iter().find(|f| f.name == name).unwrap().text).unwrap()
    };
    let catalog = asya_api::flavor::FlavorCatalog::default();
    let config = asya_api::ClusterConfig::default();
    for f in out.iter().filter(|f| f.name.starts_with("actor-")) {
        let v = yaml(&f.name);
        let review = asya_api::review::review_actor(&asya_api::review::ReviewRequest {
            object: &v,
            old_object: None,
            namespace: Some("shop"),
            catalog: &catalog,
            config: &config,
        });
        assert!(review.errors.is_empty(), "{}: {:?}", f.name, review.errors);
        assert_eq!(v["metadata"]["labels"]["asya.sh/flow"], "review_order");
    }
    let entry = yaml("actor-validate.yaml");
    assert_eq!(entry["metadata"]["labels"]["asya.sh/flow-role"], "entry");
    assert_eq!(
        entry["spec"]["sidecar"]["env"][0],
        json!({"name": "ASYA_FLOW_PROGRAM",
               "valueFrom": {"configMapKeyRef": {"name": "flow-review-order", "key": "program.json"}}})
    );
    assert_eq!(
        yaml("actor-notify.yaml")["metadata"]["labels"]["asya.sh/flow-role"],
        "step"
    );
    // review_order has no docstring: no description for the gateway's tool.
    assert_eq!(entry["metadata"].get("annotations"), None);
    let cm = yaml("flow-program.yaml");
    let program: Program =
        serde_json::from_str(cm["data"]["program.json"].as_str().unwrap()).unwrap();
    assert_eq!(program, c.program);
    let mmd = &out.iter().find(|f| f.name == "flow.mmd").unwrap().text;
    assert!(mmd.contains("n13 -.->|except PaymentError|"), "{mmd}");
    assert!(
        out.iter()
            .find(|f| f.name == "flow.dot")
            .unwrap()
            .text
            .starts_with("// flow review_order")
    );
}

#[test]
fn the_flow_docstring_describes_the_entry_for_the_gateway() {
    use super::manifests::{Deploy, files};
    let src = "async def triage(state: dict) -> dict:\n    \"\"\"Sorts a ticket:\n\n    by urgency.\"\"\"\n    state = await classify(state)\n    state = await route(state)\n    return state\n";
    let c = compile(src, "triage.py", &Options::default()).unwrap();
    assert_eq!(
        c.description.as_deref(),
        Some("Sorts a ticket: by urgency.")
    );
    let out = files(&c, &Deploy { image: "x".into() });
    let doc = |name: &str| -> Value {
        serde_yaml::from_str(&out.iter().find(|f| f.name == name).unwrap().text).unwrap()
    };
    assert_eq!(
        doc("actor-classify.yaml")["metadata"]["annotations"],
        json!({"asya.sh/flow-description": "Sorts a ticket: by urgency."})
    );
    assert_eq!(doc("actor-route.yaml")["metadata"].get("annotations"), None);
}
