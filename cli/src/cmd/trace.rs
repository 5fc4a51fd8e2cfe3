//! `asya trace ID`: the hops of an envelope and its fan-out children, from the gateway's
//! store, else the trace backend's spans (as a tree), else where the queues hold them; the
//! output says which.

use std::collections::VecDeque;

use asya_api::naming;
use asya_transport::envelope;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde_json::Value;

use crate::args::Global;
use crate::cluster;
use crate::error::{CliError, Exit, Result};
use crate::failed::Failed;
use crate::render::{self, Format, Table};
use crate::session::{self, Session};
use crate::trace::{self, Hop, Source};
use crate::trace_backend::{self, Span};

/// Envelopes of one family a trace follows at most (a fan-out can be large).
const MAX_FAMILY: usize = 1000;
/// How far back the trace backend is searched: a week, in µs.
const SEARCH_WINDOW_US: u64 = 7 * 24 * 3600 * 1_000_000;

/// What one source told: how to name it, the hops, and the backend's trace as a tree.
struct Found {
    described: String,
    hops: Vec<Hop>,
    trace: Option<(String, Vec<Span>)>,
}

pub async fn run(
    g: &Global,
    id: &str,
    gateway_url: Option<&str>,
    token: Option<&str>,
    trace_backend: Option<&str>,
) -> Result<(String, Exit)> {
    let s = session::open(g).await?;
    let configured_gateway = s.config.gateway.url.as_deref();
    let configured_backend =
        Some(s.config.tracing.query_url.as_str()).filter(|_| s.config.tracing.enabled);
    let mut empty = Vec::new();
    for source in trace::sources(
        gateway_url.or(configured_gateway),
        trace_backend.or(configured_backend),
    ) {
        let asked = match &source {
            Source::Gateway(url) => from_gateway(url, id, token).await.map(|hops| Found {
                described: trace::described(&source),
                hops,
                trace: None,
            }),
            Source::TraceBackend(url) => from_backend(&s, url, id).await.map(|trace| Found {
                described: match &trace {
                    Some((t, _)) => format!("the trace backend at {url} (trace {t})"),
                    None => trace::described(&source),
                },
                hops: trace
                    .as_ref()
                    .map(|(_, spans)| trace_backend::hops(spans))
                    .unwrap_or_default(),
                trace,
            }),
            Source::Queues => from_queues(&s, id, g.max).await.map(|hops| Found {
                described: trace::described(&source),
                hops,
                trace: None,
            }),
        };
        let found = match asked {
            Ok(found) => found,
            Err(e) if trace::passed_over(&source, could_not_answer(&e)) => {
                empty.push(format!("{} ({e})", trace::described(&source)));
                continue;
            }
            Err(e) => return Err(e),
        };
        if found.hops.is_empty() {
            empty.push(found.described);
            continue;
        }
        return Ok((render(g.output, found, &empty), Exit::Ok));
    }
    Err(CliError::NotFound {
        what: format!("envelope {id:?}"),
        why: format!("nothing about it in {}", empty.join(", nor in ")),
    })
}

/// A source out of reach or refusing this caller (not a wrong answer).
fn could_not_answer(e: &CliError) -> bool {
    matches!(e, CliError::Unavailable { .. } | CliError::Forbidden { .. })
}

fn render(format: Format, found: Found, empty: &[String]) -> String {
    let Found {
        described,
        hops,
        trace,
    } = found;
    let skipped = if empty.is_empty() {
        String::new()
    } else {
        format!(" (nothing in {})", empty.join(", "))
    };
    match format {
        Format::Table => {
            let mut t = Table::new(&["ENVELOPE", "ACTOR", "AT", "DURATION", "OUTCOME"]);
            for h in &hops {
                t.row(vec![
                    h.envelope.clone(),
                    h.actor.clone(),
                    crate::clock::rfc3339(h.at_ms.and_then(|m| u64::try_from(m).ok())),
                    h.duration_ms.map(|d| format!("{d}ms")).unwrap_or_default(),
                    h.outcome.clone(),
                ]);
            }
            let tree = trace
                .map(|(_, spans)| format!("{}\n", trace_backend::render_tree(&spans)))
                .unwrap_or_default();
            format!("source: {described}{skipped}\n{tree}{}", t.render())
        }
        f => {
            let mut doc = serde_json::json!({"source": described, "hops": hops});
            if let Some((trace_id, spans)) = trace {
                doc["trace_id"] = trace_id.into();
                doc["spans"] = serde_json::to_value(spans).unwrap_or_default();
            }
            render::structured(&doc, f)
        }
    }
}

/// The envelope's trace in the backend, for the namespace's actors.
async fn from_backend(s: &Session, base: &str, id: &str) -> Result<Option<(String, Vec<Span>)>> {
    let ns = &s.cluster.namespace;
    let actors: Vec<String> = cluster::actors(&s.cluster.client, Some(ns))
        .await?
        .into_iter()
        .filter_map(|a| a.spec.actor.clone().or(a.metadata.name.clone()))
        .collect();
    find_in_backend(base, &actors, ns, id).await
}

