//! An in-memory [`Cluster`] for the reconcile's unit tests: an API server that stores what is
//! applied, caches that hold what carries the managed-by label, a broker of named queues,
//! and a log of every write in the order it was made.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use asya_api::flavor::FlavorCatalog;
use asya_api::types::Resiliency;
use asya_api::{AsyncActor, AsyncActorStatus, labels};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::broker_identity::permissions::Permissions;
use crate::model::{ObjectKind, WorkloadKind};
use crate::queue::owner::{self, QueueRecord};
use crate::queue::{QueueDepth, QueueError, QueueInfo, QueueSpec};
use crate::reconcile::ownership::Write;
use crate::reconcile::plan::EventSpec;
use crate::reconcile::{
    Answer, Brokers, Cached, Caches, Error, FINALIZER, NamespaceNow, Object, Platform, Writes,
};
use crate::render::TransportCredentials;
use crate::render::workload::MANAGED_BY;
use crate::state_identity::StateError;
use crate::status::WorkloadObs;
use asya_api::queue_claim::{QueueClaim, QueueClaimSpec};

/// The provisioner's own namespace in the fake.
pub const PLATFORM_NAMESPACE: &str = "asya-system";

/// How the broker answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    Up,
    Unavailable,
    Cooldown,
    Rejected,
}

/// One object as the fake API server stores it.
#[derive(Clone, Debug)]
pub struct Stored {
    pub body: Value,
    pub generation: i64,
    /// Whether the caches see it (they watch objects with the managed-by label).
    pub managed: bool,
    /// For workloads: readyReplicas.
    pub ready: i32,
}

impl Stored {
    pub fn replicas(&self) -> Option<i32> {
        self.body
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .map(|n| n as i32)
    }
}

pub type Key = (ObjectKind, String, String);

pub fn key(kind: ObjectKind, ns: &str, name: &str) -> Key {
    (kind, ns.to_string(), name.to_string())
}

pub struct World {
    pub catalog: FlavorCatalog,
    pub keda: bool,
    /// What the KEDA identity loop reports for every transport.
    pub keda_identity_problem: Option<String>,
    pub broker: Broker,
    pub objects: BTreeMap<Key, Stored>,
    pub pods: Vec<Arc<Pod>>,
    /// desiredReplicas of KEDA's HPA, by actor.
    pub hpa: BTreeMap<String, i32>,
    pub queues: BTreeMap<String, QueueDepth>,
    /// What the broker records of each queue's owner (SQS tags set at creation); a queue
    /// without an entry reads as [`QueueRecord::Unknown`].
    pub queue_records: BTreeMap<String, QueueRecord>,
    /// What deleting an actor's queue reports as its delay queues.
    pub delay_queues: Vec<String>,
    /// The retry policies each queue delete was given (they name the delay queues).
    pub deleted_with: Vec<Option<Resiliency>>,
    pub injection_works: bool,
    /// Kinds whose applies the API server refuses.
    pub refuse: BTreeSet<ObjectKind>,
    /// Objects applied without force (creations).
    pub unforced: BTreeSet<Key>,
    pub end_queue_candidates: BTreeSet<(String, String)>,
    /// Every write, in order: `apply Deployment n/a`, `event Warning QueueRecreated: …`.
    pub log: Vec<String>,
    /// Every request to the API server, reads included, refused ones too, in order.
    pub requests: Vec<String>,
    pub events: Vec<EventSpec>,
    pub status: Option<AsyncActorStatus>,
    /// The actor cache.
    pub actors: Vec<Arc<AsyncActor>>,
    /// Broker users: password and permissions.
    pub users: BTreeMap<String, (String, Permissions)>,
    /// The platform's Redis: users (password and rules), owner marks, reachable or not,
    /// and whether `default` is open.
    pub redis_users: BTreeMap<String, (String, Vec<String>)>,
    pub redis_owners: BTreeMap<String, String>,
    pub redis_up: bool,
    pub redis_default_open: bool,
    /// Platform passwords recorded as exposed, by transport.
    pub exposed: BTreeSet<(String, String)>,
    /// The platform's broker password (the transports' credentials).
    pub platform_password: String,
    /// QueueClaims as the API server stores them (the cache sees the same).
    pub claims: BTreeMap<String, QueueClaim>,
    /// Namespaces whose uid is not the default `uid-ns-{name}`; `None`: deleted.
    pub namespaces: BTreeMap<String, Option<String>>,
    /// Namespaces being deleted.
    pub terminating: BTreeSet<String>,
    /// The provisioner's own ConfigMaps' data, by name.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// ClusterTriggerAuthentications as applied, by name.
    pub cluster_trigger_authentications: BTreeMap<String, Value>,
    /// A claim another reconcile creates just before this one's creation of a claim of the
    /// same name (a race).
    pub claim_before_create: Option<QueueClaim>,
    /// Uids given to created claims.
    pub claim_serial: u32,
    /// The replica handoff answers only once an apply of this kind was requested: a
    /// reconcile that sent the two in turn would wait forever (the concurrency tests).
    pub handoff_waits_for: Option<ObjectKind>,
}

