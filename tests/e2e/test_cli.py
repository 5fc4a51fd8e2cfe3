"""The `asya` command (cli/) against the real node, broker and API server, on both
transports: send and wait; a handler that fails until a ConfigMap flag is flipped, its
envelopes listed in x-sump with their errors and left there, redriven after the fix to reach
x-sink once each; a redrive killed mid-way and rerun; the trace of a fan-out; and a caller
whose RBAC cannot read the namespace's broker Secret refused with a message that names it.

The command runs as a user would run it: the binary of the profile `make` built, the test
cluster's kubeconfig, the release's ConfigMap in asya-system."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid

import pytest

from asya_e2e.actors import EXAMPLES_IMAGE, POD_TIMEOUT, apply_on_node, pods, wait_running
from asya_e2e.brokers import TRANSPORTS, Collected
from asya_e2e.cli import asya, asya_bin, asya_json
from asya_e2e.env import KUBECONFIG, RELEASE_NS
from asya_e2e.kube import apply, kubectl
from asya_e2e.wait import wait_for

pytestmark = pytest.mark.skipif(os.environ.get("ASYA_TEST_NODE", "1") == "0",
                                reason="ASYA_TEST_NODE=0: the test cluster runs without a node")

FLAG_DIR = "/flags"


def sump_ids(ns: str, transport: str, *args) -> list[str]:
    return sorted(e["id"] for e in asya_json(ns, "--transport", transport, "sump", "list", *args)["envelopes"])


def flag_configmap(ns: str, state: str) -> None:
    apply(ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fix-flag"}, "data": {"state": state}})


def fixable_actor(ns: str, transport: str) -> None:
    """`fixme`: fails every envelope until the ConfigMap fix-flag says "fixed" (mounted, so
    the running pod sees the flip without a restart). No retry policy: a failure goes to
    x-sump at once."""
    flag_configmap(ns, "broken")
    apply_on_node(ns, "fixme", {
        "transport": transport, "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
        "handler": "testing.act", "scaling": {"enabled": False}, "replicas": 1,
        "volumes": [{"name": "flag", "configMap": {"name": "fix-flag"}}],
        "volumeMounts": [{"name": "flag", "mountPath": FLAG_DIR}],
    })
    wait_running(ns, "fixme")


def fix(ns: str) -> None:
    """Flips the flag and waits until the running pod reads it (the kubelet syncs mounted
    ConfigMaps on its own period)."""
    flag_configmap(ns, "fixed")
    pod = pods(ns, "fixme")[0]["metadata"]["name"]
    wait_for("the pod to see the flag flipped", lambda: kubectl(
        "exec", "-n", ns, pod, "-c", "asya-runtime", "--", "cat", f"{FLAG_DIR}/state", check=False
    ).stdout.strip() == "fixed", timeout=POD_TIMEOUT, interval=2.0)


def failing(key: str) -> dict:
    return {"do": "until_fixed", "flag": f"{FLAG_DIR}/state", "key": key}


def send_failing(ns: str, transport: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        out = asya(ns, "--transport", transport, "send", "fixme", "--payload", json.dumps(failing(str(i))))
        ids.append(out.stdout.strip())
    return sorted(ids)


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_send_and_wait_tells_the_outcome(namespace, transport):
    ns = namespace
    fixable_actor(ns, transport)
    out = asya(ns, "--transport", transport, "send", "fixme", "--payload", json.dumps(failing("w")),
               "--wait", "--timeout", "3m", "-o", "json", check=False, timeout=240)
    assert out.returncode == 1, out.stderr  # ended in x-sump: "some of it failed"
    got = json.loads(out.stdout)
    assert got["outcome"] == "x-sump" and got["envelope"]["type"] == "NotFixedYet", got
    fix(ns)
    out = asya(ns, "--transport", transport, "send", "fixme", "--payload", json.dumps(failing("ok")),
               "--wait", "--timeout", "3m", "-o", "json", timeout=240)
    assert json.loads(out.stdout)["outcome"] == "x-sink"


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_failed_envelopes_are_listed_without_loss_then_redriven_once_each(namespace, transport):
    ns = namespace
    _, take = TRANSPORTS[transport]
    fixable_actor(ns, transport)
    sent = send_failing(ns, transport, 3)
    wait_for("3 envelopes in x-sump", lambda: sump_ids(ns, transport) == sent, timeout=POD_TIMEOUT, interval=1.0)

    # Listing twice loses nothing; --error selects by the error's type.
    listing = asya_json(ns, "--transport", transport, "sump", "list", "--error", "NotFixed")
    assert sorted(e["id"] for e in listing["envelopes"]) == sent
    assert f"asya-{ns}-x-sump" in listing["source"] and "left in place" in listing["source"], listing["source"]
    for e in listing["envelopes"]:
        assert e["actor"] == "fixme" and e["type"] == "NotFixedYet" and e["route_position"] == 0, e
    assert sump_ids(ns, transport) == sent
    assert sump_ids(ns, transport, "--error", "KeyError") == []
    shown = asya(ns, "--transport", transport, "sump", "show", sent[0]).stdout
    assert "NotFixedYet: not fixed yet" in shown and "traceback:" in shown and "testing.py" in shown, shown
    assert asya(ns, "--transport", transport, "sump", "show", "no-such-id", check=False).returncode == 3

    fix(ns)
    dry = asya_json(ns, "--transport", transport, "sump", "redrive", "--error", "NotFixed", "--dry-run")
    assert sorted(o["id"] for o in dry["outcomes"] if o["result"] == "would redrive") == sent
    assert sump_ids(ns, transport) == sent
    done = asya_json(ns, "--transport", transport, "sump", "redrive", "--error", "NotFixed")
    assert sorted(o["id"] for o in done["outcomes"] if o["result"] == "redriven") == sent, done

    sink = Collected(take, f"asya-{ns}-x-sink")
    got = wait_for("the 3 redriven envelopes in x-sink", lambda: sink.at_least(3), timeout=POD_TIMEOUT, interval=1.0)
    assert sorted(e["id"] for e in got) == sent
    for e in got:
        assert e["headers"]["x-asya-redriven"]["count"] == 1, e["headers"]
        assert "x-asya-error" not in e["headers"] and e["payload"]["fixed"] is True, e
    assert sump_ids(ns, transport) == []
    # Exactly once: nothing more arrives once x-sump is empty and the actor's queue drained.
    wait_for("the actor's queue drained", lambda: all(
        r["queued"] == 0 for r in asya_json(ns, "--transport", transport, "queues") if r["actor"] == "fixme"),
        timeout=60, interval=1.0)
    assert take(f"asya-{ns}-x-sink", 10) == []


@pytest.mark.parametrize("transport", ["rabbitmq", "sqs"])
def test_a_redrive_killed_midway_and_rerun_loses_nothing(namespace, transport):
    ns = namespace
    _, take = TRANSPORTS[transport]
    fixable_actor(ns, transport)
    sent = send_failing(ns, transport, 6)
    wait_for("6 envelopes in x-sump", lambda: sump_ids(ns, transport) == sent, timeout=POD_TIMEOUT, interval=1.0)
    fix(ns)

    cmd = [asya_bin(), "-n", ns, "--release-namespace", RELEASE_NS, "--kubeconfig", str(KUBECONFIG),
           "--transport", transport, "sump", "redrive", "--all"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # Progress is one line per envelope on stderr (log lines may come before it): kill
        # after the first confirmed resend.
        first, seen = "", []
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("redriven "):
                first = line
                break
        assert first, seen
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)

    # Reruns redrive what is left: the held copies came back when the process died (on SQS
    # once their visibility timeout passes, so until then a rerun may find nothing).
    redriven = {first.split()[1]}

    def rerun_done():
        out = asya_json(ns, "--transport", transport, "sump", "redrive", "--all")
        redriven.update(o["id"] for o in out["outcomes"] if o["result"] == "redriven")
        return redriven >= set(sent) and sump_ids(ns, transport) == []

    wait_for("every envelope redriven by the reruns", rerun_done, timeout=120, interval=2.0)
    sink = Collected(take, f"asya-{ns}-x-sink")

    def all_arrived():
        sink.at_least(len(sent))  # takes at least one more each call
        return {e["id"] for e in sink.items} >= set(sent)

    wait_for("every envelope in x-sink", all_arrived, timeout=POD_TIMEOUT, interval=1.0)
    ids = sorted(e["id"] for e in sink.items)
    # At least once: only the envelope in flight at the kill may be there twice.
    assert set(ids) == set(sent), ids
    assert len(ids) <= len(sent) + 1, ids


def test_trace_of_a_fan_out_shows_every_envelope(namespace):
    ns = namespace
    for name, handler in {"validate": "pipeline.Validator.check", "split": "pipeline.split",
                          "shout": "pipeline.shout"}.items():
        apply_on_node(ns, name, {"transport": "rabbitmq", "image": EXAMPLES_IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "handler": handler, "scaling": {"enabled": False}, "replicas": 1})
    for name in ("validate", "split", "shout"):
        wait_running(ns, name)
    out = asya(ns, "send", "validate", "--route", "split,shout", "--payload", json.dumps({"text": "hello brave world"}),
               "--wait", "--timeout", "3m", timeout=240)
    eid = out.stdout.split()[0]
    family = [eid, f"{eid}-1", f"{eid}-2"]
    # The release's trace backend (tests/e2e/up: tracing.queryUrl, the test Jaeger): every hop,
    # from the sidecars' spans, once the last sidecar exported its batch (every 5 s; until
    # then the backend knows nothing and the queues answer).
    hops = [("validate", eid), ("split", eid)] + [("shout", e) for e in family]
    trace = wait_for("every hop of the fan-out in the trace backend", lambda: (
        t := asya_json(ns, "trace", eid, check=False)) and "trace backend" in t.get("source", "")
        and len(t.get("hops", [])) >= len(hops) and t, timeout=90, interval=1.0)
    assert sorted((h["actor"], h["envelope"]) for h in trace["hops"]) == sorted(hops), trace
    assert all(h["outcome"] == "completed" for h in trace["hops"]), trace
    # The spans' tree: the fan-out's three hops under split's sends.
    tree = asya(ns, "trace", eid).stdout
    assert tree.count(f"process asya-{ns}-shout [shout]") == len(family), tree
    assert tree.count(f"send asya-{ns}-shout [split]") == len(family), tree
    # Without the backend: where each envelope of the family is now (all in x-sink).
    trace = wait_for("the three envelopes of the fan-out in the queues", lambda: (
        t := asya_json(ns, "trace", eid, "--trace-backend", "", check=False)) and len(t.get("hops", [])) >= 3 and t,
        timeout=60, interval=1.0)
    assert "queues" in trace["source"], trace["source"]
    assert sorted(h["envelope"] for h in trace["hops"]) == sorted(family), trace
    assert all(h["actor"] == "x-sink" and h["outcome"] == "finished" for h in trace["hops"]), trace


def test_a_caller_who_may_not_read_the_broker_secret_is_told_which_permission(namespace, tmp_path):
    ns = namespace
    fixable_actor(ns, "rabbitmq")
    user = f"viewer-{uuid.uuid4().hex[:6]}"
    # May read actors and the release's configuration, not Secrets.
    apply(ns, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "asya-viewer"},
               "rules": [{"apiGroups": ["asya.sh"], "resources": ["asyncactors"], "verbs": ["get", "list"]}]})
    apply(ns, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "asya-viewer"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "asya-viewer"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    # The admin's kubeconfig impersonating the user, as `kubectl --as` does.
    import yaml

    kc = yaml.safe_load(KUBECONFIG.read_text())
    for u in kc["users"]:
        u["user"]["as"] = user
    viewer = tmp_path / "kubeconfig"
    viewer.write_text(yaml.safe_dump(kc))
    config = tmp_path / "config.yaml"
    config.write_text(kubectl("get", "configmap", "asya-config", "-n", RELEASE_NS,
                              "-o", "jsonpath={.data.config\\.yaml}").stdout)

    out = asya(ns, "--config", str(config), "sump", "list", kubeconfig=viewer, check=False)
    assert out.returncode == 4, (out.stdout, out.stderr)
    assert f'you may not get secrets "asya-broker-rabbitmq" in namespace "{ns}"' in out.stderr, out.stderr
    # Without --config the release's ConfigMap is the first thing it may not read.
    out = asya(ns, "sump", "list", kubeconfig=viewer, check=False)
    assert out.returncode == 4 and f'configmaps "asya-config" in namespace "{RELEASE_NS}"' in out.stderr, out.stderr
    # Status needs only the actors.
    assert "fixme" in asya(ns, "status", kubeconfig=viewer).stdout
