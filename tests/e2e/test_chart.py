"""The Helm chart deploy/chart (issue 3), proven against the real test cluster."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest
import yaml

from asya_e2e.env import CHART, CRDS, ROOT, bin_dir, crds_generated
from asya_e2e.kube import helm, kubectl, kubectl_json, run
from asya_e2e.wait import wait_for

E2E_VALUES = ROOT / "tests" / "e2e" / "values.yaml"
needs_crds = pytest.mark.skipif(not crds_generated(), reason="deploy/crds not generated yet (make crds; API crate)")


def render(*args, release="asya", namespace="asya-system"):
    out = helm("template", release, CHART, "-n", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def rendered_config(*args):
    docs = render(*args, "--show-only", "templates/configmap.yaml")
    assert len(docs) == 1 and docs[0]["metadata"]["name"] == "asya-config"
    return yaml.safe_load(docs[0]["data"]["config.yaml"])


@pytest.mark.parametrize("values", [[], ["-f", E2E_VALUES], ["--set", "certManager.enabled=true"]],
                         ids=["defaults", "e2e-values", "cert-manager"])
def test_helm_lint_passes(values):
    out = helm("lint", "--strict", CHART, *values, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def test_config_map_renders_cluster_config_from_values():
    cfg = rendered_config()
    assert cfg["defaultTransport"] == "rabbitmq"
    assert cfg["transports"]["rabbitmq"] == {
        "enabled": True,
        "type": "rabbitmq",
        "config": {
            "host": "rabbitmq.default.svc.cluster.local",
            "port": 5672,
            "vhost": "/",
            "username": "guest",
            "passwordSecretRef": {"name": "rabbitmq-secret", "key": "password"},
            "tls": False,
            "managementPort": 15672,
            "shareAdminCredentials": False,
        },
    }
    # Empty optional strings are left out, not passed as "".
    assert cfg["transports"]["sqs"] == {"enabled": False, "type": "sqs", "config": {"region": "us-east-1"}}
    assert cfg["sidecar"]["image"] and cfg["sidecar"]["imagePullPolicy"] == "IfNotPresent"
    assert cfg["policy"]["allowCrossNamespaceSecretRefs"] is False
    assert cfg["policy"]["maxReplicas"] == 100
    # Issue 34: the spec cap at its default, no per-namespace actor limit unless set.
    assert cfg["policy"]["maxSpecBytes"] == 65536
    assert "maxActorsPerNamespace" not in cfg["policy"]
    assert rendered_config("--set", "policy.maxActorsPerNamespace=20")["policy"]["maxActorsPerNamespace"] == 20
    assert "serviceAccount" not in cfg

    # Seed 001's SQS operator values, with one role per namespace (issue 34: required).
    cfg = rendered_config("--set", "transports.rabbitmq.enabled=false", "--set", "transports.sqs.enabled=true",
                          "--set", "actorServiceAccount.roleArn=arn:aws:iam::123456789012:role/asya-{namespace}-{actor}")
    assert cfg["defaultTransport"] == "sqs"
    assert cfg["serviceAccount"] == {"actorRoleArn": "arn:aws:iam::123456789012:role/asya-{namespace}-{actor}"}


def images_of(*args) -> dict[str, str]:
    """Every image the chart names: its Deployments' containers and the configured sidecar."""
    out = {}
    for d in render(*args):
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                out[d["metadata"]["name"]] = c["image"]
    out["sidecar"] = rendered_config(*args)["sidecar"]["image"]
    return out


def test_images_default_to_the_release_and_follow_the_registry_switch():
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert images_of() == {
        "asya-webhook": f"ghcr.io/asya-rs/asya-webhook:{version}",
        "asya-provisioner": f"ghcr.io/asya-rs/asya-queue-provisioner:{version}",
        "sidecar": f"ghcr.io/asya-rs/asya-sidecar:{version}",
    }
    # One switch points every image at a mirror (and one tag at a build).
    mirrored = images_of("--set", "global.imageRegistry=mirror.example.com:5000/platform/asya",
                         "--set", "global.imageTag=dev")
    assert mirrored == {
        "asya-webhook": "mirror.example.com:5000/platform/asya/asya-webhook:dev",
        "asya-provisioner": "mirror.example.com:5000/platform/asya/asya-queue-provisioner:dev",
        "sidecar": "mirror.example.com:5000/platform/asya/asya-sidecar:dev",
    }
    # A component's own tag, and a full reference, win over the switch.
    own = images_of("--set", "global.imageRegistry=mirror.example.com/asya", "--set", "webhook.image.tag=1.2.3",
                    "--set", "sidecar.image=other.example.com/sidecar:9")
    assert own["asya-webhook"] == "mirror.example.com/asya/asya-webhook:1.2.3"
    assert own["sidecar"] == "other.example.com/sidecar:9"
    # The gateway and the crew's end actors follow the switch too.
    text = helm("template", "asya", CHART, "-n", "asya-system", "--set", "global.imageRegistry=mirror.example.com/asya",
                "--set", "gateway.enabled=true", "--set", "crew.happy-end.enabled=true").stdout
    assert f"image: mirror.example.com/asya/asya-gateway:{version}" in text
    assert f"image: mirror.example.com/asya/asya-crew:{version}" in text
    # The chart's default agrees with the platform's built-in default (api DEFAULT_SIDECAR_IMAGE).
    cargo = (ROOT / "Cargo.toml").read_text()
    assert f'version = "{version}"' in cargo, "Chart appVersion and the workspace version differ"


def test_rendered_webhook_configurations_follow_the_contract():
    docs = render("--show-only", "templates/webhook-configurations.yaml", namespace="platform")
    by_kind = {d["kind"]: d for d in docs}
    mutating = {w["name"]: w for w in by_kind["MutatingWebhookConfiguration"]["webhooks"]}
    # One webhook call per AsyncActor: the mutating webhook validates too (issue 24), and the
    # validating configuration exists only with webhook.validateActorsSeparately.
    assert "ValidatingWebhookConfiguration" not in by_kind, sorted(by_kind)
    both = {d["kind"]: d for d in render("--show-only", "templates/webhook-configurations.yaml",
                                         "--set", "webhook.validateActorsSeparately=true", namespace="platform")}
    validating = {w["name"]: w for w in both["ValidatingWebhookConfiguration"]["webhooks"]}
    pods = mutating["pods.inject.asya.sh"]
    assert pods["objectSelector"] == {"matchExpressions": [{"key": "asya.sh/inject", "operator": "In", "values": ["true"]}]}
    assert pods["reinvocationPolicy"] == "IfNeeded"
    assert pods["rules"][0]["resources"] == ["pods"] and pods["rules"][0]["operations"] == ["CREATE"]
    for w in [*mutating.values(), *validating.values()]:
        assert w["sideEffects"] == "None"
        assert w["timeoutSeconds"] == 10
        assert w["failurePolicy"] == "Fail"
        excluded = w["namespaceSelector"]["matchExpressions"][0]
        assert excluded["key"] == "kubernetes.io/metadata.name" and excluded["operator"] == "NotIn"
        assert set(excluded["values"]) == {"kube-system", "platform"}
        assert w["clientConfig"]["service"]["name"] == "asya-webhook"
        assert w["clientConfig"]["service"]["namespace"] == "platform"
    assert "objectSelector" not in mutating["asyncactors.mutate.asya.sh"]  # every AsyncActor
    assert validating["asyncactors.validate.asya.sh"]["rules"][0]["resources"] == ["asyncactors"]

    docs = render("--show-only", "templates/webhook-configurations.yaml",
                  "--set", "webhook.failurePolicy.pods=Ignore", "--set", "webhook.timeoutSeconds=3")
    pods = {w["name"]: w for w in docs[0]["webhooks"]}["pods.inject.asya.sh"]
    assert pods["failurePolicy"] == "Ignore" and pods["timeoutSeconds"] == 3