/// Searches the backend by `messaging.message.id` under each of `actors` that it knows as a
/// service (Jaeger's search needs one), then reads the trace whole and keeps the spans of
/// namespace `ns` (another tenant's actor may have the same name).
pub async fn find_in_backend(
    base: &str,
    actors: &[String],
    ns: &str,
    id: &str,
) -> Result<Option<(String, Vec<Span>)>> {
    let what = format!("the trace backend at {base}");
    let services: Vec<String> = get_json(&format!("{base}/api/services"), None, &what)
        .await?
        .and_then(|v| serde_json::from_value(v["data"].clone()).ok())
        .unwrap_or_default();
    let mut candidates: Vec<&String> = actors.iter().filter(|a| services.contains(a)).collect();
    candidates.sort();
    candidates.dedup();
    let tags = serde_json::json!({ trace_backend::MESSAGE_ID: id }).to_string();
    // Jaeger searches the last hour unless told: a failed envelope may be days old.
    let end_us = crate::clock::now_ms() * 1000;
    let start_us = end_us.saturating_sub(SEARCH_WINDOW_US);
    for actor in candidates {
        let url = format!(
            "{base}/api/traces?service={}&tags={}&start={start_us}&end={end_us}&limit=5",
            percent(actor),
            percent(&tags)
        );
        let Some(answer) = get_json(&url, None, &what).await? else {
            continue;
        };
        for trace_id in trace_backend::trace_ids(&answer) {
            let Some(whole) =
                get_json(&format!("{base}/api/traces/{trace_id}"), None, &what).await?
            else {
                continue;
            };
            let spans = trace_backend::of_namespace(trace_backend::spans(&whole), ns);
            if spans.iter().any(|sp| sp.envelope.as_deref() == Some(id)) {
                return Ok(Some((trace_id, spans)));
            }
        }
    }
    Ok(None)
}

/// Percent-encodes a query value (RFC 3986 unreserved characters stay).
fn percent(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn get_json(url: &str, token: Option<&str>, what: &str) -> Result<Option<Value>> {
    let client = asya_transport::http_client::client::<Empty<Bytes>>()
        .map_err(|e| CliError::Failed(format!("TLS roots: {e}")))?;
    let mut req = hyper::Request::get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| CliError::Usage(format!("URL {url:?} of {what}: {e}")))?;
    let unreachable = |e: &dyn std::fmt::Display| CliError::Unavailable {
        what: what.to_string(),
        why: e.to_string(),
    };
    let resp = client.request(req).await.map_err(|e| unreachable(&e))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(&e))?
        .to_bytes();
    match status.as_u16() {
        200 => serde_json::from_slice(&body).map(Some).map_err(|e| {
            CliError::Failed(format!("the answer of {what} for {url} is not JSON: {e}"))
        }),
        404 => Ok(None),
        401 | 403 => Err(CliError::Forbidden {
            verb: "read",
            resource: "gateway envelopes",
            name: url.to_string(),
            namespace: String::new(),
            why: String::from_utf8_lossy(&body).into_owned(),
            hint: " (pass --gateway-token or ASYA_GATEWAY_TOKEN: a client token for this namespace)",
        }),
        _ => Err(unreachable(&format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        ))),
    }
}

/// The envelope's record and its children's, breadth first.
async fn from_gateway(base: &str, id: &str, token: Option<&str>) -> Result<Vec<Hop>> {
    let mut hops = Vec::new();
    let mut todo = VecDeque::from([id.to_string()]);
    let mut seen = 0;
    while let Some(next) = todo.pop_front() {
        seen += 1;
        if seen > MAX_FAMILY {
            break;
        }
        let Some(rec) = get_json(
            &format!("{base}/envelopes/{next}"),
            token,
            &format!("the gateway at {base}"),
        )
        .await?
        else {
            continue;
        };
        hops.extend(trace::hops_from_gateway(&rec));
        todo.extend(trace::children(&rec));
    }
    Ok(hops)
}

/// Where each envelope of the family is now: waiting in an actor's queue, finished in
/// x-sink, failed in x-sump (with the actor it failed at).
async fn from_queues(s: &Session, id: &str, max: usize) -> Result<Vec<Hop>> {
    let ns = &s.cluster.namespace;
    let broker = s.broker(ns).await?;
    let mut places: Vec<(String, String, &'static str)> = vec![
        (naming::sink_queue(ns), "x-sink".into(), "finished"),
        (naming::sump_queue(ns), "x-sump".into(), "failed"),
    ];
    for a in cluster::actors(&s.cluster.client, Some(ns)).await? {
        if let Some(actor) = a.spec.actor.clone().or(a.metadata.name.clone()) {
            places.push((naming::actor_queue(ns, &actor), actor, "waiting"));
        }
    }
    let mut hops = Vec::new();
    for (queue, actor, outcome) in places {
        let (held, _) = match broker.browse(&queue, max).await {
            Ok(h) => h,
            // An actor whose queue is gone has nothing to say about the envelope.
            Err(CliError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        for m in &held {
            let Ok(e) = envelope::parse(&m.body, None) else {
                continue;
            };
            if !trace::in_family(id, &e.id) {
                continue;
            }
            let f = Failed::of(&e, m.broker_time_ms);
            let (actor, outcome) = if outcome == "failed" {
                (
                    f.actor.clone().unwrap_or_else(|| actor.clone()),
                    format!("failed: {}", f.summary()),
                )
            } else {
                (actor.clone(), outcome.to_string())
            };
            // A flow's envelope says which way it went.
            let outcome = match trace::flow_path(&e) {
                Some(path) => format!("{outcome} ({path})"),
                None => outcome,
            };
            hops.push(Hop {
                envelope: e.id.clone(),
                actor,
                at_ms: m.broker_time_ms.and_then(|t| i64::try_from(t).ok()),
                duration_ms: None,
                outcome,
            });
        }
        broker.give_back(held).await?;
    }
    broker.close().await;
    Ok(hops)
}
