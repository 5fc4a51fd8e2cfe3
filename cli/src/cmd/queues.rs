//! `asya queues [-A]`: per actor, queued and in flight, and its envelopes in x-sump.

use std::collections::BTreeMap;

use asya_api::naming;
use asya_api::types::AsyncActor;
use asya_transport::envelope;

use crate::args::Global;
use crate::broker::Broker;
use crate::broker::s3::CrewStore;
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
    // Where the crew's error-end actor consumes x-sump, its store holds the failed ones.
    let sump = match s.crew_store(ns, crate::crew::End::Sump).await {
        Ok(Some(store)) => store_by_actor(&store, max).await,
        Ok(None) => sump_by_actor(&broker, ns, max).await,
        Err(e) => Err(e),
    };
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

/// Failed envelopes per actor in the crew's store.
async fn store_by_actor(store: &CrewStore, max: usize) -> Result<BTreeMap<String, u64>> {
    let (stored, _) = store.list(max).await?;
    Ok(count_by_actor(stored.iter().map(|s| s.body.as_slice())))
}

/// How many of `bodies` failed at each actor (anything not an envelope is not counted).
fn count_by_actor<'a>(bodies: impl Iterator<Item = &'a [u8]>) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for b in bodies {
        if let Ok(e) = envelope::parse(b, None)
            && let Some(a) = Failed::of(&e, None).actor
        {
            *m.entry(a).or_insert(0) += 1;
        }
    }
    m
}

/// x-sump envelopes per failed actor (browsed, every message left in place).
async fn sump_by_actor(broker: &Broker, ns: &str, max: usize) -> Result<BTreeMap<String, u64>> {
    let (held, _) = broker.browse(&naming::sump_queue(ns), max).await?;
    let m = count_by_actor(held.iter().map(|h| h.body.as_slice()));
    broker.give_back(held).await?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_failed_envelopes_by_the_actor_they_failed_at() {
        let b = |id: &str, actor: &str| {
            serde_json::to_vec(
                &serde_json::json!({"id": id, "route": {"actors": ["a", "b"], "current": 1},
                "headers": {"x-asya-error": {"actor": actor}}}),
            )
            .unwrap()
        };
        let bodies = [b("1", "b"), b("2", "b"), b("3", "a"), b"junk".to_vec()];
        let m = super::count_by_actor(bodies.iter().map(Vec::as_slice));
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            [("a".to_string(), 1), ("b".to_string(), 2)]
        );
    }
}
