//! Each reconcile scenario against the in-memory [`Fake`]: what is written, in which order,
//! which events and status come of it, and when the actor is looked at again.

use std::sync::Arc;
use std::time::Duration;

use asya_api::config::ClusterConfig;
use asya_api::flavor::FlavorDef;
use asya_api::{AsyncActor, Flavor};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::fake::{Broker, Fake, Stored, key};
use super::plan::{self, Next};
use super::{FINALIZER, Reconciler};
use crate::model::ObjectKind;

fn actor(spec: Value) -> AsyncActor {
    serde_json::from_value(json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": "a", "namespace": "n", "uid": "uid-1", "generation": 1},
        "spec": spec
    }))
    .expect("actor fixture")
}

fn plain() -> Value {
    json!({"image": "py:3.12", "handler": "m.f"})
}

fn manual(replicas: i32) -> Value {
    json!({"image": "py:3.12", "handler": "m.f", "scaling": {"enabled": false}, "replicas": replicas})
}

fn reconciler() -> Reconciler<Fake> {
    Reconciler::new(Fake::default(), Arc::new(ClusterConfig::default()))
}

/// One reconcile, then the actor as the API server would hand it to the next: with the
/// status written and the finalizer added.
async fn step(r: &Reconciler<Fake>, a: &mut AsyncActor) -> Next {
    let next = r.reconcile(a).await.expect("reconcile");
    let w = r.cluster.world();
    if w.log.iter().any(|l| l == "add finalizer") && !plan::has_finalizer(a) {
        a.metadata
            .finalizers
            .get_or_insert_default()
            .push(FINALIZER.into());
    }
    a.status = w.status.clone();
    next
}

fn phase(a: &AsyncActor) -> &str {
    a.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn message(a: &AsyncActor) -> &str {
    a.status
        .as_ref()
        .and_then(|s| s.message.as_deref())
        .unwrap_or_default()
}

/// Index of the first log line starting with `prefix` (panics when there is none).
fn at(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {log:#?}"))
}

fn has(log: &[String], prefix: &str) -> bool {
    log.iter().any(|l| l.starts_with(prefix))
}

fn pod(name: &str, ready: bool, runtime_state: Value, injected: bool) -> Arc<Pod> {
    let sidecar = json!({"name": "asya-sidecar", "image": "s", "restartPolicy": "Always"});
    let annotations = if injected {
        json!({"asya.sh/injected": "s"})
    } else {
        json!({})
    };
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "n",
                     "labels": {"asya.sh/inject": "true", "asya.sh/actor": "a"},
                     "annotations": annotations},
        "spec": {"initContainers": if injected { json!([sidecar]) } else { json!([]) },
                 "containers": [{"name": "asya-runtime", "image": "py:3.12"}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                   "containerStatuses": [{"name": "asya-runtime", "ready": ready, "restartCount": 4,
                                          "image": "py:3.12", "imageID": "", "state": runtime_state}]}
    }))
    .expect("pod fixture");
    Arc::new(p)
}

fn running() -> Value {
    json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
}

