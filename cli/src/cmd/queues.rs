//! `asya queues [-A]`: per actor, queued and in flight, and its envelopes in x-sump.

use std::collections::BTreeMap;

use asya_api::naming;
use asya_api::types::AsyncActor;
use asya_transport::envelope;

use crate::args::Global;
use crate::broker::Broker;
use crate::cluster;
use crate::error::{Exit, Result};
use crate::failed::Failed;
use crate::render::{self, Format};
use crate::session::{self, Session};
use crate::views::{self, QueueRow};

pub async fn run(g: &Global, all: bool) -> Result<(String, Exit)> {
    let s = session::open(g).await?;
    let ns = s.cluster.namespace.clone();
    let actors = cluster::actors(&s.cluster.client, (!all).then_some(ns.as_str())).await?;
    let mut by_ns: BTreeMap<String, Vec<AsyncActor>> = BTreeMap::new();
    for a in actors {
        by_ns
            .entry(a.metadata.namespace.clone().unwrap_or_default())
            .or_default()
            .push(a);
    }
    let mut rows = Vec::new();
    let mut exit = Exit::Ok;
    for (ns, actors) in &by_ns {
        if !namespace_rows(&s, ns, actors, g.max, &mut rows).await {
            exit = Exit::Failed;
        }
    }
    let out = match g.output {
        Format::Table => {
            let mut t = views::queues_table(&rows);
            t.push_str(
                "QUEUED: asked of the broker now as the namespace's identity; IN-FLIGHT: SQS now, RabbitMQ from the \
                 actor's status (the provisioner's sample: unacknowledged counts need the management API); X-SUMP: \
                 the namespace's x-sump envelopes that failed at the actor.\n",
            );
            t
        }
        f => render::structured(&rows, f),
    };
    Ok((out, exit))
}

/// The rows of one namespace; false when its broker could not be asked (the rows then
/// carry the status's figures and the reason).
async fn namespace_rows(
    s: &Session,
    ns: &str,
    actors: &[AsyncActor],
    max: usize,
    rows: &mut Vec<QueueRow>,
) -> bool {
    let broker = match s.broker(ns).await {
        Ok(b) => b,
        Err(e) => {
            rows.extend(
                actors
                    .iter()
                    .map(|a| views::queue_row(a, Err(e.to_string()), None)),
            );
            return false;
        }
    };
    let sump = sump_by_actor(&broker, ns, max).await;
    for a in actors {
        let actor = a
            .spec
            .actor
            .clone()
            .or_else(|| a.metadata.name.clone())
            .unwrap_or_default();
        let live = broker
            .counts(&naming::actor_queue(ns, &actor))
            .await
            .map_err(|e| e.to_string());
        let in_sump = sump
            .as_ref()
            .ok()
            .map(|m| m.get(&actor).copied().unwrap_or(0));
        rows.push(views::queue_row(
            a,
            live.as_ref().map_err(Clone::clone),
            in_sump,
        ));
    }
    broker.close().await;
    true
}

/// x-sump envelopes per failed actor (browsed, every message left in place).
async fn sump_by_actor(broker: &Broker, ns: &str, max: usize) -> Result<BTreeMap<String, u64>> {
    let (held, _) = broker.browse(&naming::sump_queue(ns), max).await?;
    let mut m = BTreeMap::new();
    for h in &held {
        if let Ok(e) = envelope::parse(&h.body, None)
            && let Some(a) = Failed::of(&e, None).actor
        {
            *m.entry(a).or_insert(0) += 1;
        }
    }
    broker.give_back(held).await?;
    Ok(m)
}