def test_rbac_is_least_privilege():
    docs = render("--show-only", "templates/rbac.yaml")
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for (kind, _), role in roles.items():
        if kind not in ("ClusterRole", "Role"):
            continue
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
            assert "*" not in rule.get("apiGroups", []), rule
    webhook = roles[("ClusterRole", "asya-webhook")]["rules"]
    # The webhook only reads, except caBundle on its own two configurations, and
    # SubjectAccessReviews (a question to the authorizer: nothing is stored).
    for rule in webhook:
        writes = set(rule["verbs"]) - {"get", "list", "watch"}
        if rule["apiGroups"] == ["authorization.k8s.io"]:
            assert rule["resources"] == ["subjectaccessreviews"] and rule["verbs"] == ["create"], rule
        elif writes:
            assert rule["apiGroups"] == ["admissionregistration.k8s.io"] and rule["resourceNames"] == ["asya-webhook"], rule
    # Namespaces: `get` only (their Pod Security label), never list or watch.
    ns_rules = [r for r in webhook if "namespaces" in r["resources"]]
    assert ns_rules == [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}], ns_rules
    # Its TLS Secret: read and replaced by name; `create` (which RBAC cannot limit by name)
    # only in the release namespace, so the certificates can be regenerated after a delete.
    secret_rules = roles[("Role", "asya-webhook")]["rules"]
    assert secret_rules[0]["resourceNames"] == ["asya-webhook-tls"] and secret_rules[0]["verbs"] == ["get", "update"]
    assert secret_rules[1] == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}
    # The provisioner never lists Secrets, and reads, writes and deletes in actors' namespaces
    # only the names it puts there (each namespace's broker identity `asya-broker-*` is read
    # back: its password is kept nowhere else; docs/DESIGN.md §9).
    # It reads the names it writes (`get`, next to `patch`) to see whose they are before it
    # writes: a Secret of that name that is not its own is not taken over. The one other read:
    # copies of credentials older releases left in actor namespaces (here KEDA's
    # asya-transport-<rabbitmq transport>), read to check they are ours before they are deleted.
    prov = roles[("ClusterRole", "asya-provisioner")]["rules"]
    for rule in prov:
        if "secrets" in rule["resources"]:
            assert not {"list", "watch"} & set(rule["verbs"]), rule
            assert rule["verbs"] == ["create"] or rule.get("resourceNames"), rule
            if rule["verbs"] == ["get", "delete"]:
                assert rule["resourceNames"] == ["asya-transport-rabbitmq"], rule
            elif "get" in rule["verbs"]:
                assert "patch" in rule["verbs"] and rule.get("resourceNames"), rule
    assert any("asya-broker-rabbitmq" in r.get("resourceNames", []) and {"get", "delete"} <= set(r["verbs"])
               for r in prov if "secrets" in r["resources"]), prov
    # KEDA's RabbitMQ credential: its ClusterTriggerAuthentication by name, its Secret in
    # KEDA's namespace by name (create cannot be limited by name).
    cta = [r for r in prov if "clustertriggerauthentications" in r["resources"]]
    assert cta == [{"apiGroups": ["keda.sh"], "resources": ["clustertriggerauthentications"], "verbs": ["create"]},
                   {"apiGroups": ["keda.sh"], "resources": ["clustertriggerauthentications"],
                    "resourceNames": ["asya-rabbitmq"], "verbs": ["patch"]}], cta
    keda_role = roles[("Role", "asya-provisioner-keda")]
    assert keda_role["metadata"]["namespace"] == "keda"
    assert keda_role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["asya-keda-rabbitmq"], "verbs": ["get", "patch"]},
    ], keda_role["rules"]
    # QueueClaims (docs/DESIGN.md §9): the webhook reads them; the provisioner reads, creates
    # and deletes them, and never changes one in place. Nothing here gives a tenant access.
    assert any(r["apiGroups"] == ["asya.sh"] and "queueclaims" in r["resources"]
               and r["verbs"] == ["list", "watch"] for r in webhook), webhook
    qc = [r for r in prov if "queueclaims" in r["resources"]]
    assert qc == [{"apiGroups": ["asya.sh"], "resources": ["queueclaims"],
                   "verbs": ["get", "list", "watch", "create", "delete"]}], qc
    prov_ns = roles[("Role", "asya-provisioner")]["rules"]
    reads = [r for r in prov_ns if "secrets" in r["resources"]]
    assert reads and all(r["verbs"] == ["get"] and r["resourceNames"] for r in reads), reads


def test_cert_manager_mode_renders_certificate_and_ca_injection():
    docs = render("--set", "certManager.enabled=true")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Certificate", "asya-webhook") in kinds and ("Issuer", "asya-webhook-selfsigned") in kinds
    assert ("Secret", "asya-webhook-tls") not in kinds  # cert-manager owns it
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    # A chain, not a self-signed serving certificate: the self-signed issuer makes a CA once,
    # the CA issuer signs the serving certificate, so caBundle survives its renewals.
    assert certs["asya-webhook-ca"]["spec"]["isCA"] is True
    assert certs["asya-webhook-ca"]["spec"]["issuerRef"] == {"name": "asya-webhook-selfsigned", "kind": "Issuer"}
    assert issuers["asya-webhook-ca"]["spec"] == {"ca": {"secretName": "asya-webhook-ca"}}
    cert = certs["asya-webhook"]
    assert cert["spec"]["issuerRef"] == {"name": "asya-webhook-ca", "kind": "Issuer"}
    assert "asya-webhook.asya-system.svc" in cert["spec"]["dnsNames"]
    for d in docs:
        if d["kind"].endswith("WebhookConfiguration"):
            assert d["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "asya-system/asya-webhook"
    deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "asya-webhook")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls-cert=/etc/asya/tls/tls.crt" in args
    # A given issuer replaces the chart's own CA.
    docs = render("--set", "certManager.enabled=true", "--set", "certManager.issuerRef.name=corp",
                  "--set", "certManager.issuerRef.kind=ClusterIssuer")
    assert [d["spec"]["issuerRef"] for d in docs if d["kind"] == "Certificate"] == [{"name": "corp", "kind": "ClusterIssuer"}]
    assert not [d for d in docs if d["kind"] == "Issuer"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "webhook.podDisruptionBudget.minAvailable=2"],
         "webhook.podDisruptionBudget.minAvailable (2) must be below webhook.replicas (2)"),
        (["--set", "webhook.externalURL=https://10.0.0.1:9443"], "webhook.caBundle is required with webhook.externalURL"),
        (["--set", "webhook.caBundle=Zm9v"], "webhook.caBundle is only for webhook.externalURL"),
    ],
    ids=["pdb-blocks-drains", "external-url-without-ca", "ca-bundle-without-external-url"],
)
def test_inconsistent_values_fail_with_a_clear_message(args, expected):
    out = helm("template", "asya", CHART, *args, check=False)
    assert out.returncode != 0, out.stdout
    assert expected in out.stderr, out.stderr


def test_external_url_leaves_ca_bundle_to_the_values():
    docs = render("--set", "webhook.externalURL=https://10.0.0.1:9443", "--set", "webhook.caBundle=Zm9v")
    deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "asya-webhook")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--mutating-webhook-config", "--validating-webhook-config"))], args
    for d in docs:
        if d["kind"].endswith("WebhookConfiguration"):
            for w in d["webhooks"]:
                assert w["clientConfig"]["caBundle"] == "Zm9v"
                assert w["clientConfig"]["url"].startswith("https://10.0.0.1:9443/")


def test_transport_without_enabled_is_on_as_in_the_cluster_config():
    cfg = rendered_config("--set", "transports.extra.type=rabbitmq", "--set", "transports.extra.config.host=rmq2")
    assert cfg["transports"]["extra"]["enabled"] is True


def test_log_levels_reach_the_variables_the_binaries_read():
    docs = render()
    env = {d["metadata"]["name"]: {e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
           for d in docs if d["kind"] == "Deployment"}
    assert env["asya-webhook"]["ASYA_LOG_LEVEL"] == "info,kube=warn,hyper=warn"
    assert env["asya-provisioner"]["RUST_LOG"] == "info,kube=warn,lapin=off"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "webhook.timeoutSeconds=99"], "timeoutSeconds"),
        (["--set", "webhook.failurePolicy.pods=Sometimes"], "pods"),
        (["--set", "transports.rabbitmq.type=kafka"], "type"),
        (["--set", "webhok.replicas=3"], "webhok"),
        (["--set", "policy.maxReplicas=0"], "maxReplicas"),
        (["--set", "sidecar.imagePullPolicy=Sometimes"], "imagePullPolicy"),
        (["--set", "certManager.issuerRef.kind=ClusterIssuer"], "missing property 'name'"),
    ],
    ids=["timeout-too-large", "bad-failure-policy", "unknown-transport-type", "typo-key", "zero-max-replicas",
         "bad-pull-policy", "issuer-without-name"],
)
def test_install_with_bad_value_fails_on_schema(args, expected):
    release = f"bad-{uuid.uuid4().hex[:6]}"
    out = helm("install", release, CHART, "-n", "asya-bad", "--create-namespace", "--dry-run=server", *args, check=False)
    assert out.returncode != 0, out.stdout
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert expected in out.stderr, out.stderr
    assert helm("status", release, "-n", "asya-bad", check=False).returncode != 0


