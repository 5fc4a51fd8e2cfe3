//! The flow as a graph (Mermaid and Graphviz DOT), drawn from the compiled program: actor
//! calls as boxes, conditions as diamonds, the except paths dashed.

use asya_flow::ir::{Expr, Instr, Program};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    Actor,
    Decision,
    Step,
    End,
}

struct Graph {
    nodes: Vec<(String, String, Shape)>,
    /// (from, to, label, dashed)
    edges: Vec<(String, String, String, bool)>,
}

/// The instruction control reaches from `pc`, skipping bookkeeping and jumps; `None` = end.
fn resolve(p: &Program, mut pc: usize) -> Option<usize> {
    for _ in 0..=p.code.len() {
        match p.code.get(pc)? {
            Instr::Jump { to } => pc = *to,
            Instr::LoopEnter { .. }
            | Instr::LoopGuard { .. }
            | Instr::TryExit
            | Instr::ExceptExit => pc += 1,
            _ => return Some(pc),
        }
    }
    None
}

fn id(p: &Program, pc: usize) -> String {
    match resolve(p, pc) {
        Some(n) => format!("n{n}"),
        None => "done".into(),
    }
}

fn keys(target: &[Expr]) -> String {
    target
        .iter()
        .map(|k| match k {
            Expr::Const(v) => format!("[{v}]"),
            _ => "[…]".into(),
        })
        .collect()
}

fn build(p: &Program) -> Graph {
    let mut g = Graph {
        nodes: vec![
            ("start".into(), "start".into(), Shape::End),
            ("done".into(), "x-sink".into(), Shape::End),
        ],
        edges: vec![("start".into(), id(p, 0), String::new(), false)],
    };
    let mut raises = false;
    for (pc, i) in p.code.iter().enumerate() {
        if resolve(p, pc) != Some(pc) {
            continue;
        }
        let me = format!("n{pc}");
        let next = id(p, pc + 1);
        let mut edge = |to: String, label: &str, dashed: bool| {
            g.edges.push((me.clone(), to, label.to_string(), dashed))
        };
        let (label, shape) = match i {
            Instr::Call { actor, .. } => {
                edge(next, "", false);
                (actor.clone(), Shape::Actor)
            }
            Instr::Set { target, line, .. } => {
                edge(next, "", false);
                (format!("{line}: state{} = …", keys(target)), Shape::Step)
            }
            Instr::Del { target, line } => {
                edge(next, "", false);
                (format!("{line}: del state{}", keys(target)), Shape::Step)
            }
            Instr::Branch {
                else_to,
                line,
                looping,
                ..
            } => {
                let (yes, no, what) = if *looping {
                    ("loop", "exit", "while")
                } else {
                    ("true", "false", "if")
                };
                edge(next, yes, false);
                edge(id(p, *else_to), no, false);
                (format!("{line}: {what}"), Shape::Decision)
            }
            Instr::TryEnter { handlers, line } => {
                edge(next, "", false);
                for h in handlers {
                    let what = match &h.types {
                        Some(t) => format!("except {}", t.join(", ")),
                        None => "except".into(),
                    };
                    edge(id(p, h.to), &what, true);
                }
                (format!("{line}: try"), Shape::Step)
            }
            Instr::Raise { line, .. } => {
                raises = true;
                edge("raised".into(), "", true);
                (format!("{line}: raise"), Shape::Step)
            }
            Instr::Return { line } => {
                edge("done".into(), "", false);
                (format!("{line}: return"), Shape::Step)
            }
            Instr::FanOut { target, line, .. } => {
                edge(next, "fan-in", false);
                (
                    format!("{line}: fan-out → state{}", keys(target)),
                    Shape::Decision,
                )
            }
            _ => continue,
        };
        g.nodes.push((me, label, shape));
    }
    if raises {
        g.nodes
            .push(("raised".into(), "outer except or x-sump".into(), Shape::End));
    }
    g
}

fn quote(s: &str) -> String {
    s.replace('"', "'")
}

pub fn mermaid(p: &Program) -> String {
    let g = build(p);
    let mut out = format!("%% flow {} version {}\nflowchart TD\n", p.flow, p.version);
    for (id, label, shape) in &g.nodes {
        let l = quote(label);
        out += &match shape {
            Shape::Actor => format!("  {id}[\"{l}\"]\n"),
            Shape::Decision => format!("  {id}{{\"{l}\"}}\n"),
            Shape::Step => format!("  {id}([\"{l}\"])\n"),
            Shape::End => format!("  {id}((\"{l}\"))\n"),
        };
    }
    for (from, to, label, dashed) in &g.edges {
        let arrow = if *dashed { "-.->" } else { "-->" };
        out += &if label.is_empty() {
            format!("  {from} {arrow} {to}\n")
        } else {
            format!("  {from} {arrow}|{}| {to}\n", quote(label))
        };
    }
    out
}

pub fn dot(p: &Program) -> String {
    let g = build(p);
    let mut out = format!(
        "// flow {} version {}\ndigraph \"{}\" {{\n  node [fontname=\"sans-serif\"];\n",
        p.flow,
        p.version,
        quote(&p.flow)
    );
    for (id, label, shape) in &g.nodes {
        let s = match shape {
            Shape::Actor => "box",
            Shape::Decision => "diamond",
            Shape::Step => "note",
            Shape::End => "circle",
        };
        out += &format!("  {id} [label=\"{}\", shape={s}];\n", quote(label));
    }
    for (from, to, label, dashed) in &g.edges {
        let style = if *dashed { ", style=dashed" } else { "" };
        out += &format!("  {from} -> {to} [label=\"{}\"{style}];\n", quote(label));
    }
    out + "}\n"
}
