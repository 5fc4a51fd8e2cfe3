//! `asya sump list|show|redrive`: the I/O around `crate::sump`, and the printing.

use std::io::Write;

use crate::args::{Global, SumpCommand};
use crate::clock;
use crate::error::{CliError, Exit, Result};
use crate::render::{self, Format, Table};
use crate::select::Selector;
use crate::session;
use crate::sump::{self, Flow, Listing, RedriveReport, Request};
use crate::sump_source::SumpQueue;

fn usage(e: impl std::fmt::Display) -> CliError {
    CliError::Usage(e.to_string())
}

/// The selection of the command line, refused before anything is connected to.
fn selection(c: &SumpCommand) -> Result<Selector> {
    let sel = match c {
        SumpCommand::List {
            actor,
            since,
            error,
        } => Selector::parse(
            vec![],
            actor.clone(),
            error.as_deref(),
            since.as_deref(),
            false,
            false,
        ),
        SumpCommand::Show { id } => {
            Selector::parse(vec![id.clone()], None, None, None, false, false)
        }
        SumpCommand::Redrive {
            ids,
            actor,
            error,
            since,
            all,
            ..
        } => Selector::parse(
            ids.clone(),
            actor.clone(),
            error.as_deref(),
            since.as_deref(),
            *all,
            true,
        ),
    };
    sel.map_err(usage)
}

pub async fn run(g: &Global, c: &SumpCommand) -> Result<(String, Exit)> {
    let sel = selection(c)?;
    let s = session::open(g).await?;
    let ns = s.cluster.namespace.clone();
    let queue = asya_api::naming::sump_queue(&ns);
    let store = s.crew_store(&ns, crate::crew::End::Sump).await?;
    let broker = s.broker(&ns).await?;
    let sump_queue = SumpQueue {
        broker: &broker,
        queue: &queue,
    };
    let listing = async |sel: &Selector| match &store {
        Some(st) => sump::browse(st, sel, g.max, clock::now_ms()).await,
        None => sump::browse(&sump_queue, sel, g.max, clock::now_ms()).await,
    };
    let out = match c {
        SumpCommand::List { .. } => {
            let l = listing(&sel).await?;
            (list_text(&l, g.output), Exit::Ok)
        }
        SumpCommand::Show { id } => {
            let l = listing(&sel).await?;
            if l.envelopes.is_empty() {
                broker.close().await;
                return Err(CliError::NotFound {
                    what: format!("envelope {id:?} in x-sump of namespace {ns:?}"),
                    why: format!("read from {}", l.source),
                });
            }
            (show_text(&l, g.output), Exit::Ok)
        }
        SumpCommand::Redrive { dry_run, .. } => {
            let mut progress = |o: &sump::Outcome| {
                // Progress on stderr, one line per envelope, so a long redrive shows life
                // and stdout stays the report.
                let _ = writeln!(
                    std::io::stderr(),
                    "{} {} -> {}",
                    o.result,
                    o.id,
                    o.actor.as_deref().unwrap_or("-")
                );
                Flow::Continue
            };
            let (now, now_ms) = (clock::now_rfc3339(), clock::now_ms());
            let req = Request {
                namespace: &ns,
                sel: &sel,
                max: g.max,
                dry_run: *dry_run,
                now: &now,
                now_ms,
            };
            let r = match &store {
                Some(st) => sump::redrive(st, &broker, &req, &mut progress).await?,
                None => sump::redrive(&sump_queue, &broker, &req, &mut progress).await?,
            };
            let missing: Vec<String> = sel
                .ids
                .iter()
                .filter(|i| !r.outcomes.iter().any(|o| o.id == **i))
                .cloned()
                .collect();
            let exit = if r.all_done() && missing.is_empty() {
                Exit::Ok
            } else {
                Exit::Failed
            };
            let mut text = redrive_text(&r, g.output);
            if !missing.is_empty() && g.output == Format::Table {
                text.push_str(&format!("not in x-sump: {}\n", missing.join(", ")));
            }
            (text, exit)
        }
    };
    broker.close().await;
    Ok(out)
}

fn list_text(l: &Listing, f: Format) -> String {
    if f != Format::Table {
        let rows: Vec<_> = l.envelopes.iter().map(|e| &e.failed).collect();
        return render::structured(
            &serde_json::json!({"source": l.source, "envelopes": rows, "unreadable": l.unreadable,
                                "truncated": l.truncated, "note": l.note}),
            f,
        );
    }
    let mut t = Table::new(&[
        "ID", "ACTOR", "POSITION", "ATTEMPTS", "FAILED", "REDRIVEN", "ERROR",
    ]);
    for e in &l.envelopes {
        let x = &e.failed;
        t.row(vec![
            x.id.clone(),
            x.actor.clone().unwrap_or_default(),
            x.position_label(),
            x.attempts.to_string(),
            clock::rfc3339(x.failed_at_ms),
            x.redriven.to_string(),
            x.summary(),
        ]);
    }
    let mut out = format!("source: {}\n", l.source);
    out.push_str(&t.render());
    footer(&mut out, l);
    out
}

fn footer(out: &mut String, l: &Listing) {
    if l.unreadable > 0 {
        out.push_str(&format!(
            "{} message(s) in x-sump are not envelopes (not shown)\n",
            l.unreadable
        ));
    }
    if l.truncated {
        out.push_str("more messages than --max were in x-sump: raise --max to see them all\n");
    }
    if let Some(n) = &l.note {
        out.push_str(&format!("note: {n}\n"));
    }
}

fn show_text(l: &Listing, f: Format) -> String {
    if f != Format::Table {
        return render::structured(
            &serde_json::json!({"source": l.source, "envelopes": l.envelopes}),
            f,
        );
    }
    let mut out = format!("source: {}\n", l.source);
    for e in &l.envelopes {
        let x = &e.failed;
        let field = |k: &str, v: &str| format!("{k:<11}{}\n", if v.is_empty() { "-" } else { v });
        out.push_str(&field("id:", &x.id));
        out.push_str(&field("actor:", x.actor.as_deref().unwrap_or("")));
        out.push_str(&field(
            "position:",
            &format!("{} (route: {})", x.position_label(), x.route.join(" -> ")),
        ));
        out.push_str(&field("reason:", x.reason.as_deref().unwrap_or("")));
        out.push_str(&field("error:", &x.summary()));
        out.push_str(&field("attempts:", &x.attempts.to_string()));
        out.push_str(&field("failed at:", &clock::rfc3339(x.failed_at_ms)));
        out.push_str(&field("redriven:", &x.redriven.to_string()));
        out.push_str(&field(
            "payload:",
            &serde_json::to_string(&e.envelope.payload).unwrap_or_default(),
        ));
        if let Some(tb) = &x.traceback {
            out.push_str("traceback:\n");
            for line in tb.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
    }
    out
}

fn redrive_text(r: &RedriveReport, f: Format) -> String {
    if f != Format::Table {
        return render::structured(r, f);
    }
    let mut t = Table::new(&["ID", "RESULT", "ACTOR", "DETAIL"]);
    for o in &r.outcomes {
        t.row(vec![
            o.id.clone(),
            o.result.to_string(),
            o.actor.clone().unwrap_or_default(),
            o.detail.clone().unwrap_or_default(),
        ]);
    }
    let mut out = format!("source: {}\n", r.source);
    out.push_str(&t.render());
    if r.truncated {
        out.push_str("more messages than --max were in x-sump: run again for the rest\n");
    }
    out
}