def test_default_transport_must_be_enabled():
    out = helm("template", "asya", CHART, "--set", "defaultTransport=sqs", check=False)
    assert out.returncode != 0
    assert 'defaultTransport: "sqs" is not an enabled transport' in out.stderr, out.stderr


def keda_namespace_exists() -> bool:
    return kubectl("get", "namespace", "keda", check=False).returncode == 0


@pytest.fixture
def installed_release():
    """`helm install` of the chart into the cluster; uninstalled afterwards."""
    release = f"chart-{uuid.uuid4().hex[:6]}"
    ns = f"{release}-system"
    # A second release beside tests/e2e/up's: its pods do not tolerate the test node's taint,
    # so they stay Pending (two provisioners would both reconcile every actor), and with
    # failure policy Fail its webhook would refuse other tests' AsyncActors meanwhile.
    args = ["--set", "webhook.failurePolicy.asyncActors=Ignore", "--set", "webhook.failurePolicy.pods=Ignore"]
    if not keda_namespace_exists():
        # A Role in a namespace that does not exist fails the install (values.yaml: keda).
        args += ["--set", "keda.namespace="]
    if not crds_generated():
        args.append("--skip-crds")
    out = helm("install", release, CHART, "-n", ns, "--create-namespace", *args, "--wait=false", timeout=300)
    yield release, ns, out
    helm("uninstall", release, "-n", ns, "--wait=false", check=False)
    kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_helm_install_every_object_accepted(installed_release):
    release, ns, out = installed_release
    assert "STATUS: deployed" in out.stdout, out.stdout
    manifest = [d for d in yaml.safe_load_all(helm("get", "manifest", release, "-n", ns).stdout) if d]
    kinds = sorted({d["kind"] for d in manifest})
    assert kinds == sorted({
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "MutatingWebhookConfiguration",
        "NetworkPolicy", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount",
    }), kinds
    for d in manifest:
        meta = d["metadata"]
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        args = ["get", d["kind"].lower() + (f".{group}" if group else ""), meta["name"]]
        if meta.get("namespace"):
            args += ["-n", meta["namespace"]]
        live = kubectl_json(*args)
        assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
    webhook = kubectl_json("get", "deployment", f"{release}-webhook", "-n", ns)
    assert webhook["spec"]["replicas"] == 2
    # The controller manager acts on the installed Deployments: ReplicaSets and Pods appear.
    wait_for("the webhook's 2 pods (Pending: not on the tainted test node)", lambda: len(
        kubectl_json("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=webhook")["items"]) == 2)
    cfg = yaml.safe_load(kubectl_json("get", "configmap", "asya-config", "-n", ns)["data"]["config.yaml"])
    assert cfg["defaultTransport"] == "rabbitmq"
    if crds_generated():
        assert kubectl("get", "crd", "asyncactors.asya.sh").returncode == 0


def test_helm_upgrade_changes_config_and_rolls_pods(installed_release):
    release, ns, _ = installed_release
    before = kubectl_json("get", "deployment", f"{release}-provisioner", "-n", ns)
    args = ["--set", "webhook.failurePolicy.asyncActors=Ignore", "--set", "webhook.failurePolicy.pods=Ignore",
            "--set", "policy.maxReplicas=7"]
    if not crds_generated():
        args.append("--skip-crds")
    out = helm("upgrade", release, CHART, "-n", ns, *args, "--wait=false", timeout=300)
    assert "STATUS: deployed" in out.stdout and "REVISION: 2" in out.stdout, out.stdout
    cfg = yaml.safe_load(kubectl_json("get", "configmap", "asya-config", "-n", ns)["data"]["config.yaml"])
    assert cfg["policy"]["maxReplicas"] == 7
    after = kubectl_json("get", "deployment", f"{release}-provisioner", "-n", ns)
    key = "checksum/config"
    # The config checksum on the pod template rolls the pods, so they read the new config.
    assert after["spec"]["template"]["metadata"]["annotations"][key] != \
        before["spec"]["template"]["metadata"]["annotations"][key]


def test_installed_rbac_grants_exactly_what_each_component_needs(installed_release):
    release, ns, _ = installed_release
    webhook = f"system:serviceaccount:{ns}:{release}-webhook"
    prov = f"system:serviceaccount:{ns}:{release}-provisioner"

    def can(user, *args):
        out = kubectl("auth", "can-i", *args, f"--as={user}", check=False)
        return out.stdout.strip() == "yes"

    # The webhook: reads its caches, patches caBundle of its own configurations only, and
    # reads/updates its own TLS Secret only.
    assert can(webhook, "watch", "asyncactors.asya.sh", "-A")
    assert can(webhook, "list", "flavors.asya.sh")
    assert can(webhook, "watch", "queueclaims.asya.sh")
    assert not can(webhook, "create", "queueclaims.asya.sh")
    assert can(webhook, "patch", f"mutatingwebhookconfigurations/{release}-webhook")
    assert not can(webhook, "patch", "mutatingwebhookconfigurations/someone-elses")
    assert can(webhook, "update", f"secrets/{release}-webhook-tls", "-n", ns)
    assert can(webhook, "create", "secrets", "-n", ns)
    assert not can(webhook, "create", "secrets", "-n", "default")
    assert not can(webhook, "get", "secrets/other", "-n", ns)
    assert not can(webhook, "update", "mutatingwebhookconfigurations", f"{release}-webhook")
    assert not can(webhook, "create", "asyncactors.asya.sh", "-n", "default")
    assert not can(webhook, "create", "pods", "-n", "default")
    # The provisioner: its actors' status and finalizers, the workloads and KEDA objects it
    # owns, its Lease; never webhook configurations or cluster-wide secret listing.
    assert can(prov, "patch", "asyncactors.asya.sh", "--subresource=status", "-n", "default")
    assert can(prov, "update", "asyncactors.asya.sh", "--subresource=finalizers", "-n", "default")
    assert not can(prov, "update", "asyncactors.asya.sh", "-n", "default")
    assert can(prov, "create", "deployments.apps", "-n", "default")
    assert can(prov, "delete", "scaledobjects.keda.sh", "-n", "default")
    assert can(prov, "create", "queueclaims.asya.sh") and can(prov, "delete", "queueclaims.asya.sh")
    assert not can(prov, "patch", "queueclaims.asya.sh")
    assert can(prov, "create", "leases.coordination.k8s.io", "-n", ns)
    assert can(prov, "update", "leases.coordination.k8s.io/asya-queue-provisioner", "-n", ns)
    assert not can(prov, "update", "leases.coordination.k8s.io/kube-scheduler", "-n", "kube-system")
    assert not can(prov, "list", "secrets", "-A")
    assert not can(prov, "get", "secrets/anything", "-n", "default")
    # The namespace's own broker identity, by name; KEDA's credential is not in actor
    # namespaces (it lives in KEDA's namespace behind a ClusterTriggerAuthentication).
    assert can(prov, "get", "secrets/asya-broker-rabbitmq", "-n", "default")
    assert can(prov, "delete", "secrets/asya-broker-rabbitmq", "-n", "default")
    assert not can(prov, "patch", "secrets/asya-transport-rabbitmq", "-n", "default")
    assert not can(prov, "patch", "secrets/someone-elses", "-n", "default")
    if keda_namespace_exists():
        assert can(prov, "patch", "secrets/asya-keda-rabbitmq", "-n", "keda")
        assert not can(prov, "get", "secrets/someone-elses", "-n", "keda")
    assert can(prov, "patch", "clustertriggerauthentications.keda.sh/asya-rabbitmq")
    assert not can(prov, "patch", "clustertriggerauthentications.keda.sh/someone-elses")
    # Pods: list/watch for status, delete to replace one without the sidecar, create only for
    # the dry-run probe of injection (no more power than creating Deployments).
    assert can(prov, "create", "pods", "-n", "default") and can(prov, "delete", "pods", "-n", "default")
    assert not can(prov, "create", "pods", "--subresource=exec", "-n", "default")
    assert not can(prov, "patch", "mutatingwebhookconfigurations")
    assert not can(prov, "create", "clusterroles.rbac.authorization.k8s.io")


def test_chart_crds_are_the_generated_ones():
    chart_crds = CHART / "crds"
    assert chart_crds.is_symlink() and chart_crds.resolve() == CRDS.resolve(), \
        "deploy/chart/crds must point at deploy/crds (one source for the CRDs)"


