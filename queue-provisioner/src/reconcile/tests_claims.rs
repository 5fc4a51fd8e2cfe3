//! The claim step against the in-memory [`Fake`] (docs/DESIGN.md §9, "Queue names have one
//! owner"), as a tenant would try it: a namespace's leftover queues stay its own whatever
//! happens to its actors, its exchange or the namespace itself.

use std::sync::Arc;
use std::time::Duration;

use asya_api::AsyncActor;
use asya_api::config::ClusterConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::fake::{Fake, default_namespace_uid, stored_claim};
use super::plan::{self, Next};
use super::{FINALIZER, Reconciler};
use crate::queue::QueueDepth;
use crate::queue::owner::QueueRecord;

fn reconciler() -> Reconciler<Fake> {
    Reconciler::new(Fake::default(), Arc::new(ClusterConfig::default()))
}

fn actor_in(ns: &str, name: &str, annotations: Value) -> AsyncActor {
    serde_json::from_value(json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
                     "generation": 1, "annotations": annotations},
        "spec": {"image": "py:3.12", "handler": "m.f"}
    }))
    .expect("actor fixture")
}

fn plain(ns: &str, name: &str) -> AsyncActor {
    actor_in(ns, name, json!({}))
}

/// One reconcile of an actor the cache holds, as the API server hands it to the next.
async fn step(r: &Reconciler<Fake>, a: &mut AsyncActor) -> Next {
    {
        let mut w = r.cluster.world();
        let (ns, name) = (a.metadata.namespace.clone(), a.metadata.name.clone());
        w.actors
            .retain(|x| !(x.metadata.namespace == ns && x.metadata.name == name));
        w.actors.push(Arc::new(a.clone()));
    }
    let next = r.reconcile(a).await.expect("reconcile");
    let w = r.cluster.world();
    if !plan::has_finalizer(a) && a.metadata.deletion_timestamp.is_none() {
        a.metadata
            .finalizers
            .get_or_insert_default()
            .push(FINALIZER.into());
    }
    a.status = w.status.clone();
    next
}

/// Deletes the actor: its cleanup, then it leaves the cache.
async fn delete(r: &Reconciler<Fake>, a: &mut AsyncActor) {
    a.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    assert_eq!(step(r, a).await, Next::AwaitChange, "released");
    let (ns, name) = (a.metadata.namespace.clone(), a.metadata.name.clone());
    r.cluster
        .world()
        .actors
        .retain(|x| !(x.metadata.namespace == ns && x.metadata.name == name));
}

fn transport_condition(a: &AsyncActor) -> (String, String) {
    let c = a
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "TransportReady"))
        .expect("TransportReady condition");
    (c.reason.clone(), c.message.clone())
}

fn has(log: &[String], prefix: &str) -> bool {
    log.iter().any(|l| l.starts_with(prefix))
}

fn claim_of(r: &Reconciler<Fake>, queue: &str) -> Option<(String, String, String)> {
    let w = r.cluster.world();
    w.claims.get(queue).map(|c| {
        (
            c.spec.namespace.clone(),
            c.spec.namespace_uid.clone(),
            c.spec.actor.clone(),
        )
    })
}

/// Namespace `team-a` had actor `y`, which is gone: its end queues (results, failures)
/// stay, bound to no namespace exchange (`asya.team-a` went with the last actor).
async fn team_a_gone(r: &Reconciler<Fake>) {
    let mut y = plain("team-a", "y");
    step(r, &mut y).await;
    assert_eq!(
        claim_of(r, "asya-team-a-x-sink"),
        Some((
            "team-a".into(),
            default_namespace_uid("team-a"),
            "x-sink".into()
        ))
    );
    r.cluster.world().queues.insert(
        "asya-team-a-x-sink".into(),
        QueueDepth {
            queued: Some(3),
            processing: Some(0),
        },
    );
    delete(r, &mut y).await;
    let w = r.cluster.world();
    assert!(!w.queues.contains_key("asya-team-a-y"));
    assert!(
        !w.claims.contains_key("asya-team-a-y"),
        "released with its queue"
    );
    assert!(w.queues.contains_key("asya-team-a-x-sink"));
    assert_eq!(
        w.queue_records.get("asya-team-a-x-sink"),
        Some(&QueueRecord::TenantBindings(Default::default())),
        "the exchange went with the last actor"
    );
    assert!(
        w.claims.contains_key("asya-team-a-x-sink"),
        "kept with the queue"
    );
}

