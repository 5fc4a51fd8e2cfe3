//! What the provisioner renders for an actor (`render`): the Deployment or StatefulSet, its
//! labels, grace period and rollout annotation, fixed replicas, KEDA's ScaledObjects for
//! RabbitMQ and SQS with their credentials, the transport Secrets, Pod Security restricted.

use std::collections::BTreeMap;

use asya_api::config::ClusterConfig;
use asya_api::{AsyncActor, FlavorCatalog, ResolvedActor};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

use super::keda::{scaled_object, trigger_authentication};
use super::workload::{deployment, grace_period, stateful_set};
use super::*;

pub fn resolve(obj: Value, config: &ClusterConfig) -> ResolvedActor {
    let actor: AsyncActor = serde_json::from_value(obj).expect("fixture parses");
    let review = asya_api::review::review_typed(&actor, &FlavorCatalog::new(), config);
    assert!(
        review.errors.is_empty(),
        "fixture is valid: {:?}",
        review.errors
    );
    review.resolved.expect("resolved")
}

fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "asya.sh/v1alpha1".into(),
        kind: "AsyncActor".into(),
        name: "doubler".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn flat(spec: Value) -> Value {
    json!({"apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
           "metadata": {"name": "doubler", "namespace": "team"}, "spec": spec})
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("team".to_string(), "nlp".to_string())])
}

#[test]
fn flat_deployment_carries_injection_labels_grace_and_rollout_annotation() {
    let cfg = ClusterConfig::default();
    let a = resolve(
        flat(
            json!({"image": "py:3.12", "handler": "m.double", "env": [{"name": "A", "value": "1"}],
                    "resiliency": {"actorTimeout": "2m"},
                    "secretRefs": [{"name": "s", "keys": [{"key": "k", "envVar": "K"}]}, {"name": "all"}]}),
        ),
        &cfg,
    );
    let d = serde_json::to_value(deployment(&a, &labels(), &owner(), &cfg)).unwrap();
    assert_eq!(d["metadata"]["name"], "doubler");
    assert_eq!(
        d["metadata"]["labels"]["team"], "nlp",
        "actor labels propagate"
    );
    assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(
        d["spec"]["selector"]["matchLabels"],
        json!({"asya.sh/actor": "doubler"})
    );
    assert!(
        d["spec"].get("replicas").is_none(),
        "KEDA owns replicas when scaling"
    );
    let tpl = &d["spec"]["template"];
    assert_eq!(tpl["metadata"]["labels"]["asya.sh/inject"], "true");
    assert_eq!(tpl["metadata"]["labels"]["asya.sh/actor"], "doubler");
    assert_eq!(tpl["metadata"]["labels"]["team"], "nlp");
    assert_eq!(
        tpl["metadata"]["annotations"]["asya.sh/sidecar-image"],
        cfg.sidecar.image.as_str()
    );
    assert_eq!(tpl["spec"]["terminationGracePeriodSeconds"], 150);
    assert_eq!(tpl["spec"]["serviceAccountName"], "asya-doubler");
    let c = &tpl["spec"]["containers"][0];
    assert_eq!(c["name"], "asya-runtime");
    assert_eq!(c["image"], "py:3.12");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert!(c.get("command").is_none(), "the webhook sets the command");
    assert_eq!(c["env"][0], json!({"name": "A", "value": "1"}));
    assert_eq!(
        c["env"][1]["valueFrom"]["secretKeyRef"],
        json!({"name": "s", "key": "k"})
    );
    assert_eq!(c["envFrom"][0]["secretRef"]["name"], "all");
}

#[test]
fn sidecar_image_change_changes_the_pod_template() {
    let cfg = ClusterConfig::default();
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &cfg);
    let mut cfg2 = cfg.clone();
    cfg2.sidecar.image = "reg/asya-sidecar:0.2.0".into();
    let t1 = deployment(&a, &labels(), &owner(), &cfg)
        .spec
        .unwrap()
        .template;
    let t2 = deployment(&a, &labels(), &owner(), &cfg2)
        .spec
        .unwrap()
        .template;
    assert_ne!(t1, t2, "a new sidecar version must roll the pods");
}