@needs_crds
def test_kubectl_explain_prints_field_descriptions():
    out = kubectl("explain", "asyncactor.spec").stdout
    assert "KIND:" in out and "AsyncActor" in out
    assert "FIELDS:" in out
    # Every top-level field of the flat shape is documented.
    for field in ("actor", "image", "handler", "scaling", "resiliency"):
        assert f"\n  {field}\t" in out or f"\n  {field} " in out, f"{field} missing in:\n{out}"
    described = [line for line in out.splitlines() if line.startswith("    ") and line.strip()]
    assert len(described) >= 10, out


@needs_crds
def test_kubectl_get_asyas_shows_printer_columns(namespace):
    actor = {
        "apiVersion": "asya.sh/v1alpha1",
        "kind": "AsyncActor",
        "metadata": {"name": "echo", "namespace": namespace},
        "spec": {"actor": "echo", "image": "python:3.12-slim", "handler": "echo.handler.process"},
    }
    kubectl("apply", "-f", "-", input=json.dumps(actor))
    default_cols = ["NAME", "STATUS", "RUNNING", "PENDING", "FAILING", "MIN", "MAX", "LAST-SCALE", "AGE"]
    wide_cols = ["DESIRED", "WORKLOAD", "TRANSPORT", "SCALING", "QUEUED", "PROCESSING"]
    wide = kubectl("get", "asya", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert [c for c in wide if c in default_cols] == default_cols, wide
    assert [c for c in wide if c in wide_cols] == wide_cols, wide
    header = kubectl("get", "asyas", "-n", namespace).stdout.splitlines()[0].split()
    assert header == default_cols, header


WEBHOOK_BIN = Path(bin_dir()) / "asya-webhook"


@pytest.mark.skipif(not WEBHOOK_BIN.exists(), reason="asya-webhook not built (tests/e2e/up builds it)")
@pytest.mark.parametrize("values", [
    [],
    ["--set", "transports.rabbitmq.enabled=false", "--set", "transports.sqs.enabled=true",
     "--set", "actorServiceAccount.roleArn=arn:aws:iam::123456789012:role/asya-{namespace}"],
    ["-f", E2E_VALUES],
], ids=["defaults", "sqs-only", "e2e-values"])
def test_rendered_config_is_accepted_by_the_real_parser(values, tmp_path):
    """The ConfigMap's config.yaml parses with asya_api::config::ClusterConfig (which rejects
    unknown fields), as the webhook reads it: `asya-webhook validate --config`."""
    doc = render(*values, "--show-only", "templates/configmap.yaml")[0]
    config = tmp_path / "config.yaml"
    config.write_text(doc["data"]["config.yaml"])
    transport = yaml.safe_load(config.read_text())["defaultTransport"]
    actor = tmp_path / "actor.yaml"
    actor.write_text(yaml.safe_dump({
        "apiVersion": "asya.sh/v1alpha1", "kind": "AsyncActor",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"image": "python:3.12-slim", "handler": "echo.handler", "transport": transport},
    }))
    out = run([WEBHOOK_BIN, "validate", "--config", config, "-f", actor], check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    # And a transport the rendered config does not enable is refused by the same config.
    other = "sqs" if transport == "rabbitmq" else "rabbitmq"
    if not yaml.safe_load(config.read_text())["transports"][other]["enabled"]:
        actor.write_text(actor.read_text().replace(f"transport: {transport}", f"transport: {other}"))
        out = run([WEBHOOK_BIN, "validate", "--config", config, "-f", actor], check=False)
        assert out.returncode == 1 and "spec.transport" in out.stdout + out.stderr, out.stdout + out.stderr


# --- the gateway and the crew (issue 15): rendered with `helm template`, nothing installed ------

GATEWAY_BIN = WEBHOOK_BIN.parent / "asya-gateway"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
TOOL = {"name": "shout", "description": "Shout a word", "route": ["shout", "count"], "timeout": 30,
        "parameters": {"word": {"type": "string", "required": True, "description": "the word"}}}


def values_file(tmp_path, values: dict) -> list:
    """`-f FILE` with `values` (lists and nested maps, which --set spells badly)."""
    path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["-f", path]


def component(docs, name: str) -> dict:
    """The rendered objects of one component, by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in docs
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == name}


def gateway_container(docs) -> dict:
    deploy = component(docs, "gateway")[("Deployment", "asya-gateway")]
    containers = deploy["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["gateway"]
    return containers[0]


def env_by_name(container) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def test_gateway_and_crew_are_off_by_default():
    docs = render()
    assert component(docs, "gateway") == {}
    assert component(docs, "crew") == {}
    assert not [d for d in docs if d["kind"] in ("AsyncActor", "Ingress")]
    # No gateway: the injected sidecars get no ASYA_GATEWAY_URL.
    assert "gateway" not in rendered_config()


def test_gateway_renders_deployment_service_and_tools_config_map(tmp_path):
    docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, "routes": {"tools": [TOOL]}}}))
    gw = component(docs, "gateway")
    assert set(gw) == {("ConfigMap", "asya-gateway-tools"), ("Deployment", "asya-gateway"), ("Service", "asya-gateway"),
                       ("NetworkPolicy", "asya-gateway"), ("Secret", "asya-gateway-report-key"),
                       ("ServiceAccount", "asya-gateway"), ("ClusterRole", "asya-gateway"),
                       ("ClusterRoleBinding", "asya-gateway")}
    assert {d["metadata"]["namespace"] for d in gw.values() if not d["kind"].startswith("Cluster")} == {"asya-system"}

    # The tools, as the gateway reads them (routes.tools of the values, unchanged).
    tools = yaml.safe_load(gw[("ConfigMap", "asya-gateway-tools")]["data"]["tools.yaml"])
    assert tools == {"routes": {"tools": [TOOL]}}

    deploy = gw[("Deployment", "asya-gateway")]
    pod = deploy["spec"]["template"]["spec"]
    c = gateway_container(docs)
    assert c["image"] == f"ghcr.io/asya-rs/asya-gateway:{APP_VERSION}"
    assert "--tools=/etc/asya/tools/tools.yaml" in c["args"] and "--config=/etc/asya/config.yaml" in c["args"]
    assert "--auth-tokens=/etc/asya/auth/tokens" in c["args"] and "--no-auth" not in c["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tools"]["configMap"]["name"] == "asya-gateway-tools"
    assert volumes["config"]["configMap"]["name"] == "asya-config"
    assert volumes["auth"]["secret"]["secretName"] == "asya-gateway-tokens"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    # A directory, not a subPath: an edited ConfigMap reaches the file and the gateway reloads.
    assert mounts["tools"]["mountPath"] == "/etc/asya/tools" and "subPath" not in mounts["tools"]
    assert mounts["auth"]["mountPath"] == "/etc/asya/auth"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    # No ASYA_GATEWAY_PORT=tcp://... from its own Service (found on the e2e install: the
    # gateway took it for its --port and crashed at start).
    assert pod["enableServiceLinks"] is False
    # No database configured: no URL (the gateway keeps status in memory and says so).
    assert "ASYA_DATABASE_URL" not in env_by_name(c)

    svc = gw[("Service", "asya-gateway")]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]

    # The cluster configuration points the sidecars at the Service, and the provisioner at
    # the report key and the per-namespace token Secret it issues (issue 26).
    assert rendered_config("--set", "gateway.enabled=true")["gateway"] == {
        "url": "http://asya-gateway.asya-system.svc:8080",
        "tokenSecretRef": {"name": "asya-gateway-report", "key": "token"},
        "reportKeySecretRef": {"name": "asya-gateway-report-key", "key": "key"}}
    cfg = rendered_config("--set", "gateway.enabled=true", "--set", "gateway.port=9000",
                          "--set", "gateway.auth.sidecarTokenSecretRef.name=gw-sidecar")
    assert cfg["gateway"] == {"url": "http://asya-gateway.asya-system.svc:9000",
                              "tokenSecretRef": {"name": "gw-sidecar", "key": "token"},
                              "reportKeySecretRef": {"name": "asya-gateway-report-key", "key": "key"}}


def test_gateway_report_key_is_generated_once_mounted_and_optional(tmp_path):
    """Issue 26: the sidecars report with per-namespace tokens derived from a key that only
    the gateway holds; the chart makes the key, keeps it, and points the gateway at it."""
    docs = render("--set", "gateway.enabled=true")
    gw = component(docs, "gateway")
    secret = gw[("Secret", "asya-gateway-report-key")]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["key"])) >= 32
    c = gateway_container(docs)
    assert env_by_name(c)["ASYA_GATEWAY_REPORT_KEY_FILE"] == {
        "name": "ASYA_GATEWAY_REPORT_KEY_FILE", "value": "/etc/asya/report-key/key"}
    pod = gw[("Deployment", "asya-gateway")]["spec"]["template"]["spec"]
    assert {"name": "report-key", "secret": {"secretName": "asya-gateway-report-key"}} in pod["volumes"]
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["report-key"] == "/etc/asya/report-key"

    # A Secret of one's own: mounted, not rendered.
    docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, "auth": {
        "reportKeySecretRef": {"name": "my-key", "key": "k", "generate": False}}}}))
    assert not [d for d in docs if d["kind"] == "Secret" and "report-key" in d["metadata"]["name"]]
    c = gateway_container(docs)
    assert env_by_name(c)["ASYA_GATEWAY_REPORT_KEY_FILE"]["value"] == "/etc/asya/report-key/k"
    # No key (the gateway then accepts no report) and auth off: nothing of it.
    for values in ({"auth": {"reportKeySecretRef": {"name": ""}}}, {"auth": {"disabled": True}}):
        docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, **values}}))
        assert ("Secret", "asya-gateway-report-key") not in component(docs, "gateway")
        assert "ASYA_GATEWAY_REPORT_KEY_FILE" not in env_by_name(gateway_container(docs))


def test_gateway_bounds_and_retention_are_flags(tmp_path):
    """Issue 34: the report routes' rate limit per namespace, the bounds in flight and the
    retention of stored envelopes reach `asya-gateway serve` as flags, with their defaults."""
    args = gateway_container(render("--set", "gateway.enabled=true"))["args"]
    for flag in ["--rate-limit=50", "--rate-burst=100", "--report-rate-limit=1000", "--report-rate-burst=2000",
                 "--max-in-flight-per-token=64", "--max-in-flight-per-report-namespace=256",
                 "--retention-finished=168h", "--retention-unfinished=720h", "--retention-interval=5m",
                 "--retention-batch=1000"]:
        assert flag in args, (flag, args)
    docs = render(*values_file(tmp_path, {"gateway": {
        "enabled": True, "rateLimit": {"reportsPerSecond": 0}, "maxInFlight": {"perToken": 0},
        "retention": {"finished": "0", "unfinished": "24h"}}}))
    args = gateway_container(docs)["args"]
    assert {"--report-rate-limit=0", "--max-in-flight-per-token=0", "--retention-finished=0",
            "--retention-unfinished=24h"} <= set(args), args
    out = helm("template", "asya", CHART, "--set", "gateway.enabled=true",
               "--set", "gateway.retention.finished=7d", check=False)
    assert out.returncode != 0 and "/gateway/retention/finished" in out.stderr, out.stderr


def test_gateway_watches_namespaces_only_for_uid_bound_report_tokens(tmp_path):
    """Issue 34: report tokens are bound to their namespace's uid. The gateway gets its own
    ServiceAccount, and get/list/watch on namespaces (nothing else) only when it checks
    them; `off`, no report key or auth off: no role and no API token in the pod."""
    docs = render("--set", "gateway.enabled=true")
    gw = component(docs, "gateway")
    assert gw[("ClusterRole", "asya-gateway")]["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]
    binding = gw[("ClusterRoleBinding", "asya-gateway")]
    assert binding["roleRef"]["name"] == "asya-gateway"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "asya-gateway", "namespace": "asya-system"}]
    pod = gw[("Deployment", "asya-gateway")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "asya-gateway" and pod["automountServiceAccountToken"] is True
    assert "--namespace-uids=kube" in gateway_container(docs)["args"]

    for values, flag in (({"auth": {"namespaceUids": "off"}}, "--namespace-uids=off"),
                         ({"auth": {"reportKeySecretRef": {"name": ""}}}, None),
                         ({"auth": {"disabled": True}}, None)):
        docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, **values}}))
        gw = component(docs, "gateway")
        assert ("ClusterRole", "asya-gateway") not in gw and ("ClusterRoleBinding", "asya-gateway") not in gw, values
        pod = gw[("Deployment", "asya-gateway")]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "asya-gateway" and pod["automountServiceAccountToken"] is False, values
        assert gw[("ServiceAccount", "asya-gateway")]["automountServiceAccountToken"] is False, values
        uids = [a for a in gateway_container(docs)["args"] if a.startswith("--namespace-uids")]
        assert uids == ([flag] if flag else []), (values, uids)
    out = helm("template", "asya", CHART, "--set", "gateway.enabled=true",
               "--set", "gateway.auth.namespaceUids=maybe", check=False)
    assert out.returncode != 0 and "namespaceUids" in out.stderr, out.stderr

    # With egress policies, the gateway reaches the API server only when it watches.
    for uids, reaches in (("kube", True), ("off", False)):
        docs = render("--set", "gateway.enabled=true", "--set", "networkPolicy.egress.enabled=true",
                      "--set", "networkPolicy.egress.apiServer.cidrs={10.0.0.1/32}",
                      "--set", f"gateway.auth.namespaceUids={uids}")
        egress = component(docs, "gateway")[("NetworkPolicy", "asya-gateway")]["spec"]["egress"]
        to_api = [r for r in egress if {"ipBlock": {"cidr": "10.0.0.1/32"}} in r.get("to", [])]
        assert bool(to_api) == reaches, (uids, egress)


def test_gateway_watches_flow_entries_only_when_asked(tmp_path):
    """Compiled flows as tools (docs/flows.md): gateway.flows=kube gives the gateway read-only
    get/list/watch on AsyncActors (added to its namespaces rule, or alone), an API token and
    `--flows=kube`; the default `off` none of it; another value is refused naming the field."""
    assert "--flows=off" in gateway_container(render("--set", "gateway.enabled=true"))["args"]
    actors = {"apiGroups": ["asya.sh"], "resources": ["asyncactors"], "verbs": ["get", "list", "watch"]}
    namespaces = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}
    for values, rules in (({}, [namespaces, actors]), ({"auth": {"namespaceUids": "off"}}, [actors]),
                          ({"auth": {"disabled": True}}, [actors])):
        docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, "flows": "kube", **values}}))
        gw = component(docs, "gateway")
        assert gw[("ClusterRole", "asya-gateway")]["rules"] == rules, values
        pod = gw[("Deployment", "asya-gateway")]["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is True, values
        assert "--flows=kube" in gateway_container(docs)["args"], values
    out = helm("template", "asya", CHART, "--set", "gateway.enabled=true", "--set", "gateway.flows=maybe",
               check=False)
    assert out.returncode != 0 and "/gateway/flows" in out.stderr, out.stderr


def provisioner_secret_rules(docs) -> tuple[list, list]:
    """The provisioner's rules on Secrets: cluster-wide (actor namespaces), and in the release
    namespace."""
    def rules(kind):
        role = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == "asya-provisioner")
        return [r for r in role["rules"] if "secrets" in r["resources"]]
    return rules("ClusterRole"), rules("Role")


def test_gateway_report_tokens_are_issued_by_the_provisioner(tmp_path):
    """Issue 26: no manual step per namespace. With the gateway on, the provisioner reads
    the report key (by name, in the release namespace) and writes, reads back and deletes
    each namespace's token Secret by name only; it may list no Secret."""
    cluster, release = provisioner_secret_rules(render("--set", "gateway.enabled=true"))
    assert {"resources": ["secrets"], "apiGroups": [""], "resourceNames": ["asya-gateway-report"],
            "verbs": ["get", "patch", "delete"]} in cluster
    assert {"resources": ["secrets"], "apiGroups": [""], "verbs": ["create"]} in cluster
    assert {"resources": ["secrets"], "apiGroups": [""], "resourceNames": ["asya-gateway-report-key"],
            "verbs": ["get"]} in release
    for r in cluster + release:
        assert not {"list", "watch"} & set(r["verbs"]), r

    # Auth off, no report key, or no token Secret name: no token, nothing to read or write.
    for values in ({"auth": {"disabled": True}}, {"auth": {"reportKeySecretRef": {"name": ""}}},
                   {"auth": {"sidecarTokenSecretRef": {"name": ""}}}):
        docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, **values}}))
        cfg = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap"
                                  and d["metadata"]["name"] == "asya-config")["data"]["config.yaml"])
        assert cfg["gateway"] == {"url": "http://asya-gateway.asya-system.svc:8080"}, values
        cluster, release = provisioner_secret_rules(docs)
        names = [n for r in cluster + release for n in r.get("resourceNames", [])]
        assert "asya-gateway-report" not in names and "asya-gateway-report-key" not in names, values
    # The gateway off: neither.
    cluster, release = provisioner_secret_rules(render())
    names = [n for r in cluster + release for n in r.get("resourceNames", [])]
    assert "asya-gateway-report" not in names and "asya-gateway-report-key" not in names


