"""The test S3 server (moto, tests/services/s3) as the state proxy tests use it: a client, and
a fresh bucket per test."""

from __future__ import annotations

import os
import uuid

import pytest

S3_ENDPOINT = os.environ.get("ASYA_TEST_S3_ENDPOINT", "http://127.0.0.1:4566")


def s3():
    import boto3

    return boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1",
                        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"))


def keys(bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3().list_objects_v2(Bucket=bucket).get("Contents", []))


@pytest.fixture
def bucket():
    """A bucket of its own for the test, emptied and deleted afterwards (import it into a test
    module to use it)."""
    name = f"asya-e2e-state-{uuid.uuid4().hex[:12]}"
    client = s3()
    client.create_bucket(Bucket=name)
    yield name
    for obj in client.list_objects_v2(Bucket=name).get("Contents", []):
        client.delete_object(Bucket=name, Key=obj["Key"])
    client.delete_bucket(Bucket=name)
