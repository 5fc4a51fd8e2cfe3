//! Table tests of the reconcile's pure decisions (`reconcile/plan.rs`): requeue times and
//! back-off, the finalizer step, the replica handoff to KEDA, KEDA objects, status writes and
//! events, cleanup's bound and `skip-cleanup`, excluded namespaces; the objects, pods and
//! cleanup steps' actions and the effects of their outcomes (KEDA refused over a foreign
//! workload, the queue URL only for SQS, legacy removal, announcements).

use super::*;
use crate::apply_skip::Live;
use crate::model::ObjectKind;
use crate::queue::QueueError;

fn actor(v: serde_json::Value) -> AsyncActor {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": v, "spec": {"image": "i", "handler": "m.f"}
    }))
    .unwrap()
}

fn prev(kind: Option<&str>, mode: Option<&str>) -> AsyncActorStatus {
    AsyncActorStatus {
        workload_kind: kind.map(Into::into),
        scaling_mode: mode.map(Into::into),
        ..Default::default()
    }
}

fn resolved(spec: serde_json::Value) -> ResolvedActor {
    let a: AsyncActor = serde_json::from_value(serde_json::json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": "a", "namespace": "n"}, "spec": spec
    }))
    .unwrap();
    let cfg = asya_api::config::ClusterConfig::default();
    asya_api::review::review_typed(&a, &asya_api::FlavorCatalog::new(), &cfg)
        .resolved
        .unwrap()
}

#[test]
fn actors_with_messages_are_looked_at_sooner_and_every_actor_is_spread() {
    let keys = ["ns-a/one", "ns-a/two", "ns-b/one"];
    for k in keys {
        let idle = periodic(k, false);
        assert!(idle >= PERIOD && idle < PERIOD + SPREAD, "{k}: {idle:?}");
        let busy = periodic(k, true);
        assert!(
            busy >= BUSY_PERIOD && busy < BUSY_PERIOD + BUSY_SPREAD,
            "{k}: {busy:?}"
        );
    }
    let idle: std::collections::HashSet<_> = keys.iter().map(|k| periodic(k, false)).collect();
    assert_eq!(
        idle.len(),
        keys.len(),
        "actors come back at different times"
    );
}

#[test]
fn a_failure_backs_off_and_pods_waiting_for_injection_come_back_soon() {
    let b = Duration::from_secs(8);
    assert_eq!(next("n/a", true, b, true, true), Next::After(b));
    assert_eq!(
        next("n/a", false, b, true, true),
        Next::After(INJECTION_RETRY)
    );
    assert_eq!(
        next("n/a", false, b, false, true),
        Next::After(periodic("n/a", true))
    );
}

#[test]
fn the_finalizer_step_follows_deletion_and_our_finalizer() {
    let live = actor(serde_json::json!({"name": "a"}));
    let ours = actor(serde_json::json!({"name": "a", "finalizers": ["other", FINALIZER]}));
    let gone = actor(
        serde_json::json!({"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z",
                                        "finalizers": ["other"]}),
    );
    let deleting = actor(
        serde_json::json!({"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z",
                                            "finalizers": [FINALIZER]}),
    );
    assert_eq!(finalizer_step(&live), FinalizerStep::AddThenReconcile);
    assert_eq!(finalizer_step(&ours), FinalizerStep::Reconcile);
    assert_eq!(finalizer_step(&gone), FinalizerStep::Done);
    assert_eq!(finalizer_step(&deleting), FinalizerStep::CleanUp);
}

#[test]
fn replicas_are_handed_over_only_from_manual_to_keda_and_a_kind_switch_removes_the_old() {
    use WorkloadKind::*;
    let p = prev(Some("Deployment"), Some("Manual"));
    let w = workload(Some(&p), Deployment, true);
    assert!(w.hand_over && w.remove.is_none() && !w.announce);
    assert!(!workload(Some(&p), Deployment, false).hand_over);
    let keda = prev(Some("Deployment"), Some("KEDA"));
    assert!(!workload(Some(&keda), Deployment, true).hand_over);
    assert_eq!(
        workload(Some(&keda), StatefulSet, true).remove,
        Some(Deployment)
    );
    let new = workload(None, Deployment, true);
    assert!(new.announce && !new.hand_over && new.remove.is_none());
}

