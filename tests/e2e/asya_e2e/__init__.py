"""The end-to-end suite's helpers, one module per job; tests/e2e/conftest.py holds only the
pytest hooks and fixtures.

- `env`: where things are (the repository, the test cluster's kubeconfig, kubectl and helm)
  and what tests/e2e/up recorded (webhook on, components as pods, the provisioner's URL).
- `kube`: kubectl and helm, and the shared object reads and writes (`get`, `status`, `apply`).
- `wait`: `wait_for`, the bounded poll every wait goes through.
- `components`: the webhook's and the provisioner's logs, processes, and stopping one.
- `brokers`: sending to and taking from RabbitMQ and SQS queues from the host.
- `actors`: AsyncActor documents, their pods on the test node, phase waits.
- `provisioner`: the provisioner's readyz and metrics, and its work counters.

Tests and the bench_*.py scripts import from here (tests/e2e is on sys.path under pytest:
the directory has no __init__.py, so pytest's default import mode puts it first).
"""