#[tokio::test]
async fn a_namespaces_end_queue_is_not_taken_by_an_actor_named_after_it_once_its_actors_are_gone() {
    let r = reconciler();
    team_a_gone(&r).await;
    let mut b = plain("team", "b");
    step(&r, &mut b).await;
    r.cluster.take_log();

    // `team` names an actor after team-a's results queue.
    let mut thief = plain("team", "a-x-sink");
    let next = step(&r, &mut thief).await;
    assert_eq!(next, Next::After(Duration::from_secs(5)));
    let log = r.cluster.take_log();
    let msg = format!(
        "queue asya-team-a-x-sink is claimed by the end queue x-sink of namespace \"team-a\" (namespace uid {}; QueueClaim asya-team-a-x-sink), not by actor team/a-x-sink: not adopted, purged or deleted. A queue keeps its owner while it exists, after its actor or namespace is deleted; the platform team releases it by deleting the queue on the broker and then the QueueClaim (kubectl delete queueclaim asya-team-a-x-sink)",
        default_namespace_uid("team-a")
    );
    assert!(
        has(&log, &format!("event Warning QueueNotOurs: {msg}")),
        "{log:#?}"
    );
    assert_eq!(
        transport_condition(&thief),
        ("QueueNotOurs".to_string(), msg)
    );
    assert!(!has(&log, "apply "), "nothing runs on it: {log:#?}");
    assert!(!has(&log, "create QueueClaim asya-team-a-x-sink"));
    assert_eq!(
        claim_of(&r, "asya-team-a-x-sink").map(|c| c.0),
        Some("team-a".into())
    );
    {
        let w = r.cluster.world();
        assert_eq!(
            w.queues["asya-team-a-x-sink"].queued,
            Some(3),
            "the results are still there"
        );
    }

    // Nor does `team`'s broker user get to read it by its name: the namespace's
    // permissions name only actors that hold their queue's claim.
    r.memory.forget_identity("rabbitmq", "team");
    step(&r, &mut b).await;
    let read = r.cluster.world().users["asya-ns-team"].1.read.clone();
    let read = regex::Regex::new(&read).unwrap();
    assert!(read.is_match("asya-team-b"), "{read}");
    assert!(!read.is_match("asya-team-a-x-sink"), "{read}");

    // Deleting the refused actor does not delete the queue either.
    r.cluster.take_log();
    delete(&r, &mut thief).await;
    let log = r.cluster.take_log();
    assert!(!has(&log, "delete queue asya-team-a-x-sink"), "{log:#?}");
    assert!(
        has(
            &log,
            "event Warning QueueNotOurs: queue asya-team-a-x-sink is claimed by the end queue x-sink of namespace \"team-a\""
        ),
        "{log:#?}"
    );
    assert!(r.cluster.world().queues.contains_key("asya-team-a-x-sink"));
}