#[test]
fn keda_objects_are_applied_removed_or_left_as_scaling_and_history_say() {
    let r = resolved(serde_json::json!({"image": "i", "handler": "m.f", "replicas": 2}));
    let manual = prev(None, Some("Manual"));
    let keda = prev(None, Some("KEDA"));
    let removed = ScalingPlan::Remove {
        note: "scaling disabled: ScaledObject removed, 2 fixed replica(s)".into(),
    };
    // Without KEDA: an error only for an actor that wants it.
    assert!(matches!(
        scaling(None, &r, true, false, false, true),
        ScalingPlan::Unavailable(_)
    ));
    assert_eq!(
        scaling(None, &r, false, false, true, true),
        ScalingPlan::Nothing
    );
    // Scaling off: removed when it was KEDA (or unknown) or is still cached.
    assert_eq!(scaling(Some(&keda), &r, false, true, false, true), removed);
    assert_eq!(scaling(None, &r, false, true, false, true), removed);
    assert_eq!(scaling(Some(&manual), &r, false, true, true, true), removed);
    assert_eq!(
        scaling(Some(&manual), &r, false, true, false, true),
        ScalingPlan::Nothing
    );
    // Scaling on: applied, announced when new; nothing without a known transport.
    assert_eq!(
        scaling(Some(&manual), &r, true, true, false, true),
        ScalingPlan::Apply { announce: true }
    );
    assert_eq!(
        scaling(Some(&keda), &r, true, true, true, true),
        ScalingPlan::Apply { announce: false }
    );
    assert_eq!(
        scaling(Some(&keda), &r, true, true, true, false),
        ScalingPlan::Nothing
    );
}

#[test]
fn an_unchanged_status_is_not_written_and_a_new_phase_is_announced() {
    let old = AsyncActorStatus {
        phase: Some("Creating".into()),
        message: Some("creating the workload".into()),
        ..Default::default()
    };
    assert_eq!(status_write(&old, &old), None);
    let mut counts = old.clone();
    counts.ready_replicas = Some(1);
    assert_eq!(status_write(&old, &counts), Some(None));
    let mut failing = old.clone();
    failing.phase = Some("RuntimeError".into());
    failing.message = Some("1 pod(s) failing".into());
    assert_eq!(
        status_write(&old, &failing),
        Some(Some(EventSpec::warning(
            Reason::Phase(Phase::RuntimeError),
            "phase Creating -> RuntimeError: 1 pod(s) failing".into()
        )))
    );
    let mut running = old.clone();
    running.phase = Some("Running".into());
    running.message = Some("1 replica(s) ready".into());
    let ev = status_write(&AsyncActorStatus::default(), &running)
        .unwrap()
        .unwrap();
    assert!(!ev.warning);
    assert_eq!(ev.note, "phase none -> Running: 1 replica(s) ready");
}

#[test]
fn transport_failures_name_their_reason_and_wait() {
    let (o, r) = transport_failure(&QueueError::RecreateCooldown("q".into()));
    assert_eq!(r, Retry::After(Duration::from_secs(65)));
    assert!(matches!(o, TransportObs::Failed { reason, .. } if reason == "RecreateCooldown"));
    let (o, r) = transport_failure(&QueueError::Rejected("no".into()));
    assert_eq!(
        r,
        Retry::Backoff {
            at_least: Duration::from_secs(5)
        }
    );
    assert!(
        matches!(o, TransportObs::Failed { reason, message } if reason == "Rejected"
        && message == "transport rejected the request: no")
    );
    let (_, r) = transport_failure(&QueueError::Unavailable("down".into()));
    assert_eq!(
        r,
        Retry::Backoff {
            at_least: Duration::from_secs(5)
        }
    );
}

