//! `asya send ACTOR [--route ...] [--payload JSON | -f FILE] [--wait]`.

use std::time::{Duration, Instant};

use asya_api::naming;
use asya_transport::envelope;
use tracing::Instrument;

use crate::args::{Global, SendArgs};
use crate::broker::Broker;
use crate::broker::s3::CrewStore;
use crate::compose;
use crate::crew::End;
use crate::error::{CliError, Exit, Result};
use crate::failed::Failed;
use crate::render::{self, Format};
use crate::session;

/// How often `--wait` looks into x-sink and x-sump again.
const POLL: Duration = Duration::from_millis(500);

fn payload_text(a: &SendArgs) -> Result<String> {
    match (&a.payload, &a.file) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) if f.as_os_str() == "-" => std::io::read_to_string(std::io::stdin())
            .map_err(|e| CliError::Usage(format!("-f -: cannot read standard input: {e}"))),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| CliError::Usage(format!("-f {}: {e}", f.display()))),
        (None, None) => Ok("null".into()),
    }
}

pub async fn run(g: &Global, a: &SendArgs) -> Result<(String, Exit)> {
    let timeout = asya_api::duration::parse_duration(&a.timeout)
        .map_err(|e| CliError::Usage(format!("--timeout {:?}: {e}", a.timeout)))?;
    let id = uuid::Uuid::new_v4().to_string();
    let env = compose::envelope(
        id.clone(),
        &a.actor,
        &a.route,
        &payload_text(a)?,
        uuid::Uuid::new_v4().to_string(),
    )
    .map_err(|e| CliError::Usage(e.to_string()))?;
    let body = serde_json::to_vec(&env).map_err(|e| CliError::Failed(e.to_string()))?;
    let s = session::open(g).await?;
    let ns = s.cluster.namespace.clone();
    // Where the crew's end actors consume an end queue, its envelopes are in their store;
    // asked before sending, so a store the caller cannot read stops nothing half-done.
    let (sink_store, sump_store) = if a.wait {
        (
            s.crew_store(&ns, End::Sink).await?,
            s.crew_store(&ns, End::Sump).await?,
        )
    } else {
        (None, None)
    };
    let broker = s.broker(&ns).await?;
    let queue = naming::actor_queue(&ns, &a.actor);
    let span = tracing::info_span!("send", envelope_id = %id, actor = %a.actor);
    // The route's actors are woken first (docs/DESIGN.md §6.1), best effort.
    let wake: Vec<String> = asya_api::wake::wake_targets(&env.route.actors, 0, None)
        .into_iter()
        .filter_map(|a| asya_api::wake::wake_queue(&ns, a))
        .collect();
    broker.wake(&wake).await;
    broker.publish(&queue, &body).instrument(span).await?;
    if !a.wait {
        broker.close().await;
        let out = match g.output {
            Format::Table => format!("{id}\n"),
            f => render::structured(&serde_json::json!({"id": id, "queue": queue}), f),
        };
        return Ok((out, Exit::Ok));
    }
    let places = [
        (
            "x-sink",
            place(naming::sink_queue(&ns), sink_store.as_ref()),
        ),
        (
            "x-sump",
            place(naming::sump_queue(&ns), sump_store.as_ref()),
        ),
    ];
    let outcome = wait_at(&broker, &ns, &places, &id, timeout).await;
    broker.close().await;
    let (end, found) = outcome?;
    // Said when the crew's end actor had taken the envelope to its store.
    let stored_in = places.iter().find_map(|(e, p)| match p {
        Place::Store(st) if *e == end => Some(st.describe()),
        _ => None,
    });
    let exit = if end == "x-sink" {
        Exit::Ok
    } else {
        Exit::Failed
    };
    let out = match g.output {
        Format::Table => {
            let mut t = format!("{id}\n{end}");
            if end == "x-sump" {
                t.push_str(&format!(": {}", found.summary()));
            }
            if let Some(st) = &stored_in {
                t.push_str(&format!(" (in {st})"));
            }
            t.push('\n');
            t
        }
        f => render::structured(
            &serde_json::json!({"id": id, "outcome": end, "envelope": found, "stored_in": stored_in}),
            f,
        ),
    };
    Ok((out, exit))
}

/// Where `--wait` looks for one end's arrivals: the end queue itself (browsed, every message
/// left in place), or the crew's store when the crew's end actor consumes that queue.
pub enum Place<'a> {
    Queue(String),
    Store(&'a CrewStore),
}

fn place(queue: String, store: Option<&CrewStore>) -> Place<'_> {
    match store {
        Some(st) => Place::Store(st),
        None => Place::Queue(queue),
    }
}

/// Looks into x-sink and x-sump (the queues) until the envelope is in one of them.
pub async fn wait(
    broker: &Broker,
    ns: &str,
    id: &str,
    timeout: Duration,
) -> Result<(&'static str, Failed)> {
    let places = [
        ("x-sink", Place::Queue(naming::sink_queue(ns))),
        ("x-sump", Place::Queue(naming::sump_queue(ns))),
    ];
    wait_at(broker, ns, &places, id, timeout).await
}

/// Looks into each end's place until the envelope is in one of them.
pub async fn wait_at(
    broker: &Broker,
    ns: &str,
    places: &[(&'static str, Place<'_>)],
    id: &str,
    timeout: Duration,
) -> Result<(&'static str, Failed)> {
    let start = Instant::now();
    loop {
        for (end, place) in places {
            let found = match place {
                Place::Queue(queue) => {
                    let (held, _) = broker.browse(queue, usize::MAX).await?;
                    let found = held
                        .iter()
                        .filter_map(|m| {
                            envelope::parse(&m.body, None)
                                .ok()
                                .map(|e| (e, m.broker_time_ms))
                        })
                        .find(|(e, _)| e.id == id)
                        .map(|(e, t)| Failed::of(&e, t));
                    broker.give_back(held).await?;
                    found
                }
                Place::Store(store) => store.find(id).await?.and_then(|s| {
                    envelope::parse(&s.body, None)
                        .ok()
                        .filter(|e| e.id == id)
                        .map(|e| Failed::of(&e, s.modified_ms))
                }),
            };
            if let Some(f) = found {
                return Ok((end, f));
            }
        }
        if start.elapsed() >= timeout {
            return Err(CliError::Timeout {
                secs: timeout.as_secs(),
                what: format!("envelope {id} in x-sink or x-sump of namespace {ns}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}