/// The uid the fake gives namespace `ns` unless [`World::namespaces`] says otherwise.
pub fn default_namespace_uid(ns: &str) -> String {
    format!("uid-ns-{ns}")
}

/// A stored claim of `queue` by (`ns`, `uid`, `actor`), with object uid `uid-qc-{queue}`.
pub fn stored_claim(queue: &str, ns: &str, uid: &str, actor: &str) -> QueueClaim {
    let mut c = QueueClaim::new(
        queue,
        QueueClaimSpec {
            namespace: ns.into(),
            namespace_uid: uid.into(),
            actor: actor.into(),
            transport: Some("rabbitmq".into()),
        },
    );
    c.metadata.uid = Some(format!("uid-qc-{queue}"));
    c
}

impl Default for World {
    fn default() -> Self {
        World {
            catalog: FlavorCatalog::new(),
            keda: true,
            keda_identity_problem: None,
            broker: Broker::Up,
            objects: BTreeMap::new(),
            pods: vec![],
            hpa: BTreeMap::new(),
            queues: BTreeMap::new(),
            queue_records: BTreeMap::new(),
            delay_queues: vec![],
            deleted_with: vec![],
            injection_works: true,
            refuse: BTreeSet::new(),
            unforced: BTreeSet::new(),
            end_queue_candidates: BTreeSet::new(),
            log: vec![],
            requests: vec![],
            events: vec![],
            status: None,
            actors: vec![],
            users: BTreeMap::new(),
            redis_users: BTreeMap::new(),
            redis_owners: BTreeMap::new(),
            redis_up: true,
            redis_default_open: false,
            exposed: BTreeSet::new(),
            platform_password: "pw".into(),
            claims: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            terminating: BTreeSet::new(),
            config_maps: BTreeMap::new(),
            cluster_trigger_authentications: BTreeMap::new(),
            claim_before_create: None,
            claim_serial: 0,
            handoff_waits_for: None,
        }
    }
}

#[derive(Default)]
pub struct Fake(Mutex<World>);

impl Fake {
    pub fn world(&self) -> MutexGuard<'_, World> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The log since the last call, emptied.
    pub fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.world().log)
    }

    /// Counts a request to the API server.
    fn request(&self, what: String) {
        self.world().requests.push(what);
    }

    fn broker(&self) -> Result<(), QueueError> {
        match self.world().broker {
            Broker::Up => Ok(()),
            Broker::Unavailable => Err(QueueError::Unavailable("connection refused".into())),
            Broker::Cooldown => Err(QueueError::RecreateCooldown("q".into())),
            Broker::Rejected => Err(QueueError::Rejected("access denied".into())),
        }
    }
}

fn conflict(what: &str) -> kube::Error {
    kube::Error::Api(Box::new(
        kube::core::Status::failure(what, "Conflict").with_code(409),
    ))
}

fn refused(what: &str) -> kube::Error {
    kube::Error::Api(Box::new(
        kube::core::Status::failure(&format!("{what} refused"), "Forbidden").with_code(403),
    ))
}

impl Caches for Fake {
    async fn caches_ready(&self) -> Result<(), Error> {
        Ok(())
    }

    fn catalog(&self) -> FlavorCatalog {
        self.world().catalog.clone()
    }

    fn keda_installed(&self) -> bool {
        self.world().keda
    }