#[test]
fn the_deletion_event_names_a_few_delay_queues() {
    assert_eq!(queue_deleted_event("q", &[]).note, "queue q deleted");
    let three: Vec<String> = (1..=3).map(|i| format!("d{i}")).collect();
    assert_eq!(
        queue_deleted_event("q", &three).note,
        "queue q deleted, with its retry delay queues d1, d2, d3"
    );
    let six: Vec<String> = (1..=6).map(|i| format!("d{i}")).collect();
    assert_eq!(
        queue_deleted_event("q", &six).note,
        "queue q deleted, with its retry delay queues d1, d2, d3, d4 and 2 more"
    );
}

#[test]
fn a_queue_is_announced_as_recreated_once_the_status_named_it() {
    let e = queue_created_event(None, "asya-n-a", "rabbitmq");
    assert_eq!(
        e,
        EventSpec::normal(
            Reason::QueueCreated,
            "queue asya-n-a created on rabbitmq".into()
        )
    );
    let named = AsyncActorStatus {
        queue_identifier: Some("asya-n-a".into()),
        ..Default::default()
    };
    let e = queue_created_event(Some(&named), "asya-n-a", "rabbitmq");
    assert!(e.warning);
    assert_eq!(e.reason.as_str(), "QueueRecreated");
}

#[test]
fn a_keda_scaled_workload_is_created_at_its_minimum_only_when_it_is_new() {
    let a: AsyncActor = serde_json::from_value(serde_json::json!({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"image": "i", "handler": "m.f", "scaling": {"minReplicaCount": 2}}
    }))
    .unwrap();
    let cfg = asya_api::config::ClusterConfig::default();
    let review = asya_api::review::review_typed(&a, &asya_api::FlavorCatalog::new(), &cfg);
    let (r, o) = resolution(&a, review).unwrap();
    let seen = ObjectsSeen {
        keda: true,
        so_cached: false,
        transport_known: true,
        workload_live: Live::Missing,
        workload_applied_before: false,
    };
    let p = objects(None, &r, &o, &seen);
    assert_eq!(p.workload.initial, Some(2));
    assert_eq!(p.workload.kind, WorkloadKind::Deployment);
    assert_eq!(p.scaling, ScalingPlan::Apply { announce: true });
    let present = Live::Present {
        generation: Some(1),
        applied: None,
    };
    for seen in [
        ObjectsSeen {
            workload_live: present,
            ..seen
        },
        ObjectsSeen {
            workload_applied_before: true,
            ..seen
        },
    ] {
        assert_eq!(objects(None, &r, &o, &seen).workload.initial, None);
    }
}

#[test]
fn cleanup_retries_within_the_bound_and_never_past_it_then_gives_up() {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    // (since the deletion, backoff) → step
    let table = [
        (s(0), s(2), CleanupStep::Retry(s(2))),
        (s(10), s(16), CleanupStep::Retry(s(16))),
        // The backoff would pass the bound: the last attempt comes at the bound.
        (s(20), s(32), CleanupStep::Retry(s(10))),
        (s(29), s(300), CleanupStep::Retry(s(1))),
        // Never sooner than a second, even just before the bound.
        (ms(29_900), s(2), CleanupStep::Retry(s(1))),
        (s(0), ms(10), CleanupStep::Retry(s(1))),
        (CLEANUP_GIVE_UP_AFTER, s(2), CleanupStep::GiveUp),
        (s(3600), s(2), CleanupStep::GiveUp),
    ];
    for (since, backoff, want) in table {
        assert_eq!(
            cleanup_after_failure(since, backoff),
            want,
            "{since:?} {backoff:?}"
        );
    }
    // The bound keeps a deletion with the broker gone within a minute.
    assert!(CLEANUP_GIVE_UP_AFTER + s(2) < s(60));
}

#[test]
fn skip_cleanup_takes_only_true() {
    for (annotations, want) in [
        (serde_json::json!({}), false),
        (serde_json::json!({"asya.sh/skip-cleanup": "true"}), true),
        (serde_json::json!({"asya.sh/skip-cleanup": "True"}), false),
        (serde_json::json!({"asya.sh/skip-cleanup": "yes"}), false),
        (serde_json::json!({"asya.sh/skip-cleanup": ""}), false),
    ] {
        let a = actor(serde_json::json!({"name": "a", "annotations": annotations}));
        assert_eq!(skip_cleanup(&a), want, "{annotations}");
    }
}