#[test]
fn a_change_the_webhook_injects_rolls_the_pods() {
    // The handler reaches the pod through injection, not the template: fixing a handler that
    // crashes on import must still replace the crash-looping pod.
    let cfg = ClusterConfig::default();
    let template = |spec: Value| {
        deployment(&resolve(flat(spec), &cfg), &labels(), &owner(), &cfg)
            .spec
            .unwrap()
            .template
    };
    let broken = template(json!({"image": "i", "handler": "no_such_module.f"}));
    let fixed = template(json!({"image": "i", "handler": "m.f"}));
    assert_ne!(broken, fixed, "a new handler must roll the pods");
    let digest = |t: &k8s_openapi::api::core::v1::PodTemplateSpec| {
        t.metadata.as_ref().unwrap().annotations.as_ref().unwrap()["asya.sh/injection-digest"]
            .clone()
    };
    assert_ne!(digest(&broken), digest(&fixed));
    let env = template(json!({"image": "i", "handler": "m.f",
                              "sidecar": {"env": [{"name": "ASYA_RABBITMQ_URL", "value": "amqp://x"}]}}));
    assert_ne!(env, fixed, "a new sidecar setting must roll the pods");
    assert_eq!(
        template(json!({"image": "i", "handler": "m.f"})),
        fixed,
        "nothing changed, nothing rolls"
    );
}

#[test]
fn fixed_replicas_when_scaling_is_off() {
    let cfg = ClusterConfig::default();
    let a = resolve(
        flat(json!({"image": "i", "handler": "m.f", "scaling": {"enabled": false}, "replicas": 3})),
        &cfg,
    );
    let d = deployment(&a, &labels(), &owner(), &cfg);
    assert_eq!(d.spec.unwrap().replicas, Some(3));
}