#[tokio::test]
async fn a_new_actor_gets_its_finalizer_queues_objects_and_status_in_one_reconcile() {
    let r = reconciler();
    let mut a = actor(plain());
    let next = step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert_eq!(log[0], "add finalizer", "{log:#?}");
    // End queues first, then the actor's; announced once.
    assert!(at(&log, "create queue asya-n-x-sink") < at(&log, "create queue asya-n-a"));
    assert!(has(&log, "create queue asya-n-x-sump"));
    // Credentials, ServiceAccount, workload, then KEDA's objects; then one event saying what
    // was made and the phase it led to (issue 38: not four), and the status.
    let order = [
        "apply Secret n/",
        "apply ServiceAccount n/asya-a",
        "apply Deployment n/a",
        "claim replicas Deployment n/a 0",
        "apply ScaledObject n/a",
        "event Normal Provisioned: queue asya-n-a created on rabbitmq; Deployment a created; \
         KEDA ScaledObject a created; phase none -> Napping: scaled to zero; waiting for messages",
        "status Napping",
    ];
    let idx: Vec<usize> = order.iter().map(|p| at(&log, p)).collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{log:#?}");
    // The other event is the namespace's, once for all its actors.
    let events: Vec<_> = log.iter().filter(|l| l.starts_with("event ")).collect();
    assert_eq!(events.len(), 2, "{log:#?}");
    assert!(events[0].starts_with("event Normal BrokerCredentialIssued: "));
    // Who holds each name comes from the caches: no read before an apply, the creations are
    // conditioned instead (issue 38). The namespace's first actor also makes what its actors
    // share: end queues' claims, the broker identity's Secret (and its event), the reads of
    // the legacy and platform-copied credentials.
    let requests = std::mem::take(&mut r.cluster.world().requests);
    assert_eq!(
        requests,
        [
            "patch AsyncActor",
            "create QueueClaim",
            "create QueueClaim",
            "create QueueClaim",
            "get Secret n/asya-broker-rabbitmq",
            "apply Secret n/asya-broker-rabbitmq",
            "create Event",
            "apply ServiceAccount n/asya-a",
            "apply Deployment n/a",
            "apply Deployment n/a replicas",
            "apply ScaledObject n/a",
            "get Secret n/asya-transport-rabbitmq",
            "get Secret n/rabbitmq-secret",
            "create Event",
            "patch AsyncActor status",
        ],
        "{requests:#?}"
    );
    {
        let w = r.cluster.world();
        for k in [
            key(ObjectKind::ServiceAccount, "n", "asya-a"),
            key(ObjectKind::Deployment, "n", "a"),
            key(ObjectKind::ScaledObject, "n", "a"),
        ] {
            assert!(w.unforced.contains(&k), "created without force: {k:?}");
        }
    }
    // RabbitMQ's trigger uses the transport's ClusterTriggerAuthentication: no KEDA
    // credential (TriggerAuthentication, asya-transport-rabbitmq) in the actor's namespace.
    assert!(!has(&log, "apply TriggerAuthentication"), "{log:#?}");
    assert!(!has(&log, "apply Secret n/asya-transport-"), "{log:#?}");
    // Created at its minimum (0): nothing to run until messages come.
    let d = r.cluster.world().objects[&key(ObjectKind::Deployment, "n", "a")].clone();
    assert_eq!(d.replicas(), Some(0));
    assert!(d.managed);
    assert!(
        d.body["metadata"]["annotations"][crate::apply_skip::APPLIED_HASH].is_string(),
        "the applied hash rides on the object"
    );
    assert_eq!(phase(&a), "Napping");
    let s = a.status.as_ref().unwrap();
    assert_eq!(s.scaling_mode.as_deref(), Some("KEDA"));
    assert_eq!(s.workload_kind.as_deref(), Some("Deployment"));
    assert_eq!(s.queue_identifier.as_deref(), Some("asya-n-a"));
    assert_eq!(next, Next::After(plan::periodic("n/a", false)));

    // The next reconcile of an unchanged actor writes nothing at all, and reads nothing.
    let again = step(&r, &mut a).await;
    assert_eq!(r.cluster.take_log(), Vec::<String>::new());
    assert_eq!(r.cluster.world().requests, Vec::<String>::new());
    assert_eq!(again, next);

    // Any further actor of the namespace: 8 requests (its finalizer, its queue's claim, three
    // applies and the replica handoff, one event, one status write), and here a read of the
    // broker identity's Secret, whose permissions do not name it yet (in a burst one write
    // covers the actors the cache holds by then: docs/benchmarks.md).
    let mut b = actor(plain());
    b.metadata.name = Some("b".into());
    b.metadata.uid = Some("uid-2".into());
    step(&r, &mut b).await;
    let requests = std::mem::take(&mut r.cluster.world().requests);
    assert_eq!(
        requests,
        [
            "patch AsyncActor",
            "create QueueClaim",
            "get Secret n/asya-broker-rabbitmq",
            "apply ServiceAccount n/asya-b",
            "apply Deployment n/b",
            "apply Deployment n/b replicas",
            "apply ScaledObject n/b",
            "create Event",
            "patch AsyncActor status",
        ],
        "{requests:#?}"
    );
}

#[tokio::test]
async fn replicas_are_handed_to_keda_before_the_apply_stops_setting_them_and_taken_back() {
    let r = reconciler();
    let mut a = actor(manual(3));
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert_eq!(
        a.status.as_ref().unwrap().scaling_mode.as_deref(),
        Some("Manual")
    );
    assert!(!has(&log, "claim replicas"), "{log:#?}");
    // A new actor without scaling: nothing of KEDA's to keep, and nothing there to delete
    // (it is read first: only an object of the actor's is deleted).
    assert!(!has(&log, "delete ScaledObject n/a"), "{log:#?}");
    assert!(!has(&log, "event Normal ScaledObjectDeleted"));
    let replicas = |r: &Reconciler<Fake>| {
        r.cluster.world().objects[&key(ObjectKind::Deployment, "n", "a")].replicas()
    };
    assert_eq!(replicas(&r), Some(3));

    // To KEDA: the handoff manager claims the 3 replicas before our apply leaves them out.
    a.spec = serde_json::from_value(plain()).unwrap();
    a.metadata.generation = Some(2);
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        at(&log, "claim replicas Deployment n/a 3") < at(&log, "apply Deployment n/a"),
        "{log:#?}"
    );
    assert_eq!(replicas(&r), Some(3), "a busy actor is not scaled in");
    assert!(has(&log, "apply ScaledObject n/a"));
    assert!(has(&log, "event Normal ScaledObjectCreated"));
    assert_eq!(
        a.status.as_ref().unwrap().scaling_mode.as_deref(),
        Some("KEDA")
    );

    // And back: the ScaledObject goes, the fixed count is set again.
    a.spec = serde_json::from_value(manual(2)).unwrap();
    a.metadata.generation = Some(3);
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(has(&log, "delete ScaledObject n/a"));
    // RabbitMQ actors have no TriggerAuthentication of their own (KEDA reads through the
    // ClusterTriggerAuthentication), and cleanup deletes only what exists.
    assert!(!has(&log, "delete TriggerAuthentication"));
    assert!(has(
        &log,
        "event Normal ScaledObjectDeleted: scaling disabled: ScaledObject removed, 2 fixed replica(s)"
    ));
    assert!(!has(&log, "claim replicas"));
    assert_eq!(replicas(&r), Some(2));
    let w = r.cluster.world();
    assert!(
        !w.objects
            .contains_key(&key(ObjectKind::ScaledObject, "n", "a"))
    );
}

#[tokio::test]
async fn an_actor_whose_flavor_is_missing_waits_and_looks_again_soon() {
    let r = reconciler();
    let mut a = actor(json!({"image": "py:3.12", "handler": "m.f", "flavors": ["gpu"]}));
    let next = step(&r, &mut a).await;
    assert_eq!(next, Next::After(Duration::from_secs(10)));
    assert_eq!(phase(&a), "Waiting");
    assert_eq!(message(&a), "waiting for flavors: gpu");
    let log = r.cluster.take_log();
    assert!(
        !has(&log, "create queue") && !has(&log, "apply "),
        "{log:#?}"
    );
    assert!(has(
        &log,
        "event Warning Waiting: phase none -> Waiting: waiting for flavors: gpu"
    ));

    // Once the flavor exists the actor goes ahead.
    let flavor: Flavor = serde_json::from_value(json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "Flavor",
        "metadata": {"name": "gpu"}, "spec": {"nodeSelector": {"gpu": "t4"}}
    }))
    .unwrap();
    r.cluster
        .world()
        .catalog
        .insert(FlavorDef::from_flavor(&flavor));
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(has(&log, "apply Deployment n/a"));
    assert_ne!(phase(&a), "Waiting");
    assert_eq!(a.status.as_ref().unwrap().resolved_flavors, ["gpu"]);
}

#[tokio::test]
async fn a_crash_loop_is_a_runtime_error_and_with_a_ready_pod_degraded() {
    let r = reconciler();
    let mut a = actor(manual(2));
    step(&r, &mut a).await;
    r.cluster.take_log();
    let crash = json!({"waiting": {"reason": "CrashLoopBackOff"}});
    r.cluster.world().pods = vec![pod("a-1", false, crash.clone(), true)];
    step(&r, &mut a).await;
    assert_eq!(phase(&a), "RuntimeError");
    assert_eq!(
        message(&a),
        "1 pod(s) failing: container asya-runtime: CrashLoopBackOff"
    );
    let log = r.cluster.take_log();
    assert!(
        has(
            &log,
            "event Warning RuntimeError: phase Creating -> RuntimeError"
        ),
        "{log:#?}"
    );
    assert!(!has(&log, "delete Pod"), "an injected pod is not replaced");

    r.cluster.world().pods = vec![
        pod("a-1", false, crash, true),
        pod("a-2", true, running(), true),
    ];
    step(&r, &mut a).await;
    assert_eq!(phase(&a), "Degraded");
    assert_eq!(a.status.as_ref().unwrap().failing_replicas, Some(1));
    assert_eq!(a.status.as_ref().unwrap().ready_replicas, Some(1));
}