    fn keda_identity_problem(&self, _transport: &str) -> Option<String> {
        self.world().keda_identity_problem.clone()
    }

    fn cached(&self, kind: ObjectKind, ns: &str, name: &str) -> Cached {
        let w = self.world();
        match kind {
            ObjectKind::Secret | ObjectKind::Pod => return Cached::NotCached,
            ObjectKind::ScaledObject | ObjectKind::TriggerAuthentication if !w.keda => {
                return Cached::NotCached;
            }
            _ => {}
        }
        match w.objects.get(&key(kind, ns, name)).filter(|s| s.managed) {
            Some(s) => {
                let mut meta: ObjectMeta =
                    serde_json::from_value(s.body["metadata"].clone()).unwrap_or_default();
                meta.generation = Some(s.generation);
                Cached::Present(Box::new(meta))
            }
            None => Cached::Missing,
        }
    }

    fn cached_workload(&self, kind: WorkloadKind, ns: &str, name: &str) -> Option<WorkloadObs> {
        let w = self.world();
        let s = w
            .objects
            .get(&key(kind.object(), ns, name))
            .filter(|s| s.managed)?;
        Some(WorkloadObs {
            replicas: s.replicas(),
            ready: s.ready,
            failure: None,
        })
    }

    fn scaled_object_cached(&self, ns: &str, name: &str) -> bool {
        let w = self.world();
        w.objects
            .get(&key(ObjectKind::ScaledObject, ns, name))
            .is_some_and(|s| s.managed)
    }

    fn pods(&self, ns: &str, actor: &str) -> Vec<Arc<Pod>> {
        self.world()
            .pods
            .iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && crate::watch::label(&p.metadata.labels, labels::ACTOR) == Some(actor)
            })
            .cloned()
            .collect()
    }

    fn hpa_desired(&self, _ns: &str, actor: &str) -> Option<i32> {
        self.world().hpa.get(actor).copied()
    }

    fn claim_cached(&self, name: &str) -> Option<QueueClaimSpec> {
        self.world().claims.get(name).map(|c| c.spec.clone())
    }

    fn actors_in(&self, ns: &str) -> Vec<Arc<AsyncActor>> {
        let w = self.world();
        w.actors
            .iter()
            .filter(|a| a.metadata.namespace.as_deref() == Some(ns))
            .cloned()
            .collect()
    }

    fn pods_in(&self, ns: &str) -> Vec<Arc<Pod>> {
        let w = self.world();
        let mine = |p: &&Arc<Pod>| p.metadata.namespace.as_deref() == Some(ns);
        w.pods.iter().filter(mine).cloned().collect()
    }

    fn platform_namespace(&self) -> &str {
        PLATFORM_NAMESPACE
    }
}

impl Brokers for Fake {
    async fn transport(&self, _transport: &str) -> Result<TransportCredentials, QueueError> {
        Ok(TransportCredentials {
            password: Some(self.world().platform_password.clone()),
            aws: Some(("AK".into(), "SK".into())),
        })
    }

    /// SQS transports (named `sqs…`) tag a queue at creation; RabbitMQ ones bind it to the
    /// namespace's exchange on every ensure (the binding goes with the exchange,
    /// [`Self::broker_identity_delete`]).
    async fn queue_ensure(&self, t: &str, spec: &QueueSpec) -> Result<QueueInfo, QueueError> {
        self.broker()?;
        let mut w = self.world();
        let created = !w.queues.contains_key(&spec.name);
        if created {
            w.queues.insert(spec.name.clone(), QueueDepth::default());
            w.log.push(format!("create queue {}", spec.name));
        }
        if let (Some(wake), Some(ttl)) = (spec.wake_queue(), spec.wake_ttl) {
            w.log
                .push(format!("ensure wake queue {wake} ttl {}s", ttl.as_secs()));
        }
        if t.starts_with("sqs") {
            let tags = [
                (owner::TAG_NAMESPACE, &spec.namespace),
                (owner::TAG_ACTOR, &spec.actor),
            ];
            let tags = tags.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            w.queue_records
                .insert(spec.name.clone(), QueueRecord::Tags(tags.collect()));
        } else {
            let bound = match w.queue_records.remove(&spec.name) {
                Some(QueueRecord::TenantBindings(mut b)) if !created => {
                    b.insert(spec.namespace.clone());
                    b
                }
                _ => BTreeSet::from([spec.namespace.clone()]),
            };
            w.queue_records
                .insert(spec.name.clone(), QueueRecord::TenantBindings(bound));
        }
        Ok(QueueInfo {
            url: format!("amqp://rabbitmq:5672/%2F/{}", spec.name),
            identifier: spec.name.clone(),
            created,
        })
    }