#[tokio::test]
async fn a_namespace_created_again_does_not_get_its_predecessors_end_queues_and_says_why() {
    let r = reconciler();
    team_a_gone(&r).await;
    // Another team creates `team-a` again: same name, new uid.
    r.cluster
        .world()
        .namespaces
        .insert("team-a".into(), Some("uid-new".into()));
    r.cluster.take_log();
    let mut z = plain("team-a", "z");
    step(&r, &mut z).await;
    let log = r.cluster.take_log();
    let (reason, message) = transport_condition(&z);
    assert_eq!(reason, "QueueNotOurs");
    assert_eq!(
        message,
        format!(
            "queue asya-team-a-x-sink belongs to an earlier namespace team-a (uid {}), deleted since; this namespace team-a is uid uid-new: the leftover queue keeps its owner (QueueClaim asya-team-a-x-sink) and is not adopted, purged or deleted (an end queue of a deleted namespace is deleted once empty, or after endQueueRetention). The platform team releases it by deleting the queue on the broker and then the QueueClaim (kubectl delete queueclaim asya-team-a-x-sink), or gives it to this namespace: kubectl patch queueclaim asya-team-a-x-sink --type merge -p '{{\"spec\":{{\"namespaceUid\":\"uid-new\"}}}}'",
            default_namespace_uid("team-a")
        )
    );
    assert!(!has(&log, "create queue"), "{log:#?}");
    assert!(!has(&log, "put broker user"), "no identity: {log:#?}");
    assert!(!has(&log, "apply "), "{log:#?}");
    {
        let w = r.cluster.world();
        assert_eq!(w.queues["asya-team-a-x-sink"].queued, Some(3));
        // The sweep looks at the predecessor's end queues (deleted once empty, or after
        // the retention), as if it had seen that namespace go.
        assert!(
            w.end_queue_candidates
                .contains(&("rabbitmq".to_string(), "team-a".to_string()))
        );
    }

    // The platform team gives the results to the new namespace (its documented patch):
    // adopted, not created; the failures queue is released (queue and claim deleted) and
    // made afresh.
    {
        let mut w = r.cluster.world();
        w.claims
            .get_mut("asya-team-a-x-sink")
            .unwrap()
            .spec
            .namespace_uid = "uid-new".into();
        w.queues.remove("asya-team-a-x-sump");
        w.claims.remove("asya-team-a-x-sump");
    }
    step(&r, &mut z).await;
    let log = r.cluster.take_log();
    assert!(!has(&log, "create queue asya-team-a-x-sink"), "{log:#?}");
    assert!(
        has(
            &log,
            "create QueueClaim asya-team-a-x-sump for team-a/x-sump"
        ),
        "{log:#?}"
    );
    assert!(has(&log, "create queue asya-team-a-x-sump"), "{log:#?}");
    assert!(has(&log, "create queue asya-team-a-z"), "{log:#?}");
    assert_eq!(
        claim_of(&r, "asya-team-a-x-sump").map(|c| c.1),
        Some("uid-new".into())
    );
}

#[tokio::test]
async fn skip_cleanup_leftovers_keep_their_claim_and_their_namespace_gets_them_back() {
    let r = reconciler();
    let mut old = actor_in("team", "a-x", json!({"asya.sh/skip-cleanup": "true"}));
    step(&r, &mut old).await;
    r.cluster.world().queues.insert(
        "asya-team-a-x".into(),
        QueueDepth {
            queued: Some(7),
            processing: Some(0),
        },
    );
    delete(&r, &mut old).await;
    assert!(r.cluster.world().queues.contains_key("asya-team-a-x"));
    assert_eq!(
        claim_of(&r, "asya-team-a-x").map(|c| c.2),
        Some("a-x".into())
    );

    // team-a's actor `x` names the same queue: refused, the messages stay.
    let mut x = plain("team-a", "x");
    step(&r, &mut x).await;
    let (reason, message) = transport_condition(&x);
    assert_eq!(reason, "QueueNotOurs");
    assert!(
        message.starts_with(
            "queue asya-team-a-x is claimed by the queue of actor \"a-x\" of namespace \"team\""
        ),
        "{message}"
    );
    assert_eq!(r.cluster.world().queues["asya-team-a-x"].queued, Some(7));

    // The same actor created again in its namespace takes its queue back, messages and all.
    r.cluster.take_log();
    let mut again = plain("team", "a-x");
    step(&r, &mut again).await;
    let log = r.cluster.take_log();
    assert_eq!(transport_condition(&again).0, "QueueReady", "{log:#?}");
    assert!(!has(&log, "create queue asya-team-a-x"), "{log:#?}");
    assert_eq!(r.cluster.world().queues["asya-team-a-x"].queued, Some(7));
}

#[tokio::test]
async fn a_queue_left_when_the_cleanup_gave_up_keeps_its_claim() {
    let r = reconciler();
    let mut a = plain("team", "a-x");
    step(&r, &mut a).await;
    // Deleted over half a minute ago, the broker down since: given up on.
    a.metadata.deletion_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(31),
    ));
    r.cluster.world().broker = super::fake::Broker::Unavailable;
    assert_eq!(step(&r, &mut a).await, Next::AwaitChange);
    r.cluster.world().broker = super::fake::Broker::Up;
    assert!(r.cluster.world().queues.contains_key("asya-team-a-x"));
    assert_eq!(
        claim_of(&r, "asya-team-a-x").map(|c| c.0),
        Some("team".into())
    );
    r.cluster.world().actors.clear();
    let mut x = plain("team-a", "x");
    step(&r, &mut x).await;
    assert_eq!(transport_condition(&x).0, "QueueNotOurs");
}

