//! `asya send ACTOR [--route ...] [--payload JSON | -f FILE] [--wait]`.

use std::time::{Duration, Instant};

use asya_api::naming;
use asya_transport::envelope;
use tracing::Instrument;

use crate::args::{Global, SendArgs};
use crate::broker::Broker;
use crate::compose;
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
    let broker = s.broker(&ns).await?;
    let queue = naming::actor_queue(&ns, &a.actor);
    let span = tracing::info_span!("send", envelope_id = %id, actor = %a.actor);
    broker.publish(&queue, &body).instrument(span).await?;
    if !a.wait {
        broker.close().await;
        let out = match g.output {
            Format::Table => format!("{id}\n"),
            f => render::structured(&serde_json::json!({"id": id, "queue": queue}), f),
        };
        return Ok((out, Exit::Ok));
    }
    let outcome = wait(&broker, &ns, &id, timeout).await;
    broker.close().await;
    let (end, found) = outcome?;
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
            t.push('\n');
            t
        }
        f => render::structured(
            &serde_json::json!({"id": id, "outcome": end, "envelope": found}),
            f,
        ),
    };
    Ok((out, exit))
}

/// Looks into x-sink and x-sump (browsing, every message left in place) until the envelope
/// is in one of them.
pub async fn wait(
    broker: &Broker,
    ns: &str,
    id: &str,
    timeout: Duration,
) -> Result<(&'static str, Failed)> {
    let start = Instant::now();
    loop {
        for (end, queue) in [
            ("x-sink", naming::sink_queue(ns)),
            ("x-sump", naming::sump_queue(ns)),
        ] {
            let (held, _) = broker.browse(&queue, usize::MAX).await?;
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