    async fn queue_exists(&self, _t: &str, queue: &str) -> Result<bool, QueueError> {
        self.broker()?;
        Ok(self.world().queues.contains_key(queue))
    }

    async fn queue_depth(&self, _t: &str, queue: &str) -> Result<Option<QueueDepth>, QueueError> {
        self.broker()?;
        Ok(self.world().queues.get(queue).copied())
    }

    async fn queue_delete(
        &self,
        _t: &str,
        queue: &str,
        resiliency: Option<&Resiliency>,
    ) -> Result<Vec<String>, QueueError> {
        self.broker()?;
        let mut w = self.world();
        w.deleted_with.push(resiliency.cloned());
        w.queues.remove(queue);
        w.log.push(format!("delete queue {queue}"));
        Ok(w.delay_queues.clone())
    }

    async fn queue_record(&self, _t: &str, queue: &str) -> Result<Option<QueueRecord>, QueueError> {
        self.broker()?;
        let w = self.world();
        Ok(w.queues.contains_key(queue).then(|| {
            w.queue_records
                .get(queue)
                .cloned()
                .unwrap_or(QueueRecord::Unknown)
        }))
    }

    fn end_queues_candidate(&self, transport: &str, ns: &str) {
        let mut w = self.world();
        w.end_queue_candidates.insert((transport.into(), ns.into()));
    }

    async fn broker_user_put(
        &self,
        _t: &str,
        user: &str,
        password: &str,
        permissions: &Permissions,
    ) -> Result<(), QueueError> {
        self.broker()?;
        let mut w = self.world();
        w.log.push(format!("put broker user {user}"));
        w.users
            .insert(user.into(), (password.into(), permissions.clone()));
        Ok(())
    }

    async fn state_user_put(&self, ns: &str, password: &str) -> Result<(), StateError> {
        let mut w = self.world();
        if !w.redis_up {
            return Err(StateError::Unavailable("redis down".into()));
        }
        let user = asya_api::state_proxy::redis_acl::username(ns);
        let rules = asya_api::state_proxy::redis_acl::rules(ns)
            .map_err(|e| StateError::Rejected(e.to_string()))?;
        w.log.push(format!("put redis user {user}"));
        w.redis_users.insert(user, (password.into(), rules));
        Ok(())
    }

    async fn state_user_delete(&self, ns: &str) -> Result<(), StateError> {
        let mut w = self.world();
        if !w.redis_up {
            return Err(StateError::Unavailable("redis down".into()));
        }
        let user = asya_api::state_proxy::redis_acl::username(ns);
        w.log.push(format!("delete redis user {user}"));
        w.redis_users.remove(&user);
        Ok(())
    }

    async fn state_owner_claim(&self, ns: &str, uid: &str) -> Result<Option<String>, StateError> {
        let mut w = self.world();
        if !w.redis_up {
            return Err(StateError::Unavailable("redis down".into()));
        }
        match w.redis_owners.get(ns) {
            Some(prev) => Ok(Some(prev.clone())),
            None => {
                w.log.push(format!("mark redis state {ns} as {uid}"));
                w.redis_owners.insert(ns.into(), uid.into());
                Ok(None)
            }
        }
    }

    async fn state_default_open(&self) -> Result<bool, StateError> {
        let w = self.world();
        if !w.redis_up {
            return Err(StateError::Unavailable("redis down".into()));
        }
        Ok(w.redis_default_open)
    }

    async fn broker_identity_delete(
        &self,
        _t: &str,
        ns: &str,
        user: &str,
    ) -> Result<(), QueueError> {
        self.broker()?;
        let mut w = self.world();
        w.log
            .push(format!("delete broker user {user} and exchange asya.{ns}"));
        w.users.remove(user);
        // The exchange's bindings go with it.
        for r in w.queue_records.values_mut() {
            if let QueueRecord::TenantBindings(b) = r {
                b.remove(ns);
            }
        }
        Ok(())
    }
}