#[test]
fn time_since_deletion_is_never_negative() {
    let at = |s: &str| Time(s.parse().unwrap());
    let a = actor(serde_json::json!({"name": "a", "deletionTimestamp": "2026-01-01T00:00:10Z"}));
    assert_eq!(
        since_deletion(&a, &at("2026-01-01T00:00:40Z")),
        Duration::from_secs(30)
    );
    // A provisioner clock behind the API server's.
    assert_eq!(
        since_deletion(&a, &at("2026-01-01T00:00:00Z")),
        Duration::ZERO
    );
    let live = actor(serde_json::json!({"name": "a"}));
    assert_eq!(
        since_deletion(&live, &at("2026-01-01T00:00:40Z")),
        Duration::ZERO
    );
}

#[test]
fn only_live_actors_in_an_excluded_namespace_are_left_alone() {
    let cfg = asya_api::config::ClusterConfig {
        excluded_namespaces: vec!["kube-system".into(), "asya-system".into()],
        ..Default::default()
    };
    let live = actor(serde_json::json!({"name": "a", "namespace": "asya-system"}));
    let why = namespace_excluded(&live, &cfg).expect("excluded");
    assert!(why.starts_with("namespace asya-system is excluded from admission"));
    assert!(why.contains("webhook.excludeNamespaces"), "{why}");
    let elsewhere = actor(serde_json::json!({"name": "a", "namespace": "team"}));
    assert_eq!(namespace_excluded(&elsewhere, &cfg), None);
    // A deleted one is still cleaned up.
    let deleting = actor(serde_json::json!({"name": "a", "namespace": "kube-system",
        "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [FINALIZER]}));
    assert_eq!(namespace_excluded(&deleting, &cfg), None);
    // The event is said once: not again while the status stays.
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (status, ev) = excluded_status(
        &AsyncActorStatus::default(),
        why.clone(),
        Some(1),
        now.clone(),
    )
    .expect("first time");
    assert_eq!(ev.reason, Reason::NamespaceExcluded);
    assert!(ev.warning);
    let c = &status.conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("Reconciled", "False", "NamespaceExcluded")
    );
    assert_eq!(excluded_status(&status, why, Some(1), now), None);
}

#[test]
fn what_a_reconcile_made_and_its_phase_are_one_event_and_warnings_their_own() {
    let made = |r, n: &str| EventSpec::normal(r, n.to_string());
    let phase = EventSpec::normal(
        Reason::Phase(Phase::Napping),
        "phase none -> Napping".into(),
    );
    let evs = announcement(
        vec![
            made(Reason::QueueCreated, "queue q created on rabbitmq"),
            made(Reason::WorkloadCreated, "Deployment a created"),
        ],
        Some(phase.clone()),
    );
    assert_eq!(
        evs,
        [EventSpec::normal(
            Reason::Provisioned,
            "queue q created on rabbitmq; Deployment a created; phase none -> Napping".into()
        )]
    );
    // One thing alone keeps its own reason; nothing made: the phase event as it was.
    assert_eq!(
        announcement(vec![], Some(phase.clone())),
        vec![phase.clone()]
    );
    let one = made(Reason::ScaledObjectCreated, "KEDA ScaledObject a created");
    assert_eq!(announcement(vec![one.clone()], None), vec![one]);
    assert_eq!(announcement(vec![], None), []);
    // A Warning is never folded into the Normal story.
    let recreated = EventSpec::warning(Reason::QueueRecreated, "queue q recreated".into());
    let failing = EventSpec::warning(Reason::Phase(Phase::Degraded), "phase -> Degraded".into());
    let evs = announcement(
        vec![
            recreated.clone(),
            made(Reason::WorkloadCreated, "Deployment a created"),
        ],
        Some(failing.clone()),
    );
    assert_eq!(
        evs,
        [
            EventSpec::normal(Reason::WorkloadCreated, "Deployment a created".into()),
            recreated,
            failing
        ]
    );
    // The API server refuses a note over 1 kB: a long story is cut, on a character boundary.
    let long = "é".repeat(700);
    let evs = announcement(vec![made(Reason::QueueCreated, &long)], Some(phase));
    assert!(evs[0].note.len() <= NOTE_MAX && evs[0].note.ends_with('…'));
}

/// The transports of the objects step's table tests: RabbitMQ, SQS with an IRSA role, SQS
/// sharing the platform's static keys.
fn transports() -> asya_api::config::ClusterConfig {
    asya_api::config::ClusterConfig::from_yaml(
        "defaultTransport: rabbitmq\ntransports:\n  rabbitmq:\n    type: rabbitmq\n    config: {host: rabbitmq, managementPort: 15672}\n  \
         sqs:\n    type: sqs\n    config: {region: us-east-1}\n  \
         shared:\n    type: sqs\n    config: {region: us-east-1, credentialsSecretRef: {name: sqs-keys}, shareStaticCredentials: true}\n",
    )
    .unwrap()
}

#[test]
fn the_workload_is_handed_over_then_the_other_kind_removed_then_applied() {
    let name = "asya-a";
    let wp = |hand_over, remove, initial| WorkloadPlan {
        kind: WorkloadKind::Deployment,
        hand_over,
        remove,
        initial,
        announce: false,
    };
    let apply = |initial| Action::Apply(Rendered::Workload { initial });
    let hand = Action::HandReplicasOver {
        kind: WorkloadKind::Deployment,
        name: name.into(),
    };
    let remove = Action::DeleteIfOurs {
        kind: ObjectKind::StatefulSet,
        name: name.into(),
    };
    let cases = [
        (wp(false, None, None), vec![apply(None)]),
        (wp(false, None, Some(2)), vec![apply(Some(2))]),
        (wp(true, None, None), vec![hand.clone(), apply(None)]),
        (
            wp(true, Some(WorkloadKind::StatefulSet), None),
            vec![hand, remove.clone(), apply(None)],
        ),
        (
            wp(false, Some(WorkloadKind::StatefulSet), Some(1)),
            vec![remove, apply(Some(1))],
        ),
    ];
    for (plan, want) in cases {
        assert_eq!(workload_actions(&plan, name), want, "{plan:?}");
    }
    // A workload created at its minimum hands those replicas over, once sent.
    assert_eq!(wp(false, None, Some(2)).handoff_after_apply(true), Some(2));
    assert_eq!(wp(false, None, Some(2)).handoff_after_apply(false), None);
    assert_eq!(wp(true, None, None).handoff_after_apply(true), None);
}

#[test]
fn the_workloads_outcome_is_announced_or_refused() {
    let wp = |announce| WorkloadPlan {
        kind: WorkloadKind::StatefulSet,
        hand_over: false,
        remove: None,
        initial: None,
        announce,
    };
    let created = EventSpec::normal(Reason::WorkloadCreated, "StatefulSet asya-a created".into());
    let held = "StatefulSet n/asya-a is held by another".to_string();
    let cases = [
        (
            true,
            Outcome::Done,
            Effects {
                made: vec![created],
                ..Default::default()
            },
        ),
        (false, Outcome::Done, Effects::default()),
        (
            true,
            Outcome::NotOurs(held.clone()),
            Effects {
                events: vec![EventSpec::warning(Reason::NameConflict, held.clone())],
                foreign: vec![held.clone()],
                error: Some(held),
                ..Default::default()
            },
        ),
        (
            false,
            Outcome::Failed("boom".into()),
            Effects {
                events: vec![EventSpec::warning(Reason::WorkloadFailed, "boom".into())],
                error: Some("boom".into()),
                ..Default::default()
            },
        ),
    ];
    for (announce, outcome, want) in cases {
        assert_eq!(
            workload_effects(&wp(announce), "asya-a", &outcome),
            want,
            "{announce} {outcome:?}"
        );
    }
}

#[test]
fn keda_objects_are_refused_over_a_foreign_workload_and_name_the_queue_url_only_for_sqs() {
    let cfg = transports();
    let r = resolved(serde_json::json!({"image": "i", "handler": "m.f"}));
    let apply = || ScalingPlan::Apply { announce: true };
    let so = Action::Apply(Rendered::ScaledObject);
    let ta = Action::Apply(Rendered::TriggerAuthentication);
    let created = EventSpec::normal(
        Reason::ScaledObjectCreated,
        "KEDA ScaledObject a created".into(),
    );

    // Over someone else's workload nothing is written, whatever the transport.
    for t in ["rabbitmq", "sqs"] {
        assert_eq!(
            keda_steps(apply(), &r, true, cfg.transport(t)),
            KedaSteps::Nothing {
                error: Some("not applied: Deployment n/a is not this actor's".into())
            },
            "{t}"
        );
    }
    // A transport the configuration lacks: nothing, no error (the transport says why).
    assert_eq!(
        keda_steps(apply(), &r, false, None),
        KedaSteps::Nothing { error: None }
    );
    // RabbitMQ: the ScaledObject only, by queue name; its identity checked, the older
    // layout removed.
    assert_eq!(
        keda_steps(apply(), &r, false, cfg.transport("rabbitmq")),
        KedaSteps::Apply {
            actions: vec![so.clone()],
            queue_url: false,
            after: AfterKeda {
                check_identity: true,
                remove_legacy: true,
                shared: None,
                announce: Some(created.clone()),
            },
        }
    );
    // SQS: its TriggerAuthentication first, the trigger by queue URL.
    let sqs = AfterKeda {
        check_identity: false,
        remove_legacy: false,
        shared: None,
        announce: None,
    };
    assert_eq!(
        keda_steps(
            ScalingPlan::Apply { announce: false },
            &r,
            false,
            cfg.transport("sqs")
        ),
        KedaSteps::Apply {
            actions: vec![ta.clone(), so.clone()],
            queue_url: true,
            after: sqs.clone(),
        }
    );
    // Shared static keys: said on the actor when its TriggerAuthentication is sent.
    let KedaSteps::Apply { after, .. } = keda_steps(apply(), &r, false, cfg.transport("shared"))
    else {
        panic!("applied")
    };
    assert_eq!(
        after.shared,
        Some(shared_static_credentials_event("rabbitmq", "sqs-keys"))
    );
    // Scaling off: both deleted; unavailable and nothing pass their error through.
    let note = "scaling disabled".to_string();
    assert_eq!(
        keda_steps(ScalingPlan::Remove { note: note.clone() }, &r, true, None),
        KedaSteps::Remove {
            actions: vec![
                Action::DeleteIfOurs {
                    kind: ObjectKind::ScaledObject,
                    name: "a".into()
                },
                Action::DeleteIfOurs {
                    kind: ObjectKind::TriggerAuthentication,
                    name: "a-trigger-auth".into()
                },
            ],
            note,
        }
    );
    assert_eq!(
        keda_steps(ScalingPlan::Unavailable("no KEDA".into()), &r, false, None),
        KedaSteps::Nothing {
            error: Some("no KEDA".into())
        }
    );
}

#[test]
fn keda_outcomes_say_the_identity_problem_the_shared_keys_and_the_creation_once() {
    let shared = shared_static_credentials_event("sqs", "sqs-keys");
    let created = EventSpec::normal(Reason::ScaledObjectCreated, "created".into());
    let after = AfterKeda {
        check_identity: true,
        remove_legacy: true,
        shared: Some(shared.clone()),
        announce: Some(created.clone()),
    };
    let done = applied_effects(&after, &Outcome::Done, true, Some("no user"));
    assert_eq!(
        done,
        Effects {
            events: vec![shared],
            made: vec![created],
            foreign: vec![],
            error: Some(identity_problem_message("no user")),
        }
    );
    // The TriggerAuthentication unchanged: not said again; no identity check asked for.
    let quiet = AfterKeda {
        check_identity: false,
        announce: None,
        ..after.clone()
    };
    assert_eq!(
        applied_effects(&quiet, &Outcome::Done, false, Some("no user")),
        Effects::default()
    );
    // A failure says only itself.
    let failed = applied_effects(&after, &Outcome::Failed("boom".into()), true, None);
    assert_eq!(
        failed.events,
        vec![EventSpec::warning(
            Reason::ScaledObjectFailed,
            "boom".into()
        )]
    );
    assert!(failed.made.is_empty());
    let held = applied_effects(&after, &Outcome::NotOurs("held".into()), true, None);
    assert_eq!(held.foreign, vec!["held".to_string()]);
    assert_eq!(held.error.as_deref(), Some("held"));
    // The removal is said only when the ScaledObject went.
    assert!(removed_effects("off", false, vec![]).events.is_empty());
    assert_eq!(
        removed_effects("off", true, vec!["kept".into()]),
        Effects {
            events: vec![EventSpec::normal(Reason::ScaledObjectDeleted, "off".into())],
            foreign: vec!["kept".into()],
            ..Default::default()
        }
    );
}

fn pod_of(v: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(v).unwrap()
}

/// A pod created while the webhook was down: labelled for injection, no sidecar.
fn bare(name: &str) -> k8s_openapi::api::core::v1::Pod {
    pod_of(serde_json::json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {labels::INJECT: "true"}},
        "spec": {"containers": [{"name": "asya-runtime"}]}
    }))
}