#[tokio::test]
async fn an_unbound_queue_is_adopted_only_on_request_and_never_another_namespaces_end_queue() {
    let r = reconciler();
    {
        // From before the claims: made by hand, or a namespace's whose actors (and
        // exchange) were gone at the upgrade.
        let mut w = r.cluster.world();
        for q in ["asya-n-a", "asya-team-a-x-sink"] {
            w.queues.insert(q.into(), QueueDepth::default());
            w.queue_records
                .insert(q.into(), QueueRecord::TenantBindings(Default::default()));
        }
    }
    let mut a = plain("n", "a");
    step(&r, &mut a).await;
    let (reason, message) = transport_condition(&a);
    assert_eq!(reason, "QueueNotOurs");
    assert!(
        message.contains("bound to no namespace's exchange"),
        "{message}"
    );
    assert!(
        message.contains("asya.sh/adopt-queue: \"true\""),
        "{message}"
    );
    assert_eq!(claim_of(&r, "asya-n-a"), None, "nothing claimed");

    // Asked once: adopted (not created) and claimed; owned from then on without asking.
    r.cluster.take_log();
    let mut a = actor_in("n", "a", json!({"asya.sh/adopt-queue": "true"}));
    step(&r, &mut a).await;
    let log = r.cluster.take_log();
    assert_eq!(transport_condition(&a).0, "QueueReady", "{log:#?}");
    assert!(!has(&log, "create queue asya-n-a"), "{log:#?}");
    assert!(has(&log, "create QueueClaim asya-n-a for n/a"), "{log:#?}");
    r.memory
        .forget_queue(&super::memory::QueueKey::new("rabbitmq", "asya-n-a"));
    let mut a = plain("n", "a");
    step(&r, &mut a).await;
    assert_eq!(transport_condition(&a).0, "QueueReady");

    // The annotation does not adopt team-a's results queue for team's actor a-x-sink.
    let mut thief = actor_in("team", "a-x-sink", json!({"asya.sh/adopt-queue": "true"}));
    step(&r, &mut thief).await;
    let (reason, message) = transport_condition(&thief);
    assert_eq!(reason, "QueueNotOurs");
    assert!(
        message.starts_with(
            "queue asya-team-a-x-sink is also the name of the end queue x-sink of namespace team-a"
        ),
        "{message}"
    );
    assert_eq!(claim_of(&r, "asya-team-a-x-sink"), None);
}

#[tokio::test]
async fn the_upgrade_claims_queues_bound_to_their_own_namespace() {
    // The release before the claims: team's queues bound to asya.team (it has actors).
    let r = reconciler();
    {
        let mut w = r.cluster.world();
        for q in ["asya-team-b", "asya-team-x-sink", "asya-team-x-sump"] {
            w.queues.insert(q.into(), QueueDepth::default());
            w.queue_records.insert(
                q.into(),
                QueueRecord::TenantBindings(["team".to_string()].into()),
            );
        }
    }
    let mut b = plain("team", "b");
    step(&r, &mut b).await;
    let log = r.cluster.take_log();
    assert_eq!(transport_condition(&b).0, "QueueReady", "{log:#?}");
    assert!(!has(&log, "create queue"), "adopted, not created: {log:#?}");
    for q in ["asya-team-b", "asya-team-x-sink", "asya-team-x-sump"] {
        assert_eq!(
            claim_of(&r, q).map(|c| (c.0, c.1)),
            Some(("team".into(), default_namespace_uid("team"))),
            "{q}"
        );
    }
}