impl Writes for Fake {
    async fn namespace_uid(&self, ns: &str) -> Result<Option<String>, kube::Error> {
        let w = self.world();
        Ok(match w.namespaces.get(ns) {
            Some(uid) => uid.clone(),
            None => Some(default_namespace_uid(ns)),
        })
    }

    async fn claim_get(&self, name: &str) -> Result<Option<QueueClaim>, kube::Error> {
        self.request(format!("get QueueClaim {name}"));
        Ok(self.world().claims.get(name).cloned())
    }

    async fn claim_create(&self, claim: &QueueClaim) -> Result<bool, kube::Error> {
        self.request("create QueueClaim".into());
        let mut w = self.world();
        let name = claim.metadata.name.clone().unwrap_or_default();
        if w.claim_before_create
            .as_ref()
            .is_some_and(|c| c.metadata.name.as_deref() == Some(name.as_str()))
            && let Some(first) = w.claim_before_create.take()
        {
            w.log.push(format!("create QueueClaim {name} (by another)"));
            w.claims.insert(name.clone(), first);
        }
        if w.claims.contains_key(&name) {
            return Ok(false);
        }
        w.claim_serial += 1;
        let mut stored = claim.clone();
        stored.metadata.uid = Some(format!("uid-qc-{name}-{}", w.claim_serial));
        w.log.push(format!(
            "create QueueClaim {name} for {}/{}",
            claim.spec.namespace, claim.spec.actor
        ));
        w.claims.insert(name, stored);
        Ok(true)
    }

    async fn claim_delete(&self, name: &str, uid: &str) -> Result<bool, kube::Error> {
        self.request(format!("delete QueueClaim {name}"));
        let mut w = self.world();
        let same = w
            .claims
            .get(name)
            .is_some_and(|c| c.metadata.uid.as_deref() == Some(uid));
        if !same {
            return Ok(false);
        }
        w.log.push(format!("delete QueueClaim {name}"));
        Ok(w.claims.remove(name).is_some())
    }

    async fn read_secret(&self, ns: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        self.request(format!("get Secret {ns}/{name}"));
        let mut w = self.world();
        w.log.push(format!("read Secret {ns}/{name}"));
        w.objects
            .get(&key(ObjectKind::Secret, ns, name))
            .map(|s| serde_json::from_value(s.body.clone()).map_err(kube::Error::SerdeError))
            .transpose()
    }

    async fn record_exposed(&self, transport: &str, password: &str) -> Result<(), kube::Error> {
        let mut w = self.world();
        w.log
            .push(format!("record exposed password of {transport}"));
        w.exposed.insert((transport.into(), password.into()));
        Ok(())
    }

    async fn exposed(&self, transport: &str, password: &str) -> Result<bool, kube::Error> {
        Ok(self
            .world()
            .exposed
            .contains(&(transport.to_string(), password.to_string())))
    }

