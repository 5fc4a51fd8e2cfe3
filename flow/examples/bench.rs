//! What carrying a flow costs a hop (docs/benchmarks.md § Flows): the worked example's
//! program (flow/fixtures/order_review.program.json) in an envelope, against the same
//! envelope without it. Per hop the sidecar reads the body, takes the flow out, resumes the
//! program after the handler's answer and writes the next body: measured here, in-process.
//!
//!     cargo run --release -p asya-flow --example bench

use std::time::Instant;

use asya_flow::{Carried, Event, Program};
use serde_json::{Value, json};

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/order_review.program.json"
    );
    let program: Program =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("a program");
    let compact = serde_json::to_vec(&program).unwrap();
    let payload = json!({"items": [{"price": 60}, {"price": 50}], "status": "received",
                         "attempt": 1, "total": 110, "note": "x".repeat(120)});
    let mut flow = Carried::new(program.clone());
    let mut state = payload.clone();
    // Where the example is after validate and charge answered: before the branch.
    flow.resume(&mut state, Event::Start);
    let answer = state.clone();
    flow.resume(&mut state, Event::Answer(answer));
    let plain = json!({"id": "e1", "route": {"actors": ["validate", "charge"], "current": 1},
                       "headers": {}, "payload": state});
    let mut with_flow = plain.clone();
    with_flow["flow"] = serde_json::to_value(&flow).unwrap();
    let plain_body = serde_json::to_vec(&plain).unwrap();
    let flow_body = serde_json::to_vec(&with_flow).unwrap();
    println!(
        "program: {} instructions, {} bytes of JSON",
        program.code.len(),
        compact.len()
    );
    println!(
        "envelope: {} bytes without the flow, {} with it (+{})",
        plain_body.len(),
        flow_body.len(),
        flow_body.len() - plain_body.len()
    );

    let n = 20_000;
    let time = |label: &str, f: &mut dyn FnMut()| {
        for _ in 0..1_000 {
            f();
        }
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!("{label}: {us:.1} µs a hop");
    };
    time("plain hop (parse body, write next body)", &mut || {
        let v: Value = serde_json::from_slice(&plain_body).unwrap();
        std::hint::black_box(serde_json::to_vec(&v).unwrap());
    });
    let mut steps = 0;
    time(
        "flow hop (parse, take the flow, resume to the next call, write)",
        &mut || {
            let mut v: Value = serde_json::from_slice(&flow_body).unwrap();
            let mut c: Carried = serde_json::from_value(v["flow"].take()).unwrap();
            c.program.check().unwrap();
            let mut s = Value::Null;
            let ev = c.resume(&mut s, Event::Answer(v["payload"].take()));
            steps = ev.steps;
            v["payload"] = s;
            v["flow"] = serde_json::to_value(&c).unwrap();
            std::hint::black_box(serde_json::to_vec(&v).unwrap());
        },
    );
    let mut s = state.clone();
    time("evaluation alone (resume to the next call)", &mut || {
        let mut c = flow.clone();
        std::hint::black_box(c.resume(&mut s, Event::Answer(state.clone())));
    });
    println!(
        "steps of that evaluation: {steps} (budget {})",
        program.step_budget
    );
}