/// An injected pod whose sidecar reads `var` from Secret `secret`; `stuck`: waiting on it.
fn injected(name: &str, var: &str, secret: &str, stuck: bool) -> k8s_openapi::api::core::v1::Pod {
    let reason = if stuck {
        "CreateContainerConfigError"
    } else {
        "ContainerCreating"
    };
    pod_of(serde_json::json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "labels": {labels::INJECT: "true"}, "annotations": {labels::INJECTED: "true"}},
        "spec": {"containers": [{"name": labels::SIDECAR_CONTAINER, "env": [
            {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]}]},
        "status": {"containerStatuses": [{"name": labels::SIDECAR_CONTAINER, "ready": false,
            "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": reason}}}]}
    }))
}

#[test]
fn pods_without_the_sidecar_wait_for_injection_and_stale_credentials_are_replaced() {
    use asya_api::sidecar_settings::env::RABBITMQ_PASSWORD;
    let (b, ok) = (bare("bare"), injected("ok", RABBITMQ_PASSWORD, "now", true));
    let stale = injected("stale", RABBITMQ_PASSWORD, "before", true);
    let running = injected("running", RABBITMQ_PASSWORD, "before", false);
    let all = [&b, &ok, &stale, &running];
    assert_eq!(bare_pods(&all), vec![&b]);
    let current = [(RABBITMQ_PASSWORD, "now")];
    let creds = Credentials {
        current: &current,
        overridden: &[],
    };
    let names = |p: &PodsPlan| -> Vec<String> {
        p.counted
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    };
    let delete_stale = PodAction::Delete {
        name: "stale".into(),
        uid: Some("uid-stale".into()),
    };
    let stale_event = PodAction::Event(stale_credentials_event(
        "stale",
        RABBITMQ_PASSWORD,
        "before",
    ));

    // Injection still down: the bare pod is kept and said; the stale one replaced by uid.
    let down = pods(&all, true, Some(&creds));
    let PodStep::Keep(keep) = bare_pod("bare", true) else {
        panic!("kept")
    };
    assert_eq!(
        down.actions,
        vec![
            PodAction::Event(keep),
            delete_stale.clone(),
            stale_event.clone()
        ]
    );
    assert_eq!(names(&down), ["ok", "running"]);

    // Injection works: the bare pod goes too (by name: a bare pod is never ours to keep).
    let up = pods(&all, false, Some(&creds));
    let PodStep::Replace(replaced) = bare_pod("bare", false) else {
        panic!("replaced")
    };
    assert_eq!(
        up.actions,
        vec![
            PodAction::Delete {
                name: "bare".into(),
                uid: None
            },
            PodAction::Event(replaced),
            delete_stale,
            stale_event
        ]
    );

    // A variable the actor sets itself is the author's; an unknown transport judges none.
    let own = Credentials {
        current: &current,
        overridden: &[RABBITMQ_PASSWORD],
    };
    assert_eq!(pods(&[&stale], false, Some(&own)).actions, vec![]);
    let unknown = pods(&[&stale], false, None);
    assert_eq!(unknown.actions, vec![]);
    assert_eq!(names(&unknown), ["stale"]);
}

