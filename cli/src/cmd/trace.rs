//! `asya trace ID`: the hops of an envelope and its fan-out children, from the gateway's
//! store, else from where the queues hold them; the output says which.

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

/// Envelopes of one family a trace follows at most (a fan-out can be large).
const MAX_FAMILY: usize = 1000;

pub async fn run(
    g: &Global,
    id: &str,
    gateway_url: Option<&str>,
    token: Option<&str>,
) -> Result<(String, Exit)> {
    let s = session::open(g).await?;
    let configured = s.config.gateway.url.as_deref();
    let (described, hops) = match trace::source(gateway_url.or(configured), None) {
        Source::Gateway(url) => (
            format!("the gateway's store at {url}"),
            from_gateway(&url, id, token).await?,
        ),
        Source::TraceBackend(t) => {
            return Err(CliError::Failed(format!(
                "trace backend {t:?}: not supported by this version of asya"
            )));
        }
        Source::Queues => (
            "the namespace's queues (where each envelope is now; no gateway in this release)"
                .to_string(),
            from_queues(&s, id, g.max).await?,
        ),
    };
    if hops.is_empty() {
        return Err(CliError::NotFound {
            what: format!("envelope {id:?}"),
            why: format!("nothing about it in {described}"),
        });
    }
    let out = match g.output {
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
            format!("source: {described}\n{}", t.render())
        }
        f => render::structured(&serde_json::json!({"source": described, "hops": hops}), f),
    };
    Ok((out, Exit::Ok))
}

async fn get_json(url: &str, token: Option<&str>) -> Result<Option<Value>> {
    let client = asya_transport::http_client::client::<Empty<Bytes>>()
        .map_err(|e| CliError::Failed(format!("TLS roots: {e}")))?;
    let mut req = hyper::Request::get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| CliError::Usage(format!("gateway URL {url:?}: {e}")))?;
    let unreachable = |e: &dyn std::fmt::Display| CliError::Unavailable {
        what: format!("the gateway at {url}"),
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
            CliError::Failed(format!("the gateway's answer for {url} is not JSON: {e}"))
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
        let Some(rec) = get_json(&format!("{base}/envelopes/{next}"), token).await? else {
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
