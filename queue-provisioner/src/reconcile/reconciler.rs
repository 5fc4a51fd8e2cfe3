//! The reconcile's entry: what it works with ([`Reconciler`]), its error, and the dispatch
//! between the excluded namespace, the cleanup and a live actor's reconcile.

use std::sync::Arc;

use asya_api::AsyncActor;
use asya_api::config::ClusterConfig;

use crate::queue::QueueError;

use super::{Cluster, FINALIZER, FinalizerStep, Memory, Next, actor, cleanup, plan, write};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("transport: {0}")]
    Queue(#[from] QueueError),
    #[error("finalizer {FINALIZER}: {0}")]
    Finalizer(String),
    #[error("object has no namespace")]
    NoNamespace,
    /// A cache's watch ended (the process is shutting down).
    #[error("the {0} cache stopped")]
    Cache(&'static str),
}

impl Error {
    /// The `kind` label of the error metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Queue(_) => "transport",
            Error::Finalizer(_) => "finalizer",
            Error::NoNamespace => "invalid",
            Error::Cache(_) => "cache",
        }
    }
}

/// What a reconcile works with: the world, the cluster configuration, and what this process
/// remembers between reconciles.
pub struct Reconciler<C> {
    pub cluster: C,
    pub config: Arc<ClusterConfig>,
    pub memory: Memory,
    /// Per-actor gauges set from each status written (registered by the controller).
    pub gauges: crate::actor_gauges::ActorGauges,
}

impl<C: Cluster> Reconciler<C> {
    pub fn new(cluster: C, config: Arc<ClusterConfig>) -> Self {
        Reconciler {
            cluster,
            config,
            memory: Memory::default(),
            gauges: Default::default(),
        }
    }

    /// The same, exporting its per-actor gauges through `gauges`' registry.
    pub fn with_gauges(mut self, gauges: crate::actor_gauges::ActorGauges) -> Self {
        self.gauges = gauges;
        self
    }

    /// One reconcile: the finalizer's step, then cleanup or the actor's reconcile.
    pub async fn reconcile(&self, actor: &AsyncActor) -> Result<Next, Error> {
        actor
            .metadata
            .namespace
            .as_ref()
            .ok_or(Error::NoNamespace)?;
        self.cluster.caches_ready().await?;
        if let Some(why) = plan::namespace_excluded(actor, &self.config) {
            return self.excluded(actor, why).await;
        }
        match plan::finalizer_step(actor) {
            FinalizerStep::Done => Ok(Next::AwaitChange),
            // Removes the finalizer itself, unless it must try again.
            FinalizerStep::CleanUp => cleanup::run(self, actor).await,
            FinalizerStep::AddThenReconcile => {
                let actor = self.cluster.add_finalizer(actor).await?;
                actor::run(self, &actor).await
            }
            FinalizerStep::Reconcile => actor::run(self, actor).await,
        }
    }

    /// An actor in an excluded namespace: no finalizer, no queue, no object; its status and
    /// a Warning event say why (once). Looked at again only when it changes.
    async fn excluded(&self, actor: &AsyncActor, why: String) -> Result<Next, Error> {
        let prev = actor.status.clone().unwrap_or_default();
        let now = write::now();
        if let Some((status, event)) =
            plan::excluded_status(&prev, why, actor.metadata.generation, now)
        {
            self.cluster.event(actor, event).await;
            self.cluster.patch_status(actor, &status).await?;
        }
        Ok(Next::AwaitChange)
    }

    /// After a failed reconcile: the actor's next backoff (counted).
    pub fn backoff_after_error(&self, actor: &AsyncActor) -> std::time::Duration {
        self.memory.backoff(&actor_key(actor), true)
    }
}

/// `namespace/name`: the actor's key in [`Memory`]'s backoff and the spread of its requeues.
pub fn actor_key(a: &AsyncActor) -> String {
    use kube::ResourceExt;
    format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any())
}
