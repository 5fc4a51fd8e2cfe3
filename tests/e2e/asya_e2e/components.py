"""The webhook and the provisioner of tests/e2e/up (the chart's pods, or local processes):
their logs, their processes, and stopping one for a disruptive test."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path

from asya_e2e.env import RELEASE, RELEASE_NS, ROOT, STATE, components_in_pods
from asya_e2e.kube import kubectl, kubectl_json, run
from asya_e2e.wait import wait_for


def e2e_up():
    """tests/e2e/up: (re)starts whatever of the environment is not running (idempotent)."""
    run([ROOT / "tests" / "e2e" / "up"], timeout=600)


def component_log(name: str) -> str:
    """What the webhook or provisioner NAME has logged since it last started."""
    if components_in_pods():
        return kubectl("logs", "-n", RELEASE_NS, f"deployment/{RELEASE}-{name}", "--tail=-1").stdout
    return (STATE / f"{name}.log").read_text()


def pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


BINARIES = {"webhook": "asya-webhook", "provisioner": "asya-queue-provisioner"}


def component_pid(name: str) -> int:
    """The host pid of the webhook or provisioner NAME (a pod's process is one of this
    machine's too): for CPU and memory figures."""
    if not components_in_pods():
        return int((STATE / f"{name}.pid").read_text().strip())
    found = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone, or not a process
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == BINARIES[name] and \
                b"--config=/etc/asya/config.yaml" in argv:
            found.append(int(d.name))
    assert len(found) == 1, f"expected one {name} pod process, found {found}"
    return found[0]


def _pods_of(name: str) -> list[dict]:
    return kubectl_json("get", "pods", "-n", RELEASE_NS, "-l",
                        f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={name}")["items"]


def stop_component(name: str, sig=signal.SIGTERM) -> None:
    """Stops the webhook or provisioner NAME: the local process by SIG, or the chart's pods by
    scaling the Deployment to zero (SIGKILL: the pods are deleted without a grace period, so
    nothing shuts down cleanly and a held lease stays held until it expires)."""
    if not components_in_pods():
        pid = int((STATE / f"{name}.pid").read_text().strip())
        os.kill(pid, sig)
        wait_for(f"the {name} to stop", lambda: not pid_alive(pid), timeout=20)
        return
    kubectl("scale", "deployment", f"{RELEASE}-{name}", "-n", RELEASE_NS, "--replicas=0")
    if sig == signal.SIGKILL:
        for p in _pods_of(name):
            kubectl("delete", "pod", p["metadata"]["name"], "-n", RELEASE_NS, "--grace-period=0", "--force",
                    "--wait=false", check=False)
    wait_for(f"the {name}'s pods to stop", lambda: not _pods_of(name), timeout=60)


@contextmanager
def process_stopped(name: str, sig=signal.SIGTERM):
    """The webhook or provisioner NAME is stopped inside the block and started again by
    tests/e2e/up when the block ends, however it ends."""
    try:
        yield stop_component(name, sig)
    finally:
        e2e_up()