    async fn apply(&self, ns: &str, obj: &Object, write: &Write) -> Result<Answer, kube::Error> {
        let mut w = self.world();
        let kind = obj.kind();
        let name = obj.name();
        w.requests.push(format!("apply {kind} {ns}/{name}"));
        let k = key(kind, ns, &name);
        let stored_uid = w.objects.get(&k).map(|s| {
            s.body
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        let exists = stored_uid.is_some();
        let stored_uid = stored_uid.flatten();
        match write {
            // A creation (resourceVersion precondition) refused: the name is held.
            Write::Create if exists => {
                w.log.push(format!("create refused {kind} {ns}/{name}"));
                return Err(conflict("the object has been modified"));
            }
            Write::Update { uid: Some(want) } if stored_uid.as_ref() != Some(want) => {
                w.log.push(format!("update refused {kind} {ns}/{name}"));
                // What the API server answers an apply naming another uid (conformance.rs).
                return Err(kube::Error::Api(Box::new(
                    kube::core::Status::failure("metadata.uid: field is immutable", "Invalid")
                        .with_code(422),
                )));
            }
            _ => {}
        }
        w.log.push(format!("apply {kind} {ns}/{name}"));
        if w.refuse.contains(&kind) {
            return Err(refused(kind.as_str()));
        }
        if *write == Write::Create {
            w.unforced.insert(k.clone());
        }
        let mut body = match obj {
            Object::Secret(o) => serde_json::to_value(o),
            Object::ServiceAccount(o) => serde_json::to_value(o),
            Object::Deployment(o) => serde_json::to_value(o),
            Object::StatefulSet(o) => serde_json::to_value(o),
            Object::ScaledObject(o) | Object::TriggerAuthentication(o) => serde_json::to_value(o),
        }
        .map_err(kube::Error::SerdeError)?;
        let managed = obj
            .meta()
            .labels
            .as_ref()
            .is_some_and(|l| l.get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1));
        let before = w.objects.get(&k).cloned();
        // The API server gives a created object its uid and keeps it.
        let uid = before
            .as_ref()
            .and_then(|b| b.body.pointer("/metadata/uid").cloned())
            .unwrap_or_else(|| format!("uid-{kind}-{name}").into());
        body["metadata"]["uid"] = uid;
        // Server-side apply keeps a field the apply leaves out while another manager (the
        // replica handoff) owns it; the fake keeps any replicas the apply leaves out.
        let kept = before.as_ref().and_then(Stored::replicas);
        if body.pointer("/spec/replicas").is_none()
            && let (Some(n), Some(spec)) = (kept, body.get_mut("spec"))
        {
            spec["replicas"] = n.into();
        }
        let generation = match &before {
            Some(b) if b.body["spec"] == body["spec"] => b.generation,
            Some(b) => b.generation + 1,
            None => 1,
        };
        let ready = before.as_ref().map_or(0, |b| b.ready);
        let stored = Stored {
            body,
            generation,
            managed,
            ready,
        };
        let workload =
            matches!(kind, ObjectKind::Deployment | ObjectKind::StatefulSet).then(|| WorkloadObs {
                replicas: stored.replicas().or(Some(1)),
                ready,
                failure: None,
            });
        w.objects.insert(k, stored);
        Ok(Answer {
            generation: Some(generation),
            workload,
        })
    }

    async fn replicas(
        &self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
    ) -> Result<Option<i32>, kube::Error> {
        self.request(format!("get {kind} {ns}/{name}"));
        let w = self.world();
        Ok(w.objects
            .get(&key(kind.object(), ns, name))
            .and_then(Stored::replicas))
    }

    async fn claim_replicas(
        &self,
        kind: WorkloadKind,
        ns: &str,
        name: &str,
        n: i32,
    ) -> Result<(), kube::Error> {
        self.request(format!("apply {kind} {ns}/{name} replicas"));
        let wait = self.world().handoff_waits_for;
        if let Some(other) = wait {
            let sent = format!("apply {other} ");
            while !self.world().requests.iter().any(|r| r.starts_with(&sent)) {
                tokio::task::yield_now().await;
            }
        }
        let mut w = self.world();
        w.log.push(format!("claim replicas {kind} {ns}/{name} {n}"));
        if let Some(s) = w.objects.get_mut(&key(kind.object(), ns, name)) {
            s.body["spec"]["replicas"] = n.into();
        }
        Ok(())
    }

    async fn metadata(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, kube::Error> {
        self.request(format!("get {kind} {ns}/{name}"));
        let w = self.world();
        w.objects
            .get(&key(kind, ns, name))
            .map(|s| serde_json::from_value(s.body["metadata"].clone()))
            .transpose()
            .map_err(kube::Error::SerdeError)
    }

    async fn delete(
        &self,
        kind: ObjectKind,
        ns: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<bool, kube::Error> {
        self.request(format!("delete {kind} {ns}/{name}"));
        let mut w = self.world();
        w.log.push(format!("delete {kind} {ns}/{name}"));
        let stored_uid = w
            .objects
            .get(&key(kind, ns, name))
            .and_then(|s| s.body.pointer("/metadata/uid").and_then(Value::as_str));
        // A precondition on another uid: the object stays, and it is "not deleted", as
        // `kube_cluster::delete_exact` answers the API server's 409.
        if let (Some(want), Some(have)) = (uid, stored_uid)
            && want != have
        {
            return Ok(false);
        }
        if kind == ObjectKind::Pod {
            let before = w.pods.len();
            w.pods.retain(|p| p.metadata.name.as_deref() != Some(name));
            return Ok(w.pods.len() < before);
        }
        Ok(w.objects.remove(&key(kind, ns, name)).is_some())
    }

    async fn delete_owned_secret(&self, ns: &str, name: &str) -> Result<bool, kube::Error> {
        self.request(format!("get Secret {ns}/{name}"));
        let mut w = self.world();
        let k = key(ObjectKind::Secret, ns, name);
        // The adapter's own rule, on the stored object's metadata.
        let ours = w.objects.get(&k).is_some_and(|s| {
            s.body
                .get("metadata")
                .and_then(|m| serde_json::from_value::<ObjectMeta>(m.clone()).ok())
                .is_some_and(|m| super::ownership::managed_by_us(&m))
        });
        if !ours {
            return Ok(false);
        }
        w.log.push(format!("delete Secret {ns}/{name}"));
        Ok(w.objects.remove(&k).is_some())
    }

    async fn injection_works(&self, _pod: &Pod) -> bool {
        self.request("create Pod (dry run)".into());
        self.world().injection_works
    }

    async fn event(&self, _actor: &AsyncActor, ev: EventSpec) {
        self.request("create Event".into());
        let mut w = self.world();
        let ty = if ev.warning { "Warning" } else { "Normal" };
        w.log
            .push(format!("event {ty} {}: {}", ev.reason.as_str(), ev.note));
        w.events.push(ev);
    }

    async fn patch_status(
        &self,
        _actor: &AsyncActor,
        status: &AsyncActorStatus,
    ) -> Result<(), kube::Error> {
        self.request("patch AsyncActor status".into());
        let mut w = self.world();
        w.log.push(format!(
            "status {}",
            status.phase.as_deref().unwrap_or_default()
        ));
        w.status = Some(status.clone());
        Ok(())
    }

    async fn add_finalizer(&self, actor: &AsyncActor) -> Result<AsyncActor, Error> {
        self.request("patch AsyncActor".into());
        self.world().log.push("add finalizer".into());
        let mut a = actor.clone();
        a.metadata
            .finalizers
            .get_or_insert_default()
            .push(FINALIZER.into());
        Ok(a)
    }

    async fn remove_finalizer(&self, _actor: &AsyncActor) -> Result<(), Error> {
        self.request("patch AsyncActor".into());
        self.world().log.push("remove finalizer".into());
        Ok(())
    }
}

impl Platform for Fake {
    async fn namespace_now(&self, ns: &str) -> Result<Option<NamespaceNow>, kube::Error> {
        self.request(format!("get Namespace {ns}"));
        let w = self.world();
        let uid = match w.namespaces.get(ns) {
            Some(uid) => uid.clone(),
            None => Some(default_namespace_uid(ns)),
        };
        Ok(uid.map(|uid| NamespaceNow {
            uid,
            terminating: w.terminating.contains(ns),
        }))
    }

    async fn own_config_map(
        &self,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
        self.request(format!("get ConfigMap {name}"));
        Ok(self.world().config_maps.get(name).cloned())
    }

    async fn own_config_map_apply(
        &self,
        name: &str,
        _manager: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<(), kube::Error> {
        self.request(format!("apply ConfigMap {name}"));
        let mut w = self.world();
        w.log.push(format!("apply ConfigMap {name}"));
        w.config_maps.insert(name.into(), data.clone());
        Ok(())
    }

    async fn cluster_trigger_authentication_apply(&self, cta: &Value) -> Result<(), kube::Error> {
        let name = cta
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.request(format!("apply ClusterTriggerAuthentication {name}"));
        let mut w = self.world();
        w.log
            .push(format!("apply ClusterTriggerAuthentication {name}"));
        w.cluster_trigger_authentications.insert(name, cta.clone());
        Ok(())
    }

    async fn cluster_trigger_authentication(
        &self,
        name: &str,
    ) -> Result<Option<Value>, kube::Error> {
        self.request(format!("get ClusterTriggerAuthentication {name}"));
        Ok(self
            .world()
            .cluster_trigger_authentications
            .get(name)
            .cloned())
    }
}