@pytest.mark.parametrize("config, expected_env", [
    # The whole URL from a Secret: never a value in the manifest.
    ({"databaseUrlSecretRef": {"name": "gw-db", "key": "url"}},
     [{"name": "ASYA_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "gw-db", "key": "url"}}}]),
    # Host and database from the values, the password from a Secret, declared before the URL
    # that refers to it (Kubernetes expands $(VAR) only from earlier variables).
    ({"postgresHost": "pg.db.svc", "postgresPasswordSecretRef": {"name": "pg", "key": "password"}},
     [{"name": "ASYA_POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "pg", "key": "password"}}},
      {"name": "ASYA_DATABASE_URL", "value": "postgres://asya:$(ASYA_POSTGRES_PASSWORD)@pg.db.svc:5432/asya_gateway"}]),
    # Both: the Secret's URL wins.
    ({"databaseUrlSecretRef": {"name": "gw-db", "key": "dsn"}, "postgresHost": "pg.db.svc"},
     [{"name": "ASYA_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "gw-db", "key": "dsn"}}}]),
], ids=["url-from-secret", "host-and-password-secret", "secret-url-wins"])
def test_gateway_database_url_comes_from_a_secret(tmp_path, config, expected_env):
    docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, "config": config}}))
    env = [e for e in gateway_container(docs)["env"] if e["name"] in ("ASYA_DATABASE_URL", "ASYA_POSTGRES_PASSWORD")]
    assert env == expected_env


def test_gateway_ingress_is_optional(tmp_path):
    assert not [d for d in render("--set", "gateway.enabled=true") if d["kind"] == "Ingress"]
    docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, "ingress": {
        "enabled": True, "className": "nginx", "host": "mcp.example.com",
        "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"},
        "tls": [{"hosts": ["mcp.example.com"], "secretName": "mcp-tls"}]}}}))
    ingress = component(docs, "gateway")[("Ingress", "asya-gateway")]
    assert ingress["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"}
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["mcp.example.com"], "secretName": "mcp-tls"}]
    backend = {"service": {"name": "asya-gateway", "port": {"name": "http"}}}
    assert spec["rules"] == [{"host": "mcp.example.com",
                              "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}]
    # No host: one rule for any host, still well-formed.
    docs = render("--set", "gateway.enabled=true", "--set", "gateway.ingress.enabled=true")
    spec = component(docs, "gateway")[("Ingress", "asya-gateway")]["spec"]
    assert "ingressClassName" not in spec and "tls" not in spec
    assert spec["rules"] == [{"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}]


def test_gateway_auth_is_required_unless_disabled():
    out = helm("template", "asya", CHART, "--set", "gateway.enabled=true",
               "--set", "gateway.auth.tokensSecretRef.name=", check=False)
    assert out.returncode != 0, out.stdout
    assert "gateway.auth: set tokensSecretRef.name" in out.stderr, out.stderr
    docs = render("--set", "gateway.enabled=true", "--set", "gateway.auth.disabled=true")
    c = gateway_container(docs)
    assert "--no-auth" in c["args"] and not [a for a in c["args"] if a.startswith("--auth-tokens")]
    pod = component(docs, "gateway")[("Deployment", "asya-gateway")]["spec"]["template"]["spec"]
    assert "auth" not in {v["name"] for v in pod["volumes"]}
    assert "auth" not in {m["name"] for m in c["volumeMounts"]}


@pytest.mark.skipif(not GATEWAY_BIN.exists(), reason="asya-gateway not built (cargo build -p asya-gateway)")
def test_gateway_rendering_is_accepted_by_the_real_gateway(tmp_path):
    """The tools ConfigMap parses with the gateway's own loader (`asya-gateway validate`), and
    every flag and variable the Deployment passes is one `asya-gateway serve` takes."""
    docs = render(*values_file(tmp_path, {"gateway": {"enabled": True, "routes": {"tools": [TOOL]},
                                                      "allowedHosts": ["mcp.example.com"],
                                                      "config": {"sqsRegion": "eu-west-1",
                                                                 "databaseUrlSecretRef": {"name": "db"}}}}))
    tools = tmp_path / "tools.yaml"
    tools.write_text(component(docs, "gateway")[("ConfigMap", "asya-gateway-tools")]["data"]["tools.yaml"])
    out = run([GATEWAY_BIN, "validate", "--tools", tools], check=False)
    assert out.returncode == 0 and "1 tool(s) valid" in out.stdout, out.stdout + out.stderr

    c = gateway_container(docs)
    assert c["args"][0] == "serve"
    help_text = run([GATEWAY_BIN, "serve", "--help"]).stdout
    flags = [a.split("=", 1)[0] for a in c["args"][1:]]
    assert "--allowed-hosts" in flags
    unknown = [f for f in flags if f"{f} " not in help_text and f"{f}\n" not in help_text]
    assert not unknown, f"flags asya-gateway serve does not take: {unknown}"
    # Variables the binary reads itself (the log level is read by its logger, not clap).
    read_by_clap = [n for n in env_by_name(c) if n.startswith("ASYA_") and n not in ("ASYA_LOG_LEVEL", "ASYA_RABBITMQ_PASSWORD")]
    assert {"ASYA_DATABASE_URL", "ASYA_RABBITMQ_URL", "ASYA_SQS_REGION"} <= set(read_by_clap)
    unread = [n for n in read_by_clap if f"[env: {n}" not in help_text]
    assert not unread, f"variables asya-gateway serve does not read: {unread}"


def crew_actors(docs) -> dict:
    """The crew's AsyncActors by name; the crew renders nothing else."""
    actors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "AsyncActor"}
    assert set(component(docs, "crew")) == {("AsyncActor", n) for n in actors}
    return actors


CREW_VALUES = {
    "global": {"imageRegistry": "mirror.example.com/asya"},
    "crew": {"namespace": "team-a", "happy-end": {"enabled": True}, "error-end": {"enabled": True},
             "s3": {"bucket": "team-a-results", "endpoint": "http://minio.minio.svc:9000", "region": "eu-west-1",
                    "credentialsSecretRef": {"name": "minio-creds"}}},
}


def test_crew_renders_the_two_end_actors_each_serving_its_end_queue(tmp_path):
    actors = crew_actors(render(*values_file(tmp_path, CREW_VALUES)))
    assert set(actors) == {"happy-end", "error-end"}
    # happy-end is the actor x-sink (finished envelopes), error-end is x-sump (failed ones): the
    # queue of each is asya-{namespace}-{actor}.
    for name, actor, handler in [("happy-end", "x-sink", "happy_end_handler"), ("error-end", "x-sump", "error_end_handler")]:
        a = actors[name]
        assert a["apiVersion"] == "asya.sh/v1alpha1"
        assert a["metadata"]["namespace"] == "team-a"
        assert a["metadata"]["annotations"]["asya.sh/serves"] == f"asya-team-a-{actor}"
        spec = a["spec"]
        assert spec["actor"] == actor
        assert spec["handler"] == f"handlers.end_handlers.{handler}"
        assert spec["handlerMode"] == "envelope"
        assert spec["image"] == f"mirror.example.com/asya/asya-crew:{APP_VERSION}"
        # A failed store is retried by policy, never dropped.
        assert spec["resiliency"]["policies"]["default"]["maxAttempts"] == 5
        env = {e["name"]: e for e in spec["env"]}
        assert env["ASYA_S3_BUCKET"]["value"] == "team-a-results"
        assert env["ASYA_S3_ENDPOINT"]["value"] == "http://minio.minio.svc:9000"
        assert env["ASYA_S3_REGION"]["value"] == "eu-west-1"
        assert env["ASYA_S3_RESULTS_PREFIX"]["value"] == "results/" and env["ASYA_S3_ERRORS_PREFIX"]["value"] == "errors/"
        assert env["ASYA_S3_ACCESS_KEY"] == {"name": "ASYA_S3_ACCESS_KEY",
                                             "valueFrom": {"secretKeyRef": {"name": "minio-creds", "key": "accessKey"}}}
        assert env["ASYA_S3_SECRET_KEY"] == {"name": "ASYA_S3_SECRET_KEY",
                                             "valueFrom": {"secretKeyRef": {"name": "minio-creds", "key": "secretKey"}}}
    # Each end actor alone; without an endpoint or credentials (AWS, IRSA) no such variables.
    only = crew_actors(render("--set", "crew.error-end.enabled=true"))
    assert set(only) == {"error-end"}
    assert only["error-end"]["metadata"]["namespace"] == "default"
    assert only["error-end"]["spec"]["actor"] == "x-sump"
    env = {e["name"] for e in only["error-end"]["spec"]["env"]}
    assert not env & {"ASYA_S3_ENDPOINT", "ASYA_S3_REGION", "ASYA_S3_ACCESS_KEY", "ASYA_S3_SECRET_KEY"}, env
    assert set(crew_actors(render("--set", "crew.happy-end.enabled=true"))) == {"happy-end"}


def test_crew_handlers_named_by_the_chart_exist():
    """The chart's handler paths resolve in deploy/crew (the image's /app) to callables."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "deploy" / "crew"))
    try:
        actors = crew_actors(render("--set", "crew.happy-end.enabled=true", "--set", "crew.error-end.enabled=true"))
        for a in actors.values():
            module, func = a["spec"]["handler"].rsplit(".", 1)
            assert callable(getattr(importlib.import_module(module), func, None)), a["spec"]["handler"]
    finally:
        sys.path.remove(str(ROOT / "deploy" / "crew"))


@pytest.mark.skipif(not WEBHOOK_BIN.exists(), reason="asya-webhook not built (tests/e2e/up builds it)")
def test_crew_actors_are_accepted_by_the_webhook_with_the_rendered_config(tmp_path):
    """happy-end and error-end (object names other than their actors x-sink and x-sump) pass the
    webhook's own validation against the same release's cluster configuration."""
    args = values_file(tmp_path, {**CREW_VALUES, "crew": {**CREW_VALUES["crew"], "transport": "rabbitmq"}})
    config = tmp_path / "config.yaml"
    config.write_text(render(*args, "--show-only", "templates/configmap.yaml")[0]["data"]["config.yaml"])
    crew = tmp_path / "crew.yaml"
    crew.write_text(yaml.safe_dump_all(list(crew_actors(render(*args)).values())))
    out = run([WEBHOOK_BIN, "validate", "--config", config, "-f", crew], check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "AsyncActor team-a/happy-end" in out.stdout and "AsyncActor team-a/error-end" in out.stdout, out.stdout
    assert "2 accepted, 0 rejected" in out.stdout, out.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "gateway.replicas=two"], "at '/gateway/replicas': got string, want integer"),
        (["--set", "gateway.port=70000"], "at '/gateway/port': maximum: got 70,000, want 65,535"),
        (["--set", "gateway.ingres.host=mcp.example.com"], "at '/gateway': additional properties 'ingres' not allowed"),
        (["--set", "gateway.routes.tools[0].name=shout"], "at '/gateway/routes/tools/0': missing property 'route'"),
        (["--set", "gateway.routes.tools[0].name=shout", "--set", "gateway.routes.tools[0].route[0]=Shout"],
         "at '/gateway/routes/tools/0/route/0': 'Shout' does not match pattern"),
        (["--set", "crew.happy-end.enabled=yes"], "at '/crew/happy-end/enabled': got string, want boolean"),
        (["--set", "crew.error-end.replicas=2"], "at '/crew/error-end': additional properties 'replicas' not allowed"),
        (["--set", "crew.namespace=Team_A"], "at '/crew/namespace': 'Team_A' does not match pattern"),
        (["--set", "crew.s3.bucket=ab"], "at '/crew/s3/bucket': minLength: got 2, want 3"),
    ],
    ids=["gateway-replicas-not-a-number", "gateway-port-too-large", "gateway-typo-key", "gateway-tool-without-route",
         "gateway-tool-bad-actor-name", "crew-enabled-not-a-boolean", "crew-unknown-key", "crew-bad-namespace",
         "crew-bucket-too-short"],
)
def test_gateway_and_crew_bad_values_fail_on_schema(args, expected):
    out = helm("template", "asya", CHART, *args, check=False)
    assert out.returncode != 0, out.stdout
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert expected in out.stderr, out.stderr


# --- issue 26: excluded namespaces, flavor bounds, NetworkPolicies, PDBs, priority, spread ------
# Rendered with `helm template`, nothing installed.

def by_kind(docs, kind: str) -> dict:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


GATEWAY_ON = ["--set", "gateway.enabled=true", "--set", "gateway.auth.disabled=true"]


def test_the_provisioner_gets_the_namespaces_the_webhook_excludes_and_the_flavor_limits():
    args = ["--set", "webhook.excludeNamespaces={team-x,kube-system}"]
    cfg = rendered_config(*args)
    assert cfg["excludedNamespaces"] == ["kube-system", "asya-system", "team-x"]
    assert cfg["flavorLimits"] == {"maxBytes": 16384, "maxPerNamespace": 16, "maxTotal": 512}
    docs = render(*args, "--show-only", "templates/webhook-configurations.yaml")
    for d in docs:
        for w in d["webhooks"]:
            [expr] = w["namespaceSelector"]["matchExpressions"]
            assert expr["operator"] == "NotIn" and expr["values"] == cfg["excludedNamespaces"], w["name"]
    cfg = rendered_config("--set", "flavorLimits.maxBytes=65536")
    assert cfg["flavorLimits"]["maxBytes"] == 65536


def test_network_policies_limit_ingress_by_default_and_leave_egress_alone():
    docs = render(*GATEWAY_ON)
    pols = by_kind(docs, "NetworkPolicy")
    assert sorted(pols) == ["asya-gateway", "asya-provisioner", "asya-webhook"]
    for name, p in pols.items():
        assert p["spec"]["policyTypes"] == ["Ingress"], name
        assert "egress" not in p["spec"], name
        component = name.removeprefix("asya-")
        assert p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
    ingress = {n: [(r["ports"][0]["port"], r.get("from")) for r in p["spec"]["ingress"]] for n, p in pols.items()}
    # The API server calls the webhook from addresses the chart cannot know: its port is open.
    assert ingress["asya-webhook"] == [(8443, None), (9090, None)]
    assert ingress["asya-provisioner"] == [(9090, None)]
    assert ingress["asya-gateway"] == [(8080, None)]
    # Each policy's ports are the ones its pods serve.
    deploys = by_kind(docs, "Deployment")
    for name, p in pols.items():
        served = {c["containerPort"] for c in deploys[name]["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert {port for port, _ in ingress[name]} == served, name
    assert not by_kind(render("--set", "networkPolicy.enabled=false"), "NetworkPolicy")
    assert "asya-gateway" not in by_kind(render(), "NetworkPolicy")


def test_network_policy_metrics_sources_and_egress_when_asked(tmp_path):
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    broker = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rabbitmq"}}}],
              "ports": [{"protocol": "TCP", "port": 5672}]}
    docs = render(*GATEWAY_ON, *values_file(tmp_path, {"networkPolicy": {
        "metricsFrom": monitoring,
        "egress": {"enabled": True, "apiServer": {"cidrs": ["10.96.0.1/32"], "ports": [443]}, "extraRules": [broker]},
    }}))
    pols = by_kind(docs, "NetworkPolicy")
    webhook = pols["asya-webhook"]["spec"]
    assert webhook["ingress"][0].get("from") is None
    assert webhook["ingress"][1]["from"] == monitoring
    dns = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    api = {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}
    assert webhook["policyTypes"] == ["Ingress", "Egress"]
    # The webhook talks to the API server only; the broker is the provisioner's and gateway's.
    assert webhook["egress"] == [dns, api]
    assert pols["asya-provisioner"]["spec"]["egress"] == [dns, api, broker]
    assert pols["asya-gateway"]["spec"]["egress"] == [dns, broker]
    out = helm("template", "asya", CHART, "--set", "networkPolicy.egress.enabled=true", check=False)
    assert out.returncode != 0 and "networkPolicy.egress.apiServer.cidrs" in out.stderr, out.stderr


def test_disruption_budgets_only_where_they_cannot_block_a_drain():
    # Defaults: two webhook replicas, one gateway replica.
    pdbs = by_kind(render(*GATEWAY_ON), "PodDisruptionBudget")
    assert sorted(pdbs) == ["asya-webhook"]
    assert pdbs["asya-webhook"]["spec"]["minAvailable"] == 1
    assert pdbs["asya-webhook"]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    # A single replica never gets a budget (minAvailable 1 of 1 would block every drain).
    for args in (["--set", "webhook.replicas=1"], [*GATEWAY_ON, "--set", "webhook.replicas=1"]):
        assert not by_kind(render(*args), "PodDisruptionBudget"), args
    pdbs = by_kind(render(*GATEWAY_ON, "--set", "gateway.replicas=3", "--set", "webhook.replicas=3"),
                   "PodDisruptionBudget")
    assert sorted(pdbs) == ["asya-gateway", "asya-webhook"]
    for name, replicas in (("asya-gateway", 3), ("asya-webhook", 3)):
        assert pdbs[name]["spec"]["minAvailable"] < replicas
    out = helm("template", "asya", CHART, *GATEWAY_ON, "--set", "gateway.replicas=2",
               "--set", "gateway.podDisruptionBudget.minAvailable=2", check=False)
    assert out.returncode != 0
    assert "gateway.podDisruptionBudget.minAvailable (2) must be below gateway.replicas (2)" in out.stderr, out.stderr
    assert not by_kind(render("--set", "webhook.podDisruptionBudget.enabled=false"), "PodDisruptionBudget")


def test_priority_classes_reach_each_component_and_default_to_none():
    def priorities(*args):
        return {n: d["spec"]["template"]["spec"].get("priorityClassName")
                for n, d in by_kind(render(*GATEWAY_ON, *args), "Deployment").items()}
    assert priorities() == {"asya-webhook": None, "asya-provisioner": None, "asya-gateway": None}
    assert priorities("--set", "webhook.priorityClassName=asya-critical",
                      "--set", "provisioner.priorityClassName=asya-high",
                      "--set", "gateway.priorityClassName=asya-normal") == {
        "asya-webhook": "asya-critical", "asya-provisioner": "asya-high", "asya-gateway": "asya-normal"}


def test_webhook_replicas_spread_over_nodes_softly_by_default():
    def affinity(*args):
        deploy = by_kind(render(*args, "--show-only", "templates/webhook.yaml"), "Deployment")["asya-webhook"]
        return deploy["spec"]["template"]["spec"].get("affinity")
    selector = {"matchLabels": {"app.kubernetes.io/name": "asya", "app.kubernetes.io/instance": "asya",
                                "app.kubernetes.io/component": "webhook"}}
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector}
    assert affinity() == {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term}]}}
    assert affinity("--set", "webhook.spreadAcrossNodes=required") == {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    assert affinity("--set", "webhook.spreadAcrossNodes=none") is None
    # An affinity of the user's replaces the spread whole.
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    assert affinity("--set-json", f"webhook.affinity={json.dumps(own)}") == own


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "flavorLimits.maxBytes=0"], "maxBytes"),
        (["--set", "webhook.spreadAcrossNodes=always"], "spreadAcrossNodes"),
        (["--set", "webhook.priorityClassName=Not_A_Name"], "priorityClassName"),
        (["--set", "networkPolicy.egress.apiServer.cidrs={10.0.0.1}"], "cidrs"),
        (["--set", "networkPolicy.enable=true"], "enable"),
        (["--set", "actorServiceAccount.roleArn=arn:aws:iam::1:role/asya-{actor}"], "roleArn"),
        (["--set", "webhook.apiServerCIDRs={10.0.0.1}"], "apiServerCIDRs"),
        (["--set", "webhook.maxInFlight=0"], "maxInFlight"),
        (["--set", "policy.maxSpecBytes=0"], "maxSpecBytes"),
    ],
    ids=["zero-flavor-bytes", "bad-spread", "bad-priority-class", "cidr-without-prefix", "typo-network-policy",
         "role-without-namespace", "api-server-cidr-without-prefix", "zero-in-flight", "zero-spec-bytes"],
)
def test_issue_26_bad_values_fail_on_schema(args, expected):
    out = helm("template", "asya", CHART, *args, check=False)
    assert out.returncode != 0, out.stdout
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert expected in out.stderr, out.stderr


# --- the webhook's own surfaces (issue 34) --------------------------------------------------


def webhook_container(docs) -> dict:
    deploy = by_kind(docs, "Deployment")["asya-webhook"]
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    return c


def flag(container, name: str):
    """The value of `--name=value` among the container's args, None when absent."""
    values = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"--{name}=")]
    assert len(values) <= 1, values
    return values[0] if values else None


def test_webhook_limits_and_probes_on_the_metrics_port():
    c = webhook_container(render("--show-only", "templates/webhook.yaml"))
    assert flag(c, "max-in-flight") == "32"
    assert flag(c, "max-body-bytes") == "1048576"
    # At SIGTERM the reviews under way get the API server's own timeout to finish.
    assert flag(c, "drain-timeout") == "10s"
    # The probes use the plain-HTTP metrics port: the admission port may answer only the
    # API server, and the kubelet probes from the node.
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == "metrics", c[probe]
        assert c[probe]["httpGet"]["scheme"] == "HTTP", c[probe]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"https": 8443, "metrics": 9090}
    c = webhook_container(render("--show-only", "templates/webhook.yaml",
                                 "--set", "webhook.maxInFlight=8", "--set", "webhook.maxBodyBytes=2097152"))
    assert (flag(c, "max-in-flight"), flag(c, "max-body-bytes")) == ("8", "2097152")