#[test]
fn workload_template_becomes_a_statefulset_keeping_user_fields() {
    let cfg = ClusterConfig::default();
    let a = resolve(
        flat(
            json!({"workload": {"kind": "StatefulSet", "template": {"metadata": {"labels": {"x": "y"}},
            "spec": {"terminationGracePeriodSeconds": 900, "containers": [
                {"name": "asya-runtime", "image": "py", "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}}),
        ),
        &cfg,
    );
    assert_eq!(a.workload_kind(), "StatefulSet");
    let s = serde_json::to_value(stateful_set(&a, &labels(), &owner(), &cfg)).unwrap();
    let tpl = &s["spec"]["template"];
    assert_eq!(tpl["metadata"]["labels"]["x"], "y");
    assert_eq!(tpl["metadata"]["labels"]["asya.sh/inject"], "true");
    assert_eq!(
        tpl["spec"]["terminationGracePeriodSeconds"], 900,
        "a longer user grace period stays"
    );
    assert_eq!(tpl["spec"]["containers"][0]["env"][0]["value"], "m.f");
    assert_eq!(
        s["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "data"
    );
    assert_eq!(s["spec"]["serviceName"], "doubler");
}

#[test]
fn grace_period_is_above_actor_timeout() {
    let cfg = ClusterConfig::default();
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &cfg);
    assert!(grace_period(&a) > a.actor_timeout.as_secs() as i64);
}

#[test]
fn rabbitmq_scaled_object() {
    let cfg = ClusterConfig::default();
    let a = resolve(
        flat(json!({"image": "i", "handler": "m.f",
                    "scaling": {"minReplicaCount": 1, "maxReplicaCount": 7, "queueLength": 3, "pollingInterval": 10, "cooldownPeriod": 60}})),
        &cfg,
    );
    let so = scaled_object(
        &a,
        &labels(),
        &owner(),
        &cfg.transports["rabbitmq"],
        None,
        false,
    );
    assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
    let s = &so["spec"];
    assert_eq!(
        s["scaleTargetRef"],
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "doubler"})
    );
    assert_eq!(
        (s["minReplicaCount"].clone(), s["maxReplicaCount"].clone()),
        (json!(1), json!(7))
    );
    assert_eq!(
        (s["pollingInterval"].clone(), s["cooldownPeriod"].clone()),
        (json!(10), json!(60))
    );
    let t = &s["triggers"][0];
    assert_eq!(t["type"], "rabbitmq");
    assert_eq!(t["metadata"]["queueName"], "asya-team-doubler");
    assert_eq!(
        t["metadata"]["value"], "3",
        "KEDA metadata values are strings"
    );
    // The transport's ClusterTriggerAuthentication: no KEDA credential in the namespace.
    assert_eq!(
        t["authenticationRef"],
        json!({"name": "asya-rabbitmq", "kind": "ClusterTriggerAuthentication"})
    );
    let b = &s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
    assert_eq!(
        b["scaleUp"]["stabilizationWindowSeconds"], 0,
        "scale up at once"
    );
    assert!(
        b["scaleDown"]["stabilizationWindowSeconds"]
            .as_i64()
            .unwrap()
            > 0,
        "scale down gradually"
    );
    let ta = trigger_authentication(&a, &labels(), &owner(), &cfg.transports["rabbitmq"]);
    assert_eq!(
        ta, None,
        "no per-namespace TriggerAuthentication for RabbitMQ"
    );
}

#[test]
fn sqs_scaled_object_and_shared_static_credentials() {
    let cfg = ClusterConfig::from_yaml(
        "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {region: eu-west-1, endpoint: 'http://127.0.0.1:4566', credentialsSecretRef: {name: sqs-credentials}, shareStaticCredentials: true}\n",
    )
    .unwrap();
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &cfg);
    let t = &cfg.transports["sqs"];
    let so = scaled_object(
        &a,
        &labels(),
        &owner(),
        t,
        Some("http://q/asya-team-doubler"),
        false,
    );
    let tr = &so["spec"]["triggers"][0];
    assert_eq!(tr["type"], "aws-sqs-queue");
    assert_eq!(tr["metadata"]["queueURL"], "http://q/asya-team-doubler");
    assert_eq!(tr["metadata"]["awsRegion"], "eu-west-1");
    assert_eq!(tr["metadata"]["awsEndpoint"], "http://127.0.0.1:4566");
    assert_eq!(tr["metadata"]["queueLength"], "5");
    assert_eq!(
        tr["authenticationRef"],
        json!({"name": "doubler-trigger-auth"})
    );
    let ta = trigger_authentication(&a, &labels(), &owner(), t).expect("sqs has one");
    assert_eq!(
        ta["spec"]["secretTargetRef"][1]["key"],
        "awsSecretAccessKey"
    );
    let creds = TransportCredentials {
        password: None,
        aws: Some(("AK".into(), "SK".into())),
    };
    let secrets = transport_secrets("team", "sqs", t, &creds);
    let names: Vec<_> = secrets
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["sqs-credentials", "asya-transport-sqs"]);
    assert_eq!(secrets[0].data.as_ref().unwrap()["accessKeyId"].0, b"AK");
}

#[test]
fn sqs_without_keys_uses_pod_identity_and_irsa() {
    let cfg = ClusterConfig::from_yaml(
        "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {region: us-east-1}\nserviceAccount:\n  actorRoleArn: 'arn:aws:iam::1:role/asya-{namespace}-{actor}'\n",
    )
    .unwrap();
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &cfg);
    let ta = trigger_authentication(&a, &labels(), &owner(), &cfg.transports["sqs"]).unwrap();
    // KEDA assumes the actor's own IRSA role, not an identity of its own.
    assert_eq!(
        ta["spec"],
        json!({"podIdentity": {"provider": "aws", "identityOwner": "workload"}})
    );
    assert_eq!(
        keda::sqs_identity_missing("sqs", &cfg.transports["sqs"], &cfg),
        None
    );
    let sa = service_account(&a, &labels(), &owner(), &cfg);
    assert_eq!(
        sa.metadata.annotations.unwrap()["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::1:role/asya-team-doubler"
    );
    assert_eq!(sa.metadata.name.as_deref(), Some("asya-doubler"));
}

#[test]
fn sqs_static_keys_stay_with_the_platform_unless_shared() {
    let cfg = ClusterConfig::from_yaml(
        "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {region: eu-west-1, credentialsSecretRef: {name: sqs-credentials}}\n",
    )
    .unwrap();
    let t = &cfg.transports["sqs"];
    let creds = TransportCredentials {
        password: None,
        aws: Some(("AK".into(), "SK".into())),
    };
    assert!(transport_secrets("team", "sqs", t, &creds).is_empty());
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &cfg);
    let ta = trigger_authentication(&a, &labels(), &owner(), t).unwrap();
    assert_eq!(ta["spec"]["podIdentity"]["identityOwner"], "workload");
    assert!(ta["spec"].get("secretTargetRef").is_none());
    // No role pattern either: the actor cannot authenticate, and the message says which two
    // settings would fix it.
    let why = keda::sqs_identity_missing("sqs", t, &cfg).expect("no identity");
    assert!(
        why.contains("transports.sqs.config.shareStaticCredentials"),
        "{why}"
    );
    assert!(why.contains("actorServiceAccount.roleArn"), "{why}");
    assert_eq!(
        keda::sqs_identity_missing(
            "rabbitmq",
            &ClusterConfig::default().transports["rabbitmq"],
            &cfg
        ),
        None
    );
}

#[test]
fn rabbitmq_secrets_and_url() {
    let cfg = ClusterConfig::default();
    let t = &cfg.transports["rabbitmq"];
    assert_eq!(
        amqp_url(&t.config, Some("p@ss")),
        "amqp://guest:p%40ss@rabbitmq:5672/%2F"
    );
    let mut local = t.config.clone();
    local.host = Some("127.0.0.1".into());
    local.port = None;
    assert_eq!(amqp_url(&local, None), "amqp://guest@127.0.0.1:5672/%2F");
    let creds = TransportCredentials {
        password: Some("pw".into()),
        aws: None,
    };
    // Scoped identity (the default): nothing of the platform's is copied into the namespace
    // (the sidecars use its own identity, KEDA its ClusterTriggerAuthentication).
    let s = transport_secrets("team", "rabbitmq", t, &creds);
    assert!(s.is_empty(), "{s:?}");
    // shareAdminCredentials: copied under its own name, as before.
    let mut shared = t.clone();
    shared.config.share_admin_credentials = true;
    let s = transport_secrets("team", "rabbitmq", &shared, &creds);
    assert_eq!(s[0].metadata.name.as_deref(), Some("rabbitmq-secret"));
    assert_eq!(s[0].data.as_ref().unwrap()["password"].0, b"pw");
    // KEDA's `host` is no longer copied into the namespace (crate::keda_identity).
    assert_eq!(s.len(), 1);
}

#[test]
fn keda_reads_rabbitmq_over_the_management_api_when_configured() {
    // With the management API, KEDA counts unacknowledged messages too (a sidecar holds up to
    // its prefetch): the trigger's protocol and the secret's host agree.
    let cfg = ClusterConfig::from_yaml(
        "transports:\n  rabbitmq:\n    type: rabbitmq\n    config: {host: 10.0.0.5, port: 5672, tls: false, managementPort: 15672, vhost: team/a, passwordSecretRef: {name: rabbitmq-secret, key: password}}\n",
    )
    .unwrap();
    let t = &cfg.transports["rabbitmq"];
    assert_eq!(keda_rabbitmq_protocol(&t.config), "http");
    assert_eq!(
        keda_rabbitmq_host(&t.config, Some("p@ss")),
        "http://guest:p%40ss@10.0.0.5:15672/team%2Fa"
    );
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &cfg);
    let so = scaled_object(&a, &labels(), &owner(), t, None, false);
    assert_eq!(so["spec"]["triggers"][0]["metadata"]["protocol"], "http");
    let creds = TransportCredentials {
        password: Some("pw".into()),
        aws: None,
    };
    let s = transport_secrets("team", "rabbitmq", t, &creds);
    assert!(
        s.iter()
            .all(|s| !s.data.as_ref().unwrap().contains_key("host")),
        "KEDA's host URL lives in KEDA's namespace only"
    );

    // Without it: AMQP, ready messages only.
    let mut amqp = t.clone();
    amqp.config.management_port = None;
    assert_eq!(keda_rabbitmq_protocol(&amqp.config), "amqp");
    assert_eq!(
        keda_rabbitmq_host(&amqp.config, None),
        "amqp://guest@10.0.0.5:5672/team%2Fa"
    );
    let so = scaled_object(&a, &labels(), &owner(), &amqp, None, false);
    assert_eq!(so["spec"]["triggers"][0]["metadata"]["protocol"], "amqp");
}

#[test]
fn a_flat_actors_deployment_meets_pod_security_restricted() {
    let cfg = ClusterConfig::default();
    let a = resolve(
        flat(json!({"image": "python:3.12", "handler": "m.f",
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]})),
        &cfg,
    );
    let d = deployment(&a, &labels(), &owner(), &cfg);
    let spec = d.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        asya_api::restricted::restricted_violations(&spec),
        Vec::<String>::new()
    );
    // A root image runs as our images' non-root uid instead of being refused by the kubelet.
    let pod = spec.security_context.unwrap();
    assert_eq!(
        (pod.run_as_user, pod.run_as_group, pod.fs_group),
        (Some(65532), Some(65532), Some(65532))
    );
    let c = spec.containers[0].security_context.clone().unwrap();
    assert_eq!(
        c.read_only_root_filesystem, None,
        "a handler may write its files"
    );
}

