"""The crew: end actors of a namespace's x-sink and x-sump queues (envelope mode).

`happy_end_handler` serves x-sink (finished envelopes), `error_end_handler` serves x-sump
(failed ones). Each stores the whole envelope in S3 (or MinIO, or any S3-compatible server)
under `{prefix}{date}/{last actor}/{id}.json` and returns nothing; the sidecar then reports
the final status to the gateway. A failure to store raises, so the actor's retry policy
retries it: an envelope is never dropped silently.

Environment:
  ASYA_S3_BUCKET          bucket (required); created when missing
  ASYA_S3_ENDPOINT        endpoint URL for MinIO or a local S3 server (default: AWS)
  ASYA_S3_ACCESS_KEY      static credentials (else the default AWS chain: IRSA, env, ...)
  ASYA_S3_SECRET_KEY
  ASYA_S3_REGION          default AWS_REGION, else us-east-1
  ASYA_S3_RESULTS_PREFIX  default "results/"
  ASYA_S3_ERRORS_PREFIX   default "errors/"
"""

import datetime
import json
import os
import threading

ERROR_HEADER = "x-asya-error"

_client = None
_bucket_ready = set()
_lock = threading.Lock()


class ConfigError(Exception):
    pass


def _env(name, default=None):
    value = os.environ.get(name, "").strip()
    return value or default


def _s3():
    global _client
    with _lock:
        if _client is None:
            import boto3
            from botocore.config import Config

            kwargs = {
                "region_name": _env("ASYA_S3_REGION", _env("AWS_REGION", "us-east-1")),
                "config": Config(
                    retries={"max_attempts": 3, "mode": "standard"},
                    connect_timeout=5,
                    read_timeout=30,
                    # MinIO and local servers want path-style URLs.
                    s3={"addressing_style": "path"} if _env("ASYA_S3_ENDPOINT") else {},
                ),
            }
            if _env("ASYA_S3_ENDPOINT"):
                kwargs["endpoint_url"] = _env("ASYA_S3_ENDPOINT")
            if _env("ASYA_S3_ACCESS_KEY"):
                kwargs["aws_access_key_id"] = _env("ASYA_S3_ACCESS_KEY")
                kwargs["aws_secret_access_key"] = _env("ASYA_S3_SECRET_KEY")
            _client = boto3.client("s3", **kwargs)
        return _client


def _bucket():
    bucket = _env("ASYA_S3_BUCKET")
    if not bucket:
        raise ConfigError("ASYA_S3_BUCKET is required: the bucket the crew stores envelopes in")
    return bucket


def _ensure_bucket(client, bucket):
    if bucket in _bucket_ready:
        return
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise
        region = client.meta.region_name
        kwargs = {"Bucket": bucket}
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            client.create_bucket(**kwargs)
        except ClientError as ce:
            if ce.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
    _bucket_ready.add(bucket)


def last_actor(envelope, failed):
    """The actor the envelope was last at: the one that failed, or the route's last."""
    if failed:
        err = (envelope.get("headers") or {}).get(ERROR_HEADER) or {}
        if isinstance(err, dict) and err.get("actor"):
            return str(err["actor"])
    route = envelope.get("route") or {}
    actors = route.get("actors") or []
    current = route.get("current", len(actors))
    if failed and isinstance(current, int) and 0 <= current < len(actors):
        return str(actors[current])
    return str(actors[-1]) if actors else "unknown"


def key_for(envelope, failed, now=None):
    prefix = _env("ASYA_S3_ERRORS_PREFIX", "errors/") if failed else _env("ASYA_S3_RESULTS_PREFIX", "results/")
    day = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d")
    safe = lambda s: "".join(c if c.isalnum() or c in "-_." else "_" for c in s)
    return "%s%s/%s/%s.json" % (prefix, day, safe(last_actor(envelope, failed)), safe(str(envelope.get("id", "unknown"))))


def store(envelope, failed):
    client = _s3()
    bucket = _bucket()
    _ensure_bucket(client, bucket)
    key = key_for(envelope, failed)
    body = json.dumps(envelope, sort_keys=True).encode()
    client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
    return key


def happy_end_handler(envelope):
    """x-sink: a finished envelope, stored under the results prefix."""
    store(envelope, failed=False)
    return None


def error_end_handler(envelope):
    """x-sump: a failed envelope, stored under the errors prefix."""
    store(envelope, failed=True)
    return None