#[test]
fn cleanup_after_its_queue_step_releases_retries_or_gives_up_saying_what_was_left() {
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let s = Duration::from_secs;
    let after = |d, since| after_queue(d, "a", "asya-n-a", "rabbitmq", since, Some(3), now.clone());
    let delays = ["asya-n-a-retry-1".to_string()];
    assert_eq!(
        after(QueueDeletion::Deleted(&delays), s(0)),
        AfterQueue::Release {
            condition: None,
            closing: queue_deleted_event("asya-n-a", &delays),
        }
    );
    // Another actor's: released at once, the condition and event saying so.
    let AfterQueue::Release { condition, closing } =
        after(QueueDeletion::NotOurs("held by b"), s(0))
    else {
        panic!("released")
    };
    assert_eq!(
        closing,
        EventSpec::warning(Reason::QueueNotOurs, "held by b".into())
    );
    let condition = condition.expect("a condition");
    assert_eq!(
        (
            condition.type_.as_str(),
            condition.reason.as_str(),
            condition.message.as_str()
        ),
        (CLEANUP_INCOMPLETE, "QueueNotOurs", "held by b")
    );
    assert_eq!(condition.observed_generation, Some(3));
    // A broker failure: retried within the bound, then given up on.
    let failed = QueueDeletion::Failed {
        error: "connection refused",
        backoff: s(4),
    };
    assert_eq!(
        after(failed, s(10)),
        AfterQueue::Retry {
            wait: s(4),
            event: queue_delete_retry_event("asya-n-a", "connection refused", s(4), s(10)),
        }
    );
    let message = cleanup_gave_up_message("asya-n-a", "rabbitmq", "connection refused");
    let AfterQueue::Release { condition, closing } = after(failed, CLEANUP_GIVE_UP_AFTER) else {
        panic!("given up")
    };
    assert_eq!(closing, cleanup_gave_up_event("a", &message));
    let condition = condition.expect("a condition");
    assert_eq!(condition.reason, "QueueLeftBehind");
    assert_eq!(condition.message, message);
}