#[test]
fn a_workload_templates_security_settings_are_the_users() {
    let cfg = ClusterConfig::default();
    let a = resolve(
        flat(json!({"workload": {"template": {"spec": {
            "securityContext": {"runAsUser": 0},
            "containers": [{"name": "asya-runtime", "image": "py",
                            "securityContext": {"readOnlyRootFilesystem": true},
                            "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}]}}}})),
        &cfg,
    );
    let d = serde_json::to_value(deployment(&a, &labels(), &owner(), &cfg)).unwrap();
    let spec = &d["spec"]["template"]["spec"];
    assert_eq!(spec["securityContext"], json!({"runAsUser": 0}));
    assert_eq!(
        spec["containers"][0]["securityContext"],
        json!({"readOnlyRootFilesystem": true})
    );
}

/// What decides a pod's privileges (docs/DESIGN.md §9): the webhook judges the pod it
/// rebuilds with `asya_api::privilege::RenderedPod`, so that pod must be, in all of this, the
/// one rendered here.
fn privilege_view(spec: &k8s_openapi::api::core::v1::PodSpec) -> Value {
    let containers: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| json!([c.name, c.security_context, c.ports]))
        .collect();
    json!({
        "volumes": spec.volumes, "hostNetwork": spec.host_network, "hostPID": spec.host_pid,
        "hostIPC": spec.host_ipc, "sa": spec.service_account_name, "saAlias": spec.service_account,
        "securityContext": spec.security_context, "containers": containers,
    })
}

#[test]
fn the_webhook_judges_the_pod_rendered_here() {
    let cfg = ClusterConfig::default();
    let specs = [
        json!({"image": "python:3.12", "handler": "m.f",
               "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
               "volumeMounts": [{"name": "h", "mountPath": "/h"}]}),
        json!({"workload": {"template": {"spec": {"hostNetwork": true, "containers": [
            {"name": "asya-runtime", "image": "i", "env": [{"name": "ASYA_HANDLER", "value": "m.f"}],
             "securityContext": {"privileged": true}, "ports": [{"containerPort": 1, "hostPort": 1}]}]}}}}),
        json!({"workload": {"kind": "StatefulSet", "template": {"spec": {"serviceAccountName": "other",
            "containers": [{"name": "asya-runtime", "image": "i",
                            "env": [{"name": "ASYA_HANDLER", "value": "m.f"}]}]}}}}),
    ];
    for spec in specs {
        let a = resolve(flat(spec.clone()), &cfg);
        let rendered = if a.workload_kind() == "StatefulSet" {
            stateful_set(&a, &labels(), &owner(), &cfg)
                .spec
                .unwrap()
                .template
        } else {
            deployment(&a, &labels(), &owner(), &cfg)
                .spec
                .unwrap()
                .template
        };
        let judged = asya_api::privilege::RenderedPod::of(&a);
        assert_eq!(
            privilege_view(&judged.spec),
            privilege_view(rendered.spec.as_ref().unwrap()),
            "{spec}"
        );
    }
}

/// docs/DESIGN.md §6.1: with wake-up on, a second trigger on the actor's wake queue, with the
/// same identity, a target no depth reaches and activation at the first message; off, none.
#[test]
fn wake_up_adds_a_second_trigger_on_the_wake_queue_with_the_same_identity() {
    let rabbit = ClusterConfig::default();
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &rabbit);
    let t = &rabbit.transports["rabbitmq"];
    let so = scaled_object(&a, &labels(), &owner(), t, None, true);
    let tr = so["spec"]["triggers"].as_array().unwrap();
    assert_eq!(tr.len(), 2);
    assert_eq!(tr[1]["type"], "rabbitmq");
    assert_eq!(tr[1]["authenticationRef"], tr[0]["authenticationRef"]);
    assert_eq!(
        tr[1]["metadata"],
        json!({"protocol": tr[0]["metadata"]["protocol"], "queueName": "asya-team-doubler_wake",
               "mode": "QueueLength", "value": "1000000", "activationValue": "0"})
    );
    assert_eq!(tr[0]["metadata"].get("activationValue"), None);
    let off = scaled_object(&a, &labels(), &owner(), t, None, false);
    assert_eq!(off["spec"]["triggers"].as_array().unwrap().len(), 1);

    let sqs = ClusterConfig::from_yaml(
        "defaultTransport: sqs\ntransports:\n  sqs:\n    type: sqs\n    config: {region: eu-west-1, endpoint: 'http://127.0.0.1:4566'}\n",
    )
    .unwrap();
    let a = resolve(flat(json!({"image": "i", "handler": "m.f"})), &sqs);
    let t = &sqs.transports["sqs"];
    let url = "http://q:9324/000000000000/asya-team-doubler";
    let so = scaled_object(&a, &labels(), &owner(), t, Some(url), true);
    let tr = so["spec"]["triggers"].as_array().unwrap();
    assert_eq!(tr.len(), 2);
    assert_eq!(tr[1]["type"], "aws-sqs-queue");
    assert_eq!(tr[1]["authenticationRef"], tr[0]["authenticationRef"]);
    let md = &tr[1]["metadata"];
    assert_eq!(
        md["queueURL"],
        "http://q:9324/000000000000/asya-team-doubler_wake"
    );
    assert_eq!(md["queueLength"], "1000000");
    assert_eq!(md["activationQueueLength"], "0");
    assert_eq!(md["awsRegion"], tr[0]["metadata"]["awsRegion"]);
    // No URL to derive the wake queue's from: no wake trigger (never one on a wrong queue).
    let so = scaled_object(&a, &labels(), &owner(), t, Some("http://q/other"), true);
    assert_eq!(so["spec"]["triggers"].as_array().unwrap().len(), 1);
}

#[test]
fn a_sibling_queue_url_replaces_only_the_queue_name() {
    assert_eq!(
        keda::sibling_queue_url("http://h/1/asya-a-b", "asya-a-b", "asya-a-b_wake").as_deref(),
        Some("http://h/1/asya-a-b_wake")
    );
    assert_eq!(
        keda::sibling_queue_url("http://h/1/xasya-a-b", "asya-a-b", "w"),
        None
    );
    assert_eq!(
        keda::sibling_queue_url("http://h/1/other", "asya-a-b", "w"),
        None
    );
}
