"""The brokers of tests/services, from the host: RabbitMQ through its management API and
`rabbitmqctl`, the SQS server through boto3. Sending and taking envelopes, listing queues."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import urllib.request
from contextlib import contextmanager

from asya_e2e.env import ROOT
from asya_e2e.wait import wait_for

RABBIT_CTL = os.environ.get("ASYA_TEST_RABBITMQ_CTL", str(ROOT / "tests" / "services" / "rabbitmq"))
RABBIT_MANAGEMENT = os.environ.get("ASYA_TEST_RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672")
SQS_ENDPOINT = os.environ.get("ASYA_TEST_SQS_ENDPOINT", "http://127.0.0.1:9324")
RABBIT_PORT = int(os.environ.get("ASYA_TEST_RABBITMQ_PORT", "5672"))


def management(method: str, path: str, body: dict | None = None):
    req = urllib.request.Request(f"{RABBIT_MANAGEMENT}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def rabbit_send(queue: str, envelope: dict) -> None:
    out = management("POST", "/api/exchanges/%2F/asya/publish", {
        "properties": {"delivery_mode": 2, "content_type": "application/json"},
        "routing_key": queue, "payload": json.dumps(envelope), "payload_encoding": "string"})
    assert out["routed"] is True, f"nothing bound to {queue}"


def rabbit_take(queue: str, n: int) -> list[dict]:
    msgs = management("POST", f"/api/queues/%2F/{queue}/get",
                      {"count": n, "ackmode": "ack_requeue_false", "encoding": "auto"})
    return [json.loads(m["payload"]) for m in msgs]


def sqs():
    import boto3

    return boto3.client("sqs", endpoint_url=SQS_ENDPOINT, region_name="us-east-1",
                        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"))


def sqs_send(queue: str, envelope: dict) -> None:
    url = sqs().get_queue_url(QueueName=queue)["QueueUrl"]
    sqs().send_message(QueueUrl=url, MessageBody=json.dumps(envelope))


def sqs_take(queue: str, n: int) -> list[dict]:
    client = sqs()
    try:
        url = client.get_queue_url(QueueName=queue)["QueueUrl"]
    except client.exceptions.QueueDoesNotExist:
        return []
    out = client.receive_message(QueueUrl=url, MaxNumberOfMessages=min(n, 10), WaitTimeSeconds=1)
    msgs = out.get("Messages", [])
    for m in msgs:
        client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return [json.loads(m["Body"]) for m in msgs]


class Collected:
    """Envelopes taken from an end queue so far (taking removes them from the queue)."""

    def __init__(self, take, queue: str):
        self.take, self.queue, self.items = take, queue, []

    def at_least(self, n: int):
        self.items += self.take(self.queue, max(1, n - len(self.items)))
        return len(self.items) >= n and self.items


# How a test sends to and takes from a queue, by transport.
TRANSPORTS = {"rabbitmq": (rabbit_send, rabbit_take), "sqs": (sqs_send, sqs_take)}


def rabbit_queues() -> set[str]:
    out = subprocess.run([RABBIT_CTL, "ctl", "list_queues", "-q", "name"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def sqs_queue_url(name: str):
    try:
        return sqs().get_queue_url(QueueName=name)["QueueUrl"]
    except Exception:  # QueueDoesNotExist
        return None


def rabbit_publish(queue: str, n: int):
    """Publishes n messages to `queue` through the management API (exchange asya, routing key = queue)."""
    body = json.dumps({"properties": {}, "routing_key": queue, "payload": "{}", "payload_encoding": "string"}).encode()
    for _ in range(n):
        req = urllib.request.Request(f"{RABBIT_MANAGEMENT}/api/exchanges/%2F/asya/publish", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.load(r)["routed"] is True


def sqs_publish(name: str, n: int):
    """Sends n messages `{}` to the SQS queue `name`."""
    url = sqs_queue_url(name)
    for _ in range(n):
        sqs().send_message(QueueUrl=url, MessageBody="{}")


def rabbit_accepts_connections() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", RABBIT_PORT), timeout=2):
            return True
    except OSError:
        return False


@contextmanager
def rabbit_stopped():
    """RabbitMQ is stopped inside the block and back, accepting connections, when it ends."""
    try:
        subprocess.run([RABBIT_CTL, "stop"], check=True, timeout=120)
        yield
    finally:
        # `start` returns once the node runs and listens (tests/services/rabbitmq wait_ready).
        subprocess.run([RABBIT_CTL, "start"], check=True, timeout=180)
        wait_for("RabbitMQ accepting connections", rabbit_accepts_connections, timeout=60)


def rabbit_delete_queue(queue: str) -> None:
    """Deletes a queue a test left behind on purpose (absent is fine)."""
    subprocess.run([RABBIT_CTL, "ctl", "delete_queue", queue], capture_output=True, text=True, timeout=60)