#[tokio::test]
async fn a_stale_claim_is_replaced_and_only_a_stale_one() {
    let r = reconciler();
    let stale = || {
        stored_claim(
            "asya-team-a-x",
            "team",
            &default_namespace_uid("team"),
            "a-x",
        )
    };
    // Claimed by team's actor a-x, which is gone, and its queue too (deleted by hand).
    r.cluster
        .world()
        .claims
        .insert("asya-team-a-x".into(), stale());
    let mut x = plain("team-a", "x");
    step(&r, &mut x).await;
    let log = r.cluster.take_log();
    assert_eq!(transport_condition(&x).0, "QueueReady", "{log:#?}");
    let order = [
        "delete QueueClaim asya-team-a-x",
        "create QueueClaim asya-team-a-x for team-a/x",
        "create queue asya-team-a-x",
    ];
    let idx: Vec<usize> = order
        .iter()
        .map(|p| log.iter().position(|l| l == p).expect(p))
        .collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{log:#?}");

    // Not stale: the queue is still there (a leftover), or its actor is (its creation may be
    // under way), or it is an end queue of a namespace that still exists.
    for setup in ["queue", "actor", "end"] {
        let r = reconciler();
        let (queue, claim, wanted) = if setup == "end" {
            let c = stored_claim(
                "asya-team-a-x-sink",
                "team-a",
                &default_namespace_uid("team-a"),
                "x-sink",
            );
            ("asya-team-a-x-sink", c, plain("team", "a-x-sink"))
        } else {
            ("asya-team-a-x", stale(), plain("team-a", "x"))
        };
        {
            let mut w = r.cluster.world();
            w.claims.insert(queue.into(), claim);
            if setup == "queue" {
                w.queues.insert(queue.into(), QueueDepth::default());
            }
            if setup == "actor" {
                w.actors.push(Arc::new(plain("team", "a-x")));
            }
        }
        let mut wanted = wanted;
        step(&r, &mut wanted).await;
        assert_eq!(transport_condition(&wanted).0, "QueueNotOurs", "{setup}");
        assert!(
            !has(&r.cluster.take_log(), "delete QueueClaim"),
            "{setup}: kept"
        );
    }

    // Its namespace gone (or created again), queue gone: stale.
    let r = reconciler();
    r.cluster.world().claims.insert(
        "asya-team-a-x-sink".into(),
        stored_claim(
            "asya-team-a-x-sink",
            "team-a",
            &default_namespace_uid("team-a"),
            "x-sink",
        ),
    );
    r.cluster.world().namespaces.insert("team-a".into(), None);
    let mut thief = plain("team", "a-x-sink");
    step(&r, &mut thief).await;
    assert_eq!(transport_condition(&thief).0, "QueueReady");
    assert_eq!(
        claim_of(&r, "asya-team-a-x-sink").map(|c| c.0),
        Some("team".into())
    );
}

#[tokio::test]
async fn of_two_actors_racing_for_one_name_the_first_claim_wins() {
    // team-a's first actor claims its end queue while team's a-x-sink is between reading
    // (no claim) and creating its own: the creation fails, the claim is read again, refused.
    let r = reconciler();
    r.cluster.world().claim_before_create = Some(stored_claim(
        "asya-team-a-x-sink",
        "team-a",
        &default_namespace_uid("team-a"),
        "x-sink",
    ));
    let mut thief = plain("team", "a-x-sink");
    step(&r, &mut thief).await;
    let log = r.cluster.take_log();
    assert!(
        has(&log, "create QueueClaim asya-team-a-x-sink (by another)"),
        "{log:#?}"
    );
    assert!(!has(&log, "create queue asya-team-a-x-sink"), "{log:#?}");
    let (reason, message) = transport_condition(&thief);
    assert_eq!(reason, "QueueNotOurs");
    assert!(
        message.contains("claimed by the end queue x-sink of namespace \"team-a\""),
        "{message}"
    );

    // And the other way round: team's actor was first; team-a's first actor is refused its
    // end queue.
    let r = reconciler();
    r.cluster.world().claim_before_create = Some(stored_claim(
        "asya-team-a-x-sink",
        "team",
        &default_namespace_uid("team"),
        "a-x-sink",
    ));
    r.cluster
        .world()
        .actors
        .push(Arc::new(plain("team", "a-x-sink")));
    let mut y = plain("team-a", "y");
    step(&r, &mut y).await;
    let (reason, message) = transport_condition(&y);
    assert_eq!(reason, "QueueNotOurs");
    assert!(
        message.contains("claimed by the queue of actor \"a-x-sink\" of namespace \"team\""),
        "{message}"
    );
    assert!(!has(
        &r.cluster.take_log(),
        "create queue asya-team-a-x-sink"
    ));
}

#[tokio::test]
async fn a_claim_goes_only_after_its_queue() {
    let r = reconciler();
    let mut a = plain("n", "a");
    step(&r, &mut a).await;
    assert!(claim_of(&r, "asya-n-a").is_some());
    r.cluster.take_log();
    delete(&r, &mut a).await;
    let log = r.cluster.take_log();
    let q = log
        .iter()
        .position(|l| l == "delete queue asya-n-a")
        .expect("queue");
    let c = log
        .iter()
        .position(|l| l == "delete QueueClaim asya-n-a")
        .expect("claim");
    assert!(q < c, "{log:#?}");
}