def test_the_admission_port_is_limited_to_the_api_servers_addresses_when_known(tmp_path):
    # `helm template` cannot look the API server up: today's rule (any source, no flag), and
    # NOTES says so.
    docs = render()
    assert flag(webhook_container(docs), "allowed-source-cidrs") is None
    webhook = by_kind(docs, "NetworkPolicy")["asya-webhook"]["spec"]
    assert webhook["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert webhook["ingress"][0].get("from") is None
    # A client-side dry run renders NOTES without the cluster (so without the lookup either).
    notes = helm("install", "asya-notes", CHART, "-n", "asya-notes", "--dry-run=client").stdout
    assert "Webhook admission port: open to any source. WARNING" in notes, notes

    # Given: the NetworkPolicy admits only them on the admission port, and the webhook gets
    # the same list; the metrics port keeps its own rule.
    cidrs = ["10.0.0.5/32", "10.0.0.6/32", "fd00::5/128"]
    docs = render(*values_file(tmp_path, {"webhook": {"apiServerCIDRs": cidrs}}))
    assert flag(webhook_container(docs), "allowed-source-cidrs") == ",".join(cidrs)
    notes = helm("install", "asya-notes", CHART, "-n", "asya-notes", "--dry-run=client",
                 *values_file(tmp_path, {"webhook": {"apiServerCIDRs": cidrs}})).stdout
    assert f"Webhook admission port: only from {', '.join(cidrs)} (the API server;" in notes, notes
    ingress = by_kind(docs, "NetworkPolicy")["asya-webhook"]["spec"]["ingress"]
    assert ingress[0] == {"ports": [{"protocol": "TCP", "port": 8443}],
                          "from": [{"ipBlock": {"cidr": c}} for c in cidrs]}
    assert ingress[1]["ports"] == [{"protocol": "TCP", "port": 9090}] and ingress[1].get("from") is None
    # The flag is passed even without NetworkPolicies (a CNI that ignores them is the case
    # it is for).
    docs = render(*values_file(tmp_path, {"webhook": {"apiServerCIDRs": cidrs}, "networkPolicy": {"enabled": False}}))
    assert flag(webhook_container(docs), "allowed-source-cidrs") == ",".join(cidrs)
    # And the webhook binary accepts what the chart renders.
    if WEBHOOK_BIN.exists():
        out = run([WEBHOOK_BIN, "serve", "--help"], check=False)
        assert "--allowed-source-cidrs" in out.stdout and "--max-in-flight" in out.stdout, out.stdout


def test_the_api_server_addresses_are_looked_up_leaving_loopback_out():
    """`helm template --dry-run=server` runs the chart's lookups against the test cluster: the
    `kubernetes` EndpointSlices' addresses become the allowed sources, except loopback ones
    (the test cluster's API server advertises 127.0.0.1 and calls pods from the host's
    bridge address: restricting to 127.0.0.1/32 would shut it out)."""
    slices = kubectl_json("get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes")
    ips = [a for s in slices["items"] for e in s.get("endpoints") or [] for a in e.get("addresses") or []]
    assert ips, slices
    want = [f"{ip}/{128 if ':' in ip else 32}" for ip in dict.fromkeys(ips)
            if not (ip.startswith("127.") or ip == "::1")]
    out = helm("template", "asya", CHART, "-n", "asya-system", "--dry-run=server",
               "--set", "webhook.apiServerCIDRsLookup=true").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert flag(webhook_container(docs), "allowed-source-cidrs") == (",".join(want) if want else None)
    ingress = by_kind(docs, "NetworkPolicy")["asya-webhook"]["spec"]["ingress"][0]
    assert ingress.get("from") == ([{"ipBlock": {"cidr": c}} for c in want] or None)
    # Off, the default (the advertised addresses are often not the calls' sources): any
    # source, whatever the cluster says.
    out = helm("template", "asya", CHART, "-n", "asya-system", "--dry-run=server").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert flag(webhook_container(docs), "allowed-source-cidrs") is None