#[tokio::test]
async fn a_deleted_actor_is_cleaned_up_and_then_its_finalizer_goes() {
    let r = reconciler();
    let mut a = actor(plain());
    step(&r, &mut a).await;
    r.cluster.take_log();
    r.cluster.world().delay_queues = (1..=6).map(|i| format!("asya-n-a-delay-{i}")).collect();
    a.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let next = step(&r, &mut a).await;
    assert_eq!(next, Next::AwaitChange);
    let log = r.cluster.take_log();
    let order = [
        "status Terminating",
        "delete queue asya-n-a",
        "delete Deployment n/a",
        "delete ScaledObject n/a",
        "event Normal QueueDeleted: queue asya-n-a deleted, with its retry delay queues asya-n-a-delay-1, asya-n-a-delay-2, asya-n-a-delay-3, asya-n-a-delay-4 and 2 more",
        "remove finalizer",
    ];
    let idx: Vec<usize> = order.iter().map(|p| at(&log, p)).collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{log:#?}");
    // Only what exists is deleted: the actor never had a StatefulSet.
    assert!(!has(&log, "delete StatefulSet"), "{log:#?}");
    assert!(
        has(
            &log,
            "event Normal Terminating: phase Napping -> Terminating: deleting the queue and owned objects"
        ),
        "{log:#?}"
    );
    {
        let w = r.cluster.world();
        assert!(
            w.end_queue_candidates
                .contains(&("rabbitmq".to_string(), "n".to_string()))
        );
        assert!(!w.queues.contains_key("asya-n-a"));
        assert!(
            w.queues.contains_key("asya-n-x-sink"),
            "end queues outlive the actor"
        );
    }

    // Deleted once our finalizer is gone: nothing more to do.
    a.metadata.finalizers = Some(vec![]);
    assert_eq!(step(&r, &mut a).await, Next::AwaitChange);
    assert_eq!(r.cluster.take_log(), Vec::<String>::new());
}

/// A reconciled actor, then deleted `ago` seconds before now.
async fn deleted(r: &Reconciler<Fake>, spec: Value, ago: i64) -> AsyncActor {
    let mut a = actor(spec);
    step(r, &mut a).await;
    r.cluster.take_log();
    let at =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ago);
    a.metadata.deletion_timestamp = Some(Time(at));
    a
}

#[tokio::test]
async fn a_queue_that_cannot_be_deleted_keeps_the_finalizer_within_the_bound() {
    let r = reconciler();
    let a = deleted(&r, plain(), 0).await;
    r.cluster.world().broker = Broker::Unavailable;
    let next = r.reconcile(&a).await.expect("cleanup waits");
    let Next::After(wait) = next else {
        panic!("tries again: {next:?}")
    };
    assert!(wait >= Duration::from_secs(1) && wait <= plan::CLEANUP_GIVE_UP_AFTER);
    let log = r.cluster.take_log();
    assert!(
        has(
            &log,
            "event Warning QueueDeleteFailed: deleting queue asya-n-a: transport unavailable: connection refused; retrying in "
        ),
        "{log:#?}"
    );
    assert!(!has(&log, "remove finalizer") && !has(&log, "delete Deployment"));

    // Near the bound, the next attempt comes no later than the bound.
    let a = deleted(&r, plain(), 29).await;
    r.cluster.world().broker = Broker::Rejected;
    let next = r.reconcile(&a).await.expect("cleanup waits");
    assert!(
        matches!(next, Next::After(d) if d <= Duration::from_secs(1)),
        "{next:?}"
    );
    assert!(!has(&r.cluster.take_log(), "remove finalizer"));
}

#[tokio::test]
async fn a_broker_down_past_the_bound_is_given_up_on_and_the_actor_released() {
    let r = reconciler();
    let a = deleted(&r, plain(), 31).await;
    r.cluster.world().broker = Broker::Unavailable;
    assert_eq!(r.reconcile(&a).await.expect("released"), Next::AwaitChange);
    let log = r.cluster.take_log();
    let order = [
        "status Terminating",
        "delete Deployment n/a",
        "delete ScaledObject n/a",
        "event Warning CleanupIncomplete: gave up after 30s: queue asya-n-a on rabbitmq (with its retry delay queues, if any) left behind, delete it by hand: transport unavailable: connection refused; deleted Deployment/StatefulSet a, ScaledObject a",
        "remove finalizer",
    ];
    let idx: Vec<usize> = order.iter().map(|p| at(&log, p)).collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{log:#?}");
    let announced = log
        .iter()
        .filter(|l| l.starts_with("event Normal Terminating"))
        .count();
    assert_eq!(announced, 1, "the phase is announced once: {log:#?}");
    let w = r.cluster.world();
    let st = w.status.as_ref().expect("status written");
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == "CleanupIncomplete")
        .expect("condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "QueueLeftBehind")
    );
    assert!(
        c.message.contains("queue asya-n-a on rabbitmq"),
        "{}",
        c.message
    );
    assert!(
        w.queues.contains_key("asya-n-a"),
        "the queue is left behind"
    );
}

