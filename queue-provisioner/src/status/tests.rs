//! The actor's status (`status`): failing pods classified by container and reason, a crash
//! loop between back-offs, phases, fields and conditions, pods that cannot be created, when
//! an actor has messages.

use super::*;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod fixture")
}

fn waiting(container: &str, reason: &str) -> Pod {
    pod(
        json!({"metadata": {"name": "p"}, "status": {"phase": "Running",
        "containerStatuses": [{"name": container, "ready": false, "restartCount": 3, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": reason}}}]}}),
    )
}

fn base() -> Observed {
    Observed {
        generation: Some(2),
        deleting: false,
        flavors: vec![],
        missing_flavors: vec![],
        unusable_flavors: None,
        invalid: None,
        transport: TransportObs::Ready(
            QueueInfo {
                url: "amqp://h/q".into(),
                identifier: "q".into(),
                created: false,
            },
            Some(QueueDepth {
                queued: Some(4),
                processing: None,
            }),
        ),
        workload_kind: Some(WorkloadKind::Deployment),
        workload: Some(WorkloadObs {
            replicas: Some(1),
            ready: 0,
            failure: None,
        }),
        workload_error: None,
        foreign: vec![],
        pods: vec![],
        scaling_enabled: true,
        scaling_error: None,
        hpa_desired: Some(1),
        min_replicas: Some(0),
        max_replicas: Some(10),
    }
}

fn now() -> Time {
    Time(Timestamp::from_second(1_800_000_000).unwrap())
}

fn phase(o: &Observed) -> String {
    derive(&AsyncActorStatus::default(), o, now())
        .phase
        .unwrap()
}

#[test]
fn classifies_failing_pods_by_container_and_reason() {
    assert!(matches!(
        classify_pod(&waiting("asya-runtime", "CrashLoopBackOff")),
        PodState::Failing {
            kind: FailKind::Runtime,
            ..
        }
    ));
    assert!(matches!(
        classify_pod(&waiting("asya-sidecar", "CrashLoopBackOff")),
        PodState::Failing {
            kind: FailKind::Sidecar,
            ..
        }
    ));
    assert!(matches!(
        classify_pod(&waiting("asya-runtime", "ImagePullBackOff")),
        PodState::Failing {
            kind: FailKind::ImagePull,
            ..
        }
    ));
    assert_eq!(
        classify_pod(&waiting("asya-runtime", "ContainerCreating")),
        PodState::Pending
    );
    // Failed for good: not retried, not failing.
    assert_eq!(
        classify_pod(&pod(json!({"metadata": {}, "status": {"phase": "Failed"}}))),
        PodState::Gone
    );
    let ready = pod(
        json!({"metadata": {}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    assert_eq!(classify_pod(&ready), PodState::Ready);
    // Init containers count too.
    let init = pod(
        json!({"metadata": {}, "status": {"phase": "Pending", "initContainerStatuses": [
        {"name": "asya-runtime-installer", "ready": false, "restartCount": 1, "image": "i", "imageID": "",
         "state": {"waiting": {"reason": "CreateContainerConfigError"}}}]}}),
    );
    assert!(matches!(
        classify_pod(&init),
        PodState::Failing {
            kind: FailKind::Runtime,
            ..
        }
    ));
}

fn restarted(container: &str, ready: bool, exit_code: i32) -> Pod {
    pod(
        json!({"metadata": {"name": "p"}, "status": {"phase": "Running",
        "initContainerStatuses": [{"name": container, "ready": ready, "restartCount": 2, "image": "i",
            "imageID": "", "state": {"running": {"startedAt": "2026-11-25T20:00:00Z"}},
            "lastState": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}]}}),
    )
}

#[test]
fn a_crash_loop_between_its_back_offs_is_still_failing() {
    // Running again after exit 1 and not ready: the next try of the loop, not a pod starting.
    match classify_pod(&restarted("asya-sidecar", false, 1)) {
        PodState::Failing {
            kind,
            container,
            reason,
        } => {
            assert_eq!(
                (kind, container.as_str()),
                (FailKind::Sidecar, "asya-sidecar")
            );
            assert_eq!(reason, "restarted after Error (exit code 1)");
        }
        other => panic!("{other:?}"),
    }
    // Ready again: recovered. A clean exit (0) before: not a crash.
    assert_eq!(
        classify_pod(&restarted("asya-sidecar", true, 1)),
        PodState::Pending
    );
    assert_eq!(
        classify_pod(&restarted("asya-sidecar", false, 0)),
        PodState::Pending
    );
    let mut o = base();
    o.pods = vec![classify_pod(&restarted("asya-sidecar", false, 1))];
    assert_eq!(phase(&o), Phase::SidecarError.as_str());

    // Just exited with an error, before the kubelet says CrashLoopBackOff.
    let exited = |code: i32| {
        pod(
            json!({"metadata": {"name": "p"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "asya-runtime", "ready": false, "restartCount": 2, "image": "i",
                "imageID": "", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]}}),
        )
    };
    assert_eq!(
        classify_pod(&exited(1)),
        PodState::Failing {
            kind: FailKind::Runtime,
            container: "asya-runtime".into(),
            reason: "Error (exit code 1)".into(),
        }
    );
    // The installer's clean exit is its job done.
    assert_eq!(classify_pod(&exited(0)), PodState::Pending);
}

#[test]
fn phases() {
    let mut o = base();
    assert_eq!(phase(&o), "Creating", "workload exists, nothing ready yet");
    o.pods = vec![PodState::Ready];
    assert_eq!(phase(&o), "Running");
    o.pods = vec![PodState::Failing {
        kind: FailKind::Runtime,
        container: "asya-runtime".into(),
        reason: "CrashLoopBackOff".into(),
    }];
    assert_eq!(phase(&o), "RuntimeError");
    o.pods.push(PodState::Ready);
    assert_eq!(phase(&o), "Degraded", "some pods serve, some fail");
    o.pods = vec![PodState::Failing {
        kind: FailKind::ImagePull,
        container: "asya-runtime".into(),
        reason: "ErrImagePull".into(),
    }];
    assert_eq!(phase(&o), "ImagePullError");
    let mut o = base();
    o.hpa_desired = Some(0);
    o.workload = Some(WorkloadObs {
        replicas: Some(0),
        ..Default::default()
    });
    assert_eq!(phase(&o), "Napping");
    o.transport = TransportObs::Failed {
        reason: "Unavailable".into(),
        message: "broker down".into(),
    };
    assert_eq!(phase(&o), "TransportError");
    o.missing_flavors = vec!["gpu".into()];
    assert_eq!(phase(&o), "Waiting");
    o.deleting = true;
    assert_eq!(phase(&o), "Terminating");
}

#[test]
fn status_fields_and_conditions() {
    let mut o = base();
    o.pods = vec![PodState::Ready, PodState::Pending];
    o.hpa_desired = Some(2);
    let s = derive(&AsyncActorStatus::default(), &o, now());
    assert_eq!(
        (s.ready_replicas, s.pending_replicas, s.failing_replicas),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(s.desired_replicas, Some(2));
    assert_eq!(s.queued_messages, Some(4));
    assert_eq!(s.queue_identifier.as_deref(), Some("q"));
    assert_eq!(s.scaling_mode.as_deref(), Some("KEDA"));
    assert_eq!(s.transport_status.as_deref(), Some("Ready"));
    assert_eq!(s.observed_generation, Some(2));
    let types: Vec<_> = s
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        types,
        [
            ("FlavorsResolved", "True"),
            ("TransportReady", "True"),
            ("WorkloadReady", "True"),
            ("ScalingReady", "True")
        ]
    );
    // Scale event: desired 2 → 5 is "up"; the condition times stay put when nothing flips.
    let later = Time(Timestamp::from_second(1_800_000_100).unwrap());
    o.hpa_desired = Some(5);
    let s2 = derive(&s, &o, later.clone());
    assert_eq!(s2.last_scale_direction.as_deref(), Some("up"));
    assert_eq!(s2.last_scale_time, Some(later.clone()));
    assert!(s2.last_scale.as_deref().unwrap().ends_with("(up)"));
    assert_eq!(s2.conditions[1].last_transition_time, now());
    o.scaling_enabled = false;
    o.workload = Some(WorkloadObs {
        replicas: Some(3),
        ..Default::default()
    });
    let s3 = derive(&s2, &o, later);
    assert_eq!(s3.scaling_mode.as_deref(), Some("Manual"));
    assert_eq!(s3.desired_replicas, Some(3));
    assert_eq!(s3.last_scale_direction.as_deref(), Some("down"));
}

#[test]
fn replaces_only_labelled_pods_without_sidecar() {
    let bare = pod(
        json!({"metadata": {"labels": {"asya.sh/inject": "true", "asya.sh/actor": "a"}},
        "spec": {"containers": [{"name": "asya-runtime", "image": "i"}]}}),
    );
    assert!(needs_replacing(&bare));
    let injected = pod(json!({"metadata": {"labels": {"asya.sh/inject": "true"}},
        "spec": {"containers": [{"name": "asya-runtime", "image": "i"}],
                 "initContainers": [{"name": "asya-sidecar", "image": "s", "restartPolicy": "Always"}]}}));
    assert!(!needs_replacing(&injected));
    let unlabelled =
        pod(json!({"metadata": {}, "spec": {"containers": [{"name": "x", "image": "i"}]}}));
    assert!(!needs_replacing(&unlabelled));
    let going = pod(
        json!({"metadata": {"labels": {"asya.sh/inject": "true"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "asya-runtime", "image": "i"}]}}),
    );
    assert!(!needs_replacing(&going));
}

#[test]
fn pods_that_cannot_be_created_say_why_until_they_can() {
    let refused = "Internal error occurred: failed calling webhook \"pods.inject.asya.sh\": \
                   no endpoints available for service \"asya-webhook\"";
    let mut o = base();
    o.workload = Some(WorkloadObs {
        replicas: Some(1),
        ready: 0,
        failure: Some(refused.into()),
    });
    let st = derive(&AsyncActorStatus::default(), &o, now());
    assert_eq!(st.phase.as_deref(), Some("Degraded"));
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == COND_WORKLOAD)
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "FailedCreate")
    );
    assert_eq!(c.message, format!("pods cannot be created: {refused}"));
    // A failing container says more about the pods that exist: it comes first.
    o.pods = vec![PodState::Failing {
        kind: FailKind::Runtime,
        container: "asya-runtime".into(),
        reason: "CrashLoopBackOff".into(),
    }];
    assert_eq!(phase(&o), "RuntimeError");
    // Once the ReplicaSet creates its pod the condition goes, and with it the message.
    o.pods = vec![PodState::Pending];
    o.workload.as_mut().unwrap().failure = None;
    assert_eq!(phase(&o), "Creating");
}

#[test]
fn an_actor_has_messages_while_its_queue_has_any_queued_or_in_process() {
    let with = |queued, processing| {
        let mut o = base();
        o.transport = TransportObs::Ready(
            QueueInfo {
                url: "amqp://h/q".into(),
                identifier: "q".into(),
                created: false,
            },
            Some(QueueDepth { queued, processing }),
        );
        o.has_messages()
    };
    assert!(with(Some(4), None));
    assert!(with(Some(0), Some(1)));
    assert!(!with(Some(0), Some(0)));
    assert!(!with(None, None));
    let mut o = base();
    o.transport = TransportObs::NotAttempted;
    assert!(!o.has_messages());
}

/// An injected pod whose sidecar waits on `reason` and reads the broker password from `secret`.
fn sidecar_reading(secret: &str, reason: &str) -> Pod {
    pod(
        json!({"metadata": {"name": "p", "annotations": {"asya.sh/injected": "s"}},
        "spec": {"containers": [{"name": "asya-runtime", "image": "i"}],
                 "initContainers": [{"name": "asya-sidecar", "image": "s", "restartPolicy": "Always",
                     "env": [{"name": "ASYA_RABBITMQ_PASSWORD",
                              "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}}]}]},
        "status": {"phase": "Pending",
            "initContainerStatuses": [{"name": "asya-sidecar", "ready": false, "restartCount": 0,
                "image": "s", "imageID": "", "state": {"waiting": {"reason": reason}}}]}}),
    )
}

#[test]
fn a_pod_stuck_on_a_secret_the_current_injection_does_not_name_is_stale() {
    let scoped = [
        ("ASYA_RABBITMQ_USERNAME", "asya-broker-rabbitmq"),
        ("ASYA_RABBITMQ_PASSWORD", "asya-broker-rabbitmq"),
    ];
    let shared = [("ASYA_RABBITMQ_PASSWORD", "rabbitmq-admin")];
    // Injected scoped, the configuration now shared: stuck, so stale, naming what it reads.
    let stuck = sidecar_reading("asya-broker-rabbitmq", "CreateContainerConfigError");
    assert_eq!(
        stale_credentials(&stuck, &shared, &[]),
        Some((
            "ASYA_RABBITMQ_PASSWORD".to_string(),
            "asya-broker-rabbitmq".to_string()
        ))
    );
    // The Secret it reads is today's (not written yet, say): waited for, not replaced.
    assert_eq!(stale_credentials(&stuck, &scoped, &[]), None);
    // The actor's own sidecar.env names it: the author's choice, kept.
    assert_eq!(
        stale_credentials(&stuck, &shared, &["ASYA_RABBITMQ_PASSWORD"]),
        None
    );
    // No credential expected at all (SQS over IRSA) still makes a stuck reader stale.
    assert!(stale_credentials(&stuck, &[], &[]).is_some());
    // Running, or stuck for another reason: not ours to replace.
    let pulling = sidecar_reading("asya-broker-rabbitmq", "ImagePullBackOff");
    assert_eq!(stale_credentials(&pulling, &shared, &[]), None);
    let mut running = stuck.clone();
    if let Some(st) = running.status.as_mut() {
        st.init_container_statuses = None;
    }
    assert_eq!(stale_credentials(&running, &shared, &[]), None);
    // Already going.
    let mut going = stuck;
    going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert_eq!(stale_credentials(&going, &shared, &[]), None);
}