#[test]
fn a_step_failing_before_the_workload_says_why_and_waits_as_its_error_asks() {
    use crate::state_identity::StateError;
    let down = QueueError::Unavailable("connection refused".into());
    let f = step_failure(StepFailure::Queue(&down));
    assert_eq!(f.event, None);
    assert_eq!(f.transport, Some(transport_failure(&down).0));
    assert_eq!(f.retry, transport_failure(&down).1);
    // A cooldown waits exactly, in the queue step only; the identity step backs off.
    let cooldown = QueueError::RecreateCooldown("q".into());
    assert_eq!(
        step_failure(StepFailure::Queue(&cooldown)).retry,
        Retry::After(cooldown.retry_after())
    );
    assert!(matches!(
        step_failure(StepFailure::BrokerIdentity(&cooldown)).retry,
        Retry::Backoff { .. }
    ));
    let refused = QueueError::Rejected("access denied".into());
    let f = step_failure(StepFailure::BrokerIdentity(&refused));
    assert_eq!(
        (f.event, f.workload_error),
        (None, None),
        "said by the transport condition"
    );
    assert_eq!(f.transport, Some(transport_failure(&refused).0));
    // The Redis user: a Warning and the workload's error name it; the transport is untouched.
    let redis = StateError::Unavailable("timeout".into());
    let f = step_failure(StepFailure::StateIdentity(&redis));
    let note = format!("state proxies: {redis}");
    assert_eq!(
        f.event,
        Some(EventSpec::warning(Reason::StateIdentity, note.clone()))
    );
    assert_eq!(f.workload_error, Some(note));
    assert_eq!(f.transport, None);
    assert_eq!(
        f.retry,
        Retry::Backoff {
            at_least: Duration::from_secs(5)
        }
    );
}