#[tokio::test]
async fn skip_cleanup_releases_the_actor_at_once_and_says_what_is_left() {
    let r = reconciler();
    let mut a = deleted(&r, plain(), 0).await;
    a.metadata.annotations = Some(
        [(
            asya_api::labels::SKIP_CLEANUP.to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    // The broker is not even asked: down or not, the actor goes.
    r.cluster.world().broker = Broker::Unavailable;
    assert_eq!(r.reconcile(&a).await.expect("released"), Next::AwaitChange);
    let log = r.cluster.take_log();
    assert_eq!(
        log,
        [
            "event Warning CleanupSkipped: asya.sh/skip-cleanup=\"true\": released without cleanup; left behind: queue asya-n-a on rabbitmq (with its retry delay queues, if any) and, for the garbage collector through their owner references, Deployment/StatefulSet a, ScaledObject a, TriggerAuthentication a-trigger-auth",
            "remove finalizer",
        ],
        "{log:#?}"
    );
    assert!(r.cluster.world().queues.contains_key("asya-n-a"));
}

#[tokio::test]
async fn cleanup_does_not_need_the_flavors_to_resolve() {
    // Admitted with a flavor; the flavor is then edited into a conflict with another one.
    let r = reconciler();
    let flavor = |name: &str, spec: Value| -> Flavor {
        serde_json::from_value(json!({
            "apiVersion": "asya.sh/v1alpha1", "kind": "Flavor",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    };
    let scaling = |min: i32| json!({"scaling": {"minReplicaCount": min}});
    for f in [
        flavor("fl-one", scaling(1)),
        flavor("fl-two", json!({"nodeSelector": {"gpu": "t4"}})),
    ] {
        r.cluster.world().catalog.insert(FlavorDef::from_flavor(&f));
    }
    let own = json!({"policies": {"default": {"maxAttempts": 5}}});
    let mut spec = plain();
    spec["flavors"] = json!(["fl-one", "fl-two"]);
    spec["resiliency"] = own.clone();
    let a = deleted(&r, spec, 0).await;
    assert_eq!(
        a.status.as_ref().unwrap().resolved_flavors,
        ["fl-one", "fl-two"],
        "{:?}",
        a.status
    );
    r.cluster
        .world()
        .catalog
        .insert(FlavorDef::from_flavor(&flavor("fl-two", scaling(2))));
    let catalog = r.cluster.world().catalog.clone();
    let review = asya_api::review::review_typed(&a, &catalog, &r.config);
    assert!(!review.errors.is_empty(), "the flavors conflict now");
    assert_eq!(
        r.reconcile(&a).await.expect("cleaned up"),
        Next::AwaitChange
    );
    let log = r.cluster.take_log();
    assert!(
        has(&log, "delete queue asya-n-a") && has(&log, "remove finalizer"),
        "{log:#?}"
    );
    let w = r.cluster.world();
    let used = w
        .deleted_with
        .last()
        .cloned()
        .flatten()
        .expect("retry policies given");
    assert_eq!(serde_json::to_value(used).unwrap(), own);
}

/// A Deployment someone else created under the actor's name.
fn foreign_deployment() -> Stored {
    Stored {
        body: json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "a", "namespace": "n", "uid": "their-uid",
                         "labels": {"team": "other"},
                         "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]},
            "spec": {"replicas": 5, "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}),
        generation: 7,
        managed: false,
        ready: 5,
    }
}

#[tokio::test]
async fn a_foreign_object_with_our_name_is_left_alone_and_named_in_a_condition() {
    // Changed by issue 26 (finding 6): the controller used to apply over such a Deployment
    // with force and take it over. Now it reads the name's holder first and leaves it be.
    let r = reconciler();
    let k = key(ObjectKind::Deployment, "n", "a");
    r.cluster
        .world()
        .objects
        .insert(k.clone(), foreign_deployment());
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(!has(&log, "apply Deployment n/a"), "{log:#?}");
    assert!(!has(&log, "claim replicas"), "{log:#?}");
    // Nor is it handed to KEDA: a ScaledObject targets the workload by name.
    assert!(!has(&log, "apply ScaledObject"), "{log:#?}");
    let note = "Deployment n/a exists and is not this actor's (written by kubectl-create); left untouched: delete or rename it, or rename the actor";
    assert!(
        has(&log, &format!("event Warning NameConflict: {note}")),
        "{log:#?}"
    );
    {
        let w = r.cluster.world();
        let d = &w.objects[&k];
        assert!(!d.managed);
        assert_eq!(d.replicas(), Some(5));
        assert_eq!(
            d.body["spec"]["template"]["spec"]["containers"][0]["name"],
            "web"
        );
    }
    let st = a.status.as_ref().expect("status");
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == "NameConflict")
        .expect("NameConflict condition");
    assert_eq!((c.status.as_str(), c.message.as_str()), ("True", note));
    let w = st
        .conditions
        .iter()
        .find(|c| c.type_ == "WorkloadReady")
        .unwrap();
    assert_eq!((w.status.as_str(), w.message.as_str()), ("False", note));
    let sc = st.conditions.iter().find(|c| c.type_ == "ScalingReady");
    let sc = sc.expect("ScalingReady");
    assert_eq!(
        (sc.status.as_str(), sc.message.as_str()),
        ("False", "not applied: Deployment n/a is not this actor's")
    );

    // Deleting the actor leaves it too, and says so.
    a.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    assert_eq!(step(&r, &mut a).await, Next::AwaitChange);
    let log = r.cluster.take_log();
    assert!(!has(&log, "delete Deployment"), "{log:#?}");
    assert!(
        has(&log, "event Warning NameConflict: Deployment n/a"),
        "{log:#?}"
    );
    assert!(has(&log, "remove finalizer"));
    assert!(r.cluster.world().objects.contains_key(&k), "it survives");

    // Once its holder removes it, a new actor of that name creates its own, unforced.
    let r = reconciler();
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let w = r.cluster.world();
    assert!(w.objects[&k].managed);
    assert!(w.unforced.contains(&k), "a creation is not forced");
    assert!(
        w.status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.type_ != "NameConflict")
    );
}

#[tokio::test]
async fn an_object_of_ours_the_caches_miss_is_found_by_the_refused_creation_and_updated() {
    // Ours by its owner reference, without our label (so no cache holds it): the creation,
    // conditioned on no object existing, is refused; its holder is read, and it is applied
    // with force over that very object (its uid).
    let r = reconciler();
    let k = key(ObjectKind::Deployment, "n", "a");
    r.cluster.world().objects.insert(
        k.clone(),
        Stored {
            body: json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "a", "namespace": "n", "uid": "d-1",
                    "ownerReferences": [{"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                                         "name": "a", "uid": "uid-1", "controller": true}]},
                "spec": {"replicas": 2}}),
            generation: 3,
            managed: false,
            ready: 0,
        },
    );
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        at(&log, "create refused Deployment n/a") < at(&log, "apply Deployment n/a"),
        "{log:#?}"
    );
    let requests = r.cluster.world().requests.clone();
    let get = requests
        .iter()
        .position(|q| q == "get Deployment n/a")
        .expect("its holder read after the refusal");
    assert_eq!(requests[get - 1], "apply Deployment n/a", "{requests:#?}");
    let w = r.cluster.world();
    assert!(!w.unforced.contains(&k), "applied with force");
    assert_eq!(
        w.objects[&k].body["metadata"]["uid"], "d-1",
        "the same object"
    );
    assert!(w.objects[&k].managed);
}

#[tokio::test]
async fn a_foreign_service_account_stops_the_workload_and_our_own_objects_are_forced() {
    let r = reconciler();
    let sa = key(ObjectKind::ServiceAccount, "n", "asya-a");
    r.cluster.world().objects.insert(
        sa.clone(),
        Stored {
            body: json!({"metadata": {"name": "asya-a", "namespace": "n",
                "labels": {"app.kubernetes.io/managed-by": "asya-queue-provisioner"}}}),
            generation: 1,
            managed: true,
            ready: 0,
        },
    );
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    // Our label without the owner reference: not the actor's; its pods would run as it.
    assert!(!has(&log, "apply ServiceAccount"), "{log:#?}");
    assert!(!has(&log, "apply Deployment"), "{log:#?}");
    assert!(has(
        &log,
        "event Warning NameConflict: ServiceAccount n/asya-a"
    ));
    assert_eq!(phase(&a), "Degraded");
    assert!(
        message(&a).starts_with("workload: ServiceAccount n/asya-a exists and is not this actor's"),
        "{}",
        message(&a)
    );

    // Gone: everything is created; a later change to our own object is applied with force.
    r.cluster.world().objects.remove(&sa);
    step(&r, &mut a).await;
    a.spec = serde_json::from_value(json!({"image": "py:3.13", "handler": "m.f"})).unwrap();
    a.metadata.generation = Some(2);
    r.cluster.world().unforced.clear();
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(has(&log, "apply Deployment n/a"), "{log:#?}");
    let w = r.cluster.world();
    assert!(!w.unforced.contains(&key(ObjectKind::Deployment, "n", "a")));
}

#[tokio::test]
async fn a_broker_failure_is_a_transport_error_retried_as_the_error_says() {
    let r = reconciler();
    let mut a = actor(plain());
    r.cluster.world().broker = Broker::Unavailable;
    // Backoff 2 s, but a broker that is down is not asked again within 5 s.
    assert_eq!(step(&r, &mut a).await, Next::After(Duration::from_secs(5)));
    assert_eq!(phase(&a), "TransportError");
    assert_eq!(
        a.status.as_ref().unwrap().transport_status.as_deref(),
        Some("Unavailable")
    );
    let log = r.cluster.take_log();
    assert!(!has(&log, "apply "), "no objects without a queue: {log:#?}");
    r.cluster.world().broker = Broker::Cooldown;
    assert_eq!(step(&r, &mut a).await, Next::After(Duration::from_secs(65)));
    r.cluster.world().broker = Broker::Rejected;
    step(&r, &mut a).await;
    assert_eq!(
        a.status.as_ref().unwrap().transport_status.as_deref(),
        Some("Rejected")
    );
}

#[tokio::test]
async fn a_queue_deleted_behind_our_back_is_recreated_and_announced_as_such() {
    let r = reconciler();
    let mut a = actor(plain());
    step(&r, &mut a).await;
    r.cluster.take_log();
    r.cluster.world().queues.remove("asya-n-a");
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(has(&log, "create queue asya-n-a"), "{log:#?}");
    assert!(has(
        &log,
        "event Warning QueueRecreated: queue asya-n-a had disappeared from rabbitmq; recreated"
    ));
}

#[tokio::test]
async fn pods_without_the_sidecar_are_replaced_only_once_injection_works() {
    let r = reconciler();
    let mut a = actor(manual(1));
    step(&r, &mut a).await;
    r.cluster.take_log();
    {
        let mut w = r.cluster.world();
        w.pods = vec![pod("bare", true, running(), false)];
        w.injection_works = false;
    }
    assert_eq!(step(&r, &mut a).await, Next::After(Duration::from_secs(10)));
    let log = r.cluster.take_log();
    assert!(has(
        &log,
        "event Warning PodWithoutSidecar: pod bare carries no asya-sidecar and injection still fails"
    ));
    assert!(!has(&log, "delete Pod"));

    r.cluster.world().injection_works = true;
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        at(&log, "delete Pod n/bare")
            < at(&log, "event Warning PodWithoutSidecarReplaced: pod bare"),
        "{log:#?}"
    );
}

/// A pod injected under the other identity mode (by a webhook replica of the previous
/// release during an upgrade) waits forever on a Secret this mode never writes: deleted, with
/// its uid, and said so; one stuck on the Secret this mode does write is waited for.
#[tokio::test]
async fn pods_stuck_on_the_other_identity_modes_secret_are_replaced() {
    let r = reconciler();
    let mut a = actor(manual(1));
    step(&r, &mut a).await;
    r.cluster.take_log();
    let stuck = |name: &str, secret: &str| -> Arc<Pod> {
        let mut p = (*pod(name, false, running(), true)).clone();
        p.metadata.uid = Some(format!("uid-{name}"));
        let v = json!({
            "spec": {"initContainers": [{"name": "asya-sidecar", "image": "s", "restartPolicy": "Always",
                "env": [{"name": "ASYA_RABBITMQ_PASSWORD",
                         "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}}]}],
                     "containers": [{"name": "asya-runtime", "image": "py:3.12"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [{"name": "asya-sidecar",
                "ready": false, "restartCount": 0, "image": "s", "imageID": "",
                "state": {"waiting": {"reason": "CreateContainerConfigError"}}}]}});
        let extra: Pod = serde_json::from_value(v).expect("pod fixture");
        p.spec = extra.spec;
        p.status = extra.status;
        Arc::new(p)
    };
    // The default configuration gives each namespace its own identity (asya-broker-rabbitmq).
    r.cluster.world().pods = vec![
        stuck("old", "rabbitmq-admin"),
        stuck("new", "asya-broker-rabbitmq"),
    ];
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        at(&log, "delete Pod n/old")
            < at(
                &log,
                "event Warning PodWithStaleCredentialsReplaced: pod old cannot start: its \
                 asya-sidecar reads ASYA_RABBITMQ_PASSWORD from Secret rabbitmq-admin"
            ),
        "{log:#?}"
    );
    assert!(!has(&log, "delete Pod n/new"), "{log:#?}");
}

/// A new workload's replica handoff and its ScaledObject wait only for the workload: sent
/// together (the fake's handoff answers only once the ScaledObject was sent, so in turn
/// they would never finish), both done, and a failure of one recorded as when in turn.
#[tokio::test]
async fn the_handoff_and_the_scaled_object_are_sent_together_and_fail_alone() {
    let together = Duration::from_secs(5);
    let r = reconciler();
    r.cluster.world().handoff_waits_for = Some(ObjectKind::ScaledObject);
    let mut a = actor(plain());
    tokio::time::timeout(together, step(&r, &mut a))
        .await
        .expect("the handoff and the ScaledObject were sent in turn");
    let log = r.cluster.take_log();
    for done in [
        "apply Deployment n/a",
        "claim replicas Deployment n/a 0",
        "apply ScaledObject n/a",
    ] {
        assert!(has(&log, done), "{done}: {log:#?}");
    }
    assert!(at(&log, "apply Deployment n/a") < at(&log, "apply ScaledObject n/a"));
    assert_eq!(phase(&a), "Napping", "{log:#?}");

    // The ScaledObject refused: the handoff still done, the failure KEDA's alone.
    let r = reconciler();
    {
        let mut w = r.cluster.world();
        w.handoff_waits_for = Some(ObjectKind::ScaledObject);
        w.refuse.insert(ObjectKind::ScaledObject);
    }
    let mut a = actor(plain());
    tokio::time::timeout(together, step(&r, &mut a))
        .await
        .expect("the handoff and the ScaledObject were sent in turn");
    let log = r.cluster.take_log();
    assert!(has(&log, "claim replicas Deployment n/a 0"), "{log:#?}");
    assert!(has(&log, "event Warning ScaledObjectFailed: "), "{log:#?}");
    assert_eq!(phase(&a), "Degraded");
    assert!(message(&a).starts_with("scaling: "), "{}", message(&a));
    assert!(!has(&log, "event Warning WorkloadFailed"), "{log:#?}");
    let d = r.cluster.world().objects[&key(ObjectKind::Deployment, "n", "a")].clone();
    assert_eq!(d.replicas(), Some(0));
}

#[tokio::test]
async fn a_refused_workload_is_degraded_announced_and_retried_with_backoff() {
    let r = reconciler();
    r.cluster.world().refuse.insert(ObjectKind::Deployment);
    let mut a = actor(manual(1));
    assert_eq!(step(&r, &mut a).await, Next::After(Duration::from_secs(2)));
    assert_eq!(phase(&a), "Degraded");
    assert!(message(&a).starts_with("workload: "), "{}", message(&a));
    assert!(has(&r.cluster.take_log(), "event Warning WorkloadFailed: "));
    assert_eq!(step(&r, &mut a).await, Next::After(Duration::from_secs(4)));
}

#[tokio::test]
async fn without_keda_a_scaled_actor_says_so_and_a_manual_one_is_fine() {
    let r = reconciler();
    r.cluster.world().keda = false;
    let mut a = actor(plain());
    step(&r, &mut a).await;
    assert_eq!(phase(&a), "Degraded");
    assert_eq!(
        message(&a),
        "scaling: KEDA's CRDs are not installed in the cluster"
    );
    let log = r.cluster.take_log();
    assert!(!has(&log, "apply ScaledObject") && !has(&log, "delete ScaledObject"));

    let r = reconciler();
    r.cluster.world().keda = false;
    let mut a = actor(manual(1));
    step(&r, &mut a).await;
    assert_eq!(phase(&a), "Creating");
}

#[tokio::test]
async fn an_actor_that_switches_to_a_stateful_set_loses_its_deployment() {
    let r = reconciler();
    let mut a = actor(manual(1));
    step(&r, &mut a).await;
    r.cluster.take_log();
    a.spec = serde_json::from_value(json!({"scaling": {"enabled": false},
        "workload": {"kind": "StatefulSet", "template": {"spec": {"containers": [
            {"name": "asya-runtime", "image": "py", "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}]}}}}))
    .unwrap();
    a.metadata.generation = Some(2);
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        at(&log, "delete Deployment n/a") < at(&log, "apply StatefulSet n/a"),
        "{log:#?}"
    );
    assert!(
        !has(&log, "event Normal WorkloadCreated"),
        "not a new actor"
    );
    assert_eq!(
        a.status.as_ref().unwrap().workload_kind.as_deref(),
        Some("StatefulSet")
    );
    let w = r.cluster.world();
    assert!(
        !w.objects
            .contains_key(&key(ObjectKind::Deployment, "n", "a"))
    );
    assert!(
        w.objects
            .contains_key(&key(ObjectKind::StatefulSet, "n", "a"))
    );
}

#[tokio::test]
async fn an_actor_in_an_excluded_namespace_gets_nothing_but_a_condition_and_one_event() {
    let cfg = ClusterConfig {
        excluded_namespaces: vec!["kube-system".into(), "n".into()],
        ..ClusterConfig::default()
    };
    let r = Reconciler::new(super::fake::Fake::default(), Arc::new(cfg));
    let mut a = actor(plain());
    assert_eq!(step(&r, &mut a).await, Next::AwaitChange);
    let log = r.cluster.take_log();
    assert_eq!(
        log.len(),
        2,
        "only an event and the status, no finalizer, queue or object: {log:#?}"
    );
    assert!(log[0].starts_with("event Warning NamespaceExcluded: namespace n is excluded"));
    assert_eq!(log[1], "status Degraded");
    assert!(!plan::has_finalizer(&a));
    {
        let w = r.cluster.world();
        assert!(w.objects.is_empty() && w.queues.is_empty());
    }
    let c = &a.status.as_ref().unwrap().conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("Reconciled", "False", "NamespaceExcluded")
    );
    assert!(message(&a).contains("webhook.excludeNamespaces"));
    // The next reconcile says nothing new.
    assert_eq!(step(&r, &mut a).await, Next::AwaitChange);
    assert!(r.cluster.take_log().is_empty());
}

#[tokio::test]
async fn an_actor_whose_flavor_config_map_is_past_the_bounds_says_why_in_a_condition() {
    let r = reconciler();
    let mut cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "big", "namespace": "n", "labels": {"asya.sh/flavor": "big-env"}},
        "data": {"flavor.yaml": "env: []\n# padding\n"}
    }))
    .expect("config map fixture");
    let mut gate = asya_api::flavor::FlavorMapGate::new(asya_api::config::FlavorLimits {
        max_bytes: 8,
        ..Default::default()
    });
    gate.applied(&mut cm);
    let def = FlavorDef::from_config_map(&cm).expect("a flavor");
    r.cluster.world().catalog.insert(def);
    let mut a = actor(json!({"image": "py:3.12", "handler": "m.f", "flavors": ["big-env"]}));
    step(&r, &mut a).await;
    assert_eq!(phase(&a), "Degraded");
    let st = a.status.as_ref().expect("status");
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == "FlavorsResolved")
        .expect("FlavorsResolved");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "FlavorUnusable")
    );
    assert!(
        c.message.contains("ConfigMap n/big is unusable: flavor.yaml is 18 bytes, over the limit of 8 (flavorLimits.maxBytes"),
        "{}",
        c.message
    );
    assert!(
        message(&a).contains("flavorLimits.maxBytes"),
        "{}",
        message(&a)
    );
    assert!(r.cluster.world().objects.is_empty(), "nothing rendered");
}

fn stored(body: Value, managed: bool) -> Stored {
    Stored {
        body,
        generation: 1,
        managed,
        ready: 0,
    }
}

fn sqs_reconciler(config: &str) -> Reconciler<Fake> {
    let cfg = ClusterConfig::from_yaml(&format!(
        "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {config}\n"
    ))
    .expect("config parses");
    Reconciler::new(Fake::default(), Arc::new(cfg))
}

fn condition<'a>(
    a: &'a AsyncActor,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    a.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no condition {type_} in {:?}", a.status))
}

#[tokio::test]
async fn an_upgrade_removes_the_old_per_namespace_keda_credential_once_the_scaled_object_moved() {
    let r = reconciler();
    {
        let mut w = r.cluster.world();
        let managed = json!({"app.kubernetes.io/managed-by": "asya-queue-provisioner"});
        w.objects.insert(
            key(ObjectKind::TriggerAuthentication, "n", "a-trigger-auth"),
            stored(
                json!({"metadata": {"name": "a-trigger-auth", "labels": managed,
                    "ownerReferences": [{"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
                                         "name": "a", "uid": "uid-1"}]}}),
                true,
            ),
        );
        w.objects.insert(
            key(ObjectKind::Secret, "n", "asya-transport-rabbitmq"),
            stored(
                json!({"metadata": {"name": "asya-transport-rabbitmq", "labels": managed}}),
                true,
            ),
        );
    }
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    let so = at(&log, "apply ScaledObject n/a");
    assert!(
        so < at(&log, "delete TriggerAuthentication n/a-trigger-auth"),
        "{log:#?}"
    );
    assert!(
        so < at(&log, "delete Secret n/asya-transport-rabbitmq"),
        "{log:#?}"
    );
    let w = r.cluster.world();
    assert_eq!(
        w.objects[&key(ObjectKind::ScaledObject, "n", "a")].body["spec"]["triggers"][0]["authenticationRef"],
        json!({"name": "asya-rabbitmq", "kind": "ClusterTriggerAuthentication"})
    );
    assert!(
        !w.objects
            .contains_key(&key(ObjectKind::Secret, "n", "asya-transport-rabbitmq"))
    );
}

#[tokio::test]
async fn a_same_named_secret_we_did_not_create_survives_the_upgrade_cleanup() {
    let r = reconciler();
    r.cluster.world().objects.insert(
        key(ObjectKind::Secret, "n", "asya-transport-rabbitmq"),
        stored(
            json!({"metadata": {"name": "asya-transport-rabbitmq"}}),
            false,
        ),
    );
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(!has(&log, "delete Secret"), "{log:#?}");
    assert!(r.cluster.world().objects.contains_key(&key(
        ObjectKind::Secret,
        "n",
        "asya-transport-rabbitmq"
    )));
    // Asked once per process, not on every reconcile.
    step(&r, &mut a).await;
    assert!(!has(&r.cluster.take_log(), "delete Secret"));
}

#[tokio::test]
async fn sqs_without_shared_keys_nor_a_role_says_so_and_copies_nothing() {
    let r = sqs_reconciler("{region: us-east-1, credentialsSecretRef: {name: sqs-credentials}}");
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        !has(&log, "apply Secret"),
        "no static keys in the namespace: {log:#?}"
    );
    assert!(
        !has(&log, "event Warning SharedStaticCredentials"),
        "{log:#?}"
    );
    let ta = r.cluster.world().objects
        [&key(ObjectKind::TriggerAuthentication, "n", "a-trigger-auth")]
        .body["spec"]
        .clone();
    assert_eq!(
        ta,
        json!({"podIdentity": {"provider": "aws", "identityOwner": "workload"}})
    );
    let c = condition(&a, crate::status::COND_TRANSPORT);
    assert_eq!(c.status, "False");
    assert_eq!(c.reason, "NeitherShareStaticCredentialsNorRoleArn");
    assert!(
        c.message.contains("shareStaticCredentials")
            && c.message.contains("actorServiceAccount.roleArn"),
        "{}",
        c.message
    );
    assert_eq!(phase(&a), "TransportError", "{}", message(&a));
}

#[tokio::test]
async fn keys_no_longer_shared_leave_the_namespace_but_not_a_secret_we_did_not_create() {
    let r = sqs_reconciler("{region: us-east-1, credentialsSecretRef: {name: sqs-credentials}}");
    {
        let mut w = r.cluster.world();
        let managed = json!({"app.kubernetes.io/managed-by": "asya-queue-provisioner"});
        w.objects.insert(
            key(ObjectKind::Secret, "n", "asya-transport-sqs"),
            stored(
                json!({"metadata": {"name": "asya-transport-sqs", "labels": managed}}),
                true,
            ),
        );
        w.objects.insert(
            key(ObjectKind::Secret, "n", "sqs-credentials"),
            stored(json!({"metadata": {"name": "sqs-credentials"}}), false),
        );
    }
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(has(&log, "delete Secret n/asya-transport-sqs"), "{log:#?}");
    assert!(!has(&log, "delete Secret n/sqs-credentials"), "{log:#?}");
    let w = r.cluster.world();
    assert!(
        !w.objects
            .contains_key(&key(ObjectKind::Secret, "n", "asya-transport-sqs"))
    );
    assert!(
        w.objects
            .contains_key(&key(ObjectKind::Secret, "n", "sqs-credentials"))
    );
}

#[tokio::test]
async fn sqs_with_a_role_pattern_needs_no_keys() {
    let cfg = ClusterConfig::from_yaml(
        "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {region: us-east-1, credentialsSecretRef: {name: sqs-credentials}}\nserviceAccount: {actorRoleArn: 'arn:aws:iam::1:role/{namespace}-{actor}'}\n",
    )
    .unwrap();
    let r = Reconciler::new(Fake::default(), Arc::new(cfg));
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(!has(&log, "apply Secret"), "{log:#?}");
    assert_eq!(condition(&a, crate::status::COND_TRANSPORT).status, "True");
}

#[tokio::test]
async fn sqs_shared_keys_are_copied_and_announced_once_per_actor() {
    let r = sqs_reconciler(
        "{region: us-east-1, credentialsSecretRef: {name: sqs-credentials}, shareStaticCredentials: true}",
    );
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(has(&log, "apply Secret n/sqs-credentials"), "{log:#?}");
    assert!(has(&log, "apply Secret n/asya-transport-sqs"), "{log:#?}");
    assert!(
        has(
            &log,
            "event Warning SharedStaticCredentials: transports.sqs.config.shareStaticCredentials is true"
        ),
        "{log:#?}"
    );
    assert_eq!(condition(&a, crate::status::COND_TRANSPORT).status, "True");
    step(&r, &mut a).await;
    assert!(
        !has(
            &r.cluster.take_log(),
            "event Warning SharedStaticCredentials"
        ),
        "not on every reconcile"
    );
}

#[tokio::test]
async fn the_old_keda_credential_stays_while_the_scaled_object_could_not_move() {
    let r = reconciler();
    {
        let mut w = r.cluster.world();
        let managed = json!({"app.kubernetes.io/managed-by": "asya-queue-provisioner"});
        w.objects.insert(
            key(ObjectKind::TriggerAuthentication, "n", "a-trigger-auth"),
            stored(
                json!({"metadata": {"name": "a-trigger-auth", "labels": managed}}),
                true,
            ),
        );
        w.refuse.insert(ObjectKind::ScaledObject);
    }
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    // KEDA still reads through the old one: never left without credentials.
    assert!(!has(&log, "delete TriggerAuthentication"), "{log:#?}");
    assert!(r.cluster.world().objects.contains_key(&key(
        ObjectKind::TriggerAuthentication,
        "n",
        "a-trigger-auth"
    )));
}

#[tokio::test]
async fn an_actor_says_when_keda_cannot_read_its_depth() {
    let r = reconciler();
    r.cluster.world().keda_identity_problem =
        Some("transports.rabbitmq.config.managementPort is not set".into());
    let mut a = actor(plain());
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    // The ScaledObject is applied all the same: it works as soon as the identity is there.
    assert!(has(&log, "apply ScaledObject n/a"), "{log:#?}");
    let c = condition(&a, crate::status::COND_SCALING);
    assert_eq!(c.status, "False", "{c:?}");
    assert!(c.message.contains("managementPort"), "{}", c.message);
    assert_eq!(phase(&a), "Degraded", "{}", message(&a));
}

#[tokio::test]
async fn a_key_secret_another_transport_shares_is_not_removed() {
    let cfg = ClusterConfig::from_yaml(
        "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {region: us-east-1, credentialsSecretRef: {name: sqs-credentials}, shareStaticCredentials: true}\n  private:\n    type: sqs\n    config: {region: us-east-1, credentialsSecretRef: {name: sqs-credentials}}\n",
    )
    .unwrap();
    let r = Reconciler::new(Fake::default(), Arc::new(cfg));
    let mut shared = actor(plain());
    step(&r, &mut shared).await;
    assert!(r.cluster.world().objects.contains_key(&key(
        ObjectKind::Secret,
        "n",
        "sqs-credentials"
    )));
    r.cluster.take_log();
    let mut private = actor(json!({"image": "py:3.12", "handler": "m.f", "transport": "private"}));
    private.metadata.name = Some("b".into());
    private.metadata.uid = Some("uid-2".into());
    step(&r, &mut private).await;
    let log = r.cluster.take_log();
    assert!(!has(&log, "delete Secret n/sqs-credentials"), "{log:#?}");
    assert!(r.cluster.world().objects.contains_key(&key(
        ObjectKind::Secret,
        "n",
        "sqs-credentials"
    )));
}

/// The queue `asya-n-a` recorded (tagged) as another actor's: namespace `n-a`'s actor `x`,
/// whose queue has the same name.
fn foreign_queue(r: &Reconciler<Fake>) {
    use crate::queue::owner::{QueueRecord, TAG_ACTOR, TAG_NAMESPACE};
    let mut w = r.cluster.world();
    w.queues
        .insert("asya-n-a".into(), crate::queue::QueueDepth::default());
    let tags = [(TAG_NAMESPACE, "n-a"), (TAG_ACTOR, "x")];
    w.queue_records.insert(
        "asya-n-a".into(),
        QueueRecord::Tags(
            tags.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
    );
}

#[tokio::test]
async fn a_queue_recorded_as_another_actors_is_not_adopted() {
    let r = reconciler();
    foreign_queue(&r);
    let mut a = actor(plain());
    // Retried with the actor's backoff, as a refusal of the broker is.
    let next = step(&r, &mut a).await;
    assert_eq!(next, Next::After(Duration::from_secs(5)));
    let log = r.cluster.take_log();
    let msg = "queue asya-n-a belongs to actor n-a/x (its tags asya.sh/namespace=\"n-a\", asya.sh/actor=\"x\"), not to actor n/a: not adopted, purged or deleted";
    assert!(
        has(&log, &format!("event Warning QueueNotOurs: {msg}")),
        "{log:#?}"
    );
    assert!(
        !has(&log, "apply "),
        "nothing runs on another's queue: {log:#?}"
    );
    assert_eq!(phase(&a), "TransportError");
    let c = a
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "TransportReady")
        .unwrap();
    assert_eq!(
        (c.reason.as_str(), c.message.as_str()),
        ("QueueNotOurs", msg)
    );
}

#[tokio::test]
async fn a_deleted_actor_leaves_a_queue_recorded_as_another_actors() {
    let r = reconciler();
    let mut a = actor(plain());
    step(&r, &mut a).await;
    // Claimed by another since (the platform team gave the name to namespace `n-a`'s actor
    // `x`, whose queue has the same name): the claim, not the broker's tags, decides.
    foreign_queue(&r);
    {
        let mut w = r.cluster.world();
        let c = super::fake::stored_claim("asya-n-a", "n-a", "uid-ns-n-a", "x");
        w.claims.insert("asya-n-a".into(), c);
    }
    r.cluster.take_log();
    a.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    assert_eq!(
        step(&r, &mut a).await,
        Next::AwaitChange,
        "released at once"
    );
    let log = r.cluster.take_log();
    assert!(!has(&log, "delete queue"), "{log:#?}");
    assert!(
        has(
            &log,
            "event Warning QueueNotOurs: queue asya-n-a is claimed by the queue of actor \"x\" of namespace \"n-a\""
        ),
        "{log:#?}"
    );
    assert!(
        r.cluster.world().claims.contains_key("asya-n-a"),
        "another's claim stays"
    );
    assert!(has(&log, "delete Deployment n/a") && has(&log, "remove finalizer"));
    assert!(r.cluster.world().queues.contains_key("asya-n-a"));
    let w = r.cluster.world();
    let c = w
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "CleanupIncomplete")
        .expect("condition");
    assert_eq!(c.reason, "QueueNotOurs");
}

/// docs/DESIGN.md §6.1: a scaled actor's queue comes with its wake queue (messages living its
/// cooldown) and its ScaledObject with the wake trigger, at no API request more; an actor
/// with fixed replicas, one opted out (`scaling.wake: false`), or a cluster with wake-up off,
/// gets neither.
#[tokio::test]
async fn a_scaled_actor_gets_its_wake_queue_and_trigger_unless_wake_up_is_off() {
    let triggers = |r: &Reconciler<Fake>| {
        let w = r.cluster.world();
        let so = &w.objects[&key(ObjectKind::ScaledObject, "n", "a")].body;
        so["spec"]["triggers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["metadata"]["queueName"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let r = reconciler();
    let mut a =
        actor(json!({"image": "py:3.12", "handler": "m.f", "scaling": {"cooldownPeriod": 45}}));
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert!(
        has(&log, "ensure wake queue asya-n-a_wake ttl 45s"),
        "{log:#?}"
    );
    assert!(
        !has(&log, "ensure wake queue asya-n-x-"),
        "end queues wake nobody"
    );
    assert_eq!(triggers(&r), ["asya-n-a", "asya-n-a_wake"]);

    let r = reconciler();
    let mut a = actor(manual(2));
    step(&r, &mut a).await;
    assert!(!has(&r.cluster.take_log(), "ensure wake queue"));

    let r = reconciler();
    let mut a = actor(
        json!({"image": "py:3.12", "handler": "m.f", "scaling": {"cooldownPeriod": 45, "wake": false}}),
    );
    step(&r, &mut a).await;
    assert!(!has(&r.cluster.take_log(), "ensure wake queue"));
    assert_eq!(triggers(&r), ["asya-n-a"]);

    let mut off = ClusterConfig::default();
    off.wake.enabled = false;
    let r = Reconciler::new(Fake::default(), Arc::new(off));
    let mut a = actor(plain());
    step(&r, &mut a).await;
    assert!(!has(&r.cluster.take_log(), "ensure wake queue"));
    assert_eq!(triggers(&r), ["asya-n-a"]);
}
