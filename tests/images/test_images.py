"""The container images of `make images` (target/images/NAME.oci.tar): each archive is a valid
OCI image, agrees with its Dockerfile, holds nothing its process does not need, and runs its
entry point under a real container runtime (containerd + runc from Debian's packages, started by
tests/services/containerd) as a non-root user with a read-only root filesystem.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "target" / "images"
CTL = os.environ.get("ASYA_TEST_CONTAINERD_CTL", str(ROOT / "tests/services/containerd"))
NS = "asya-image-tests"
# Which images there are is deploy/images/images.toml, the table make images builds from: every
# image it names is checked here. What each must contain and answer is written below.
sys.path.insert(0, str(ROOT / "deploy/images"))
import table as image_table  # noqa: E402

TABLE = image_table.load()
RUST_IMAGES = list(TABLE.rust)
# The Python images: the handlers of each (source directory -> directory in the image).
PYTHON_IMAGES = {n: (img.handlers, img.under.strip("/")) for n, img in TABLE.python.items()}
ALL_IMAGES = RUST_IMAGES + list(PYTHON_IMAGES)
NONROOT = 65532
# The sidecar image is pulled on every node that runs an actor (issue budget: 20 MB).
SIDECAR_BUDGET = 20 * 1000 * 1000
# What each binary says when its image runs with no arguments and no configuration.
ENTRYPOINT_ANSWERS = {
    "asya-webhook": "Usage: asya-webhook",
    "asya-sidecar": "ASYA_ACTOR_NAME: is required",
    "asya-queue-provisioner": "/home/nonroot/.kube/config",
    "asya-gateway": "Usage: asya-gateway",
    "asya-state-proxy": "ASYA_CONNECTOR",
}
SHELLS = ("bin/sh", "bin/bash", "bin/dash", "bin/busybox", "usr/bin/sh", "usr/bin/bash", "usr/bin/dash")


def workspace_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    assert m, "Cargo.toml has no workspace version"
    return m.group(1)


class Archive:
    """An OCI image archive, read and checked blob by blob."""

    def __init__(self, name: str):
        self.name = name
        self.path = IMAGES / f"{name}.oci.tar"
        assert self.path.is_file(), f"{self.path} is missing: run `make images`"
        with tarfile.open(self.path) as tar:
            self.files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}
        self.layout = json.loads(self.files["oci-layout"])
        self.index = json.loads(self.files["index.json"])
        digest = self.index["manifests"][0]["digest"]
        self.manifest = json.loads(self.blob(digest))
        self.config = json.loads(self.blob(self.manifest["config"]["digest"]))

    def blob(self, digest: str) -> bytes:
        algo, hexd = digest.split(":", 1)
        assert algo == "sha256", digest
        data = self.files.get(f"blobs/sha256/{hexd}")
        assert data is not None, f"{self.name}: blob {digest} is not in the archive"
        assert hashlib.sha256(data).hexdigest() == hexd, f"{self.name}: blob {digest} does not match its digest"
        return data

    def layer_tars(self) -> list[bytes]:
        return [gzip.decompress(self.blob(layer["digest"])) for layer in self.manifest["layers"]]

    def paths(self) -> set[str]:
        out = set()
        for raw in self.layer_tars():
            with tarfile.open(fileobj=io.BytesIO(raw)) as t:
                out.update(m.name.lstrip("./") for m in t.getmembers())
        return out

    def compressed_size(self) -> int:
        return sum(layer["size"] for layer in self.manifest["layers"])


@pytest.fixture(scope="module", params=ALL_IMAGES)
def archive(request) -> Archive:
    return Archive(request.param)


# --- the archive --------------------------------------------------------------------------


def test_archive_is_a_valid_oci_image(archive: Archive):
    assert archive.layout == {"imageLayoutVersion": "1.0.0"}
    idx = archive.index
    assert idx["schemaVersion"] == 2
    assert idx["mediaType"] == "application/vnd.oci.image.index.v1+json"
    names = {m["annotations"]["io.containerd.image.name"] for m in idx["manifests"]}
    assert names == {f"localhost/asya-rs/{archive.name}:dev", f"localhost/asya-rs/{archive.name}:{workspace_version()}"}
    assert {m["annotations"]["org.opencontainers.image.ref.name"] for m in idx["manifests"]} == {"dev", workspace_version()}
    assert len({m["digest"] for m in idx["manifests"]}) == 1, "both tags name one manifest"
    ref = idx["manifests"][0]
    manifest_bytes = archive.blob(ref["digest"])
    assert len(manifest_bytes) == ref["size"]

    m = archive.manifest
    assert m["schemaVersion"] == 2
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert len(archive.blob(m["config"]["digest"])) == m["config"]["size"]
    assert m["layers"], "an image needs at least one layer"
    for layer in m["layers"]:
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        assert len(archive.blob(layer["digest"])) == layer["size"]

    cfg = archive.config
    assert cfg["os"] == "linux"
    assert cfg["architecture"] == ref["platform"]["architecture"]
    # diff_ids are the digests of the uncompressed layers, in order.
    assert cfg["rootfs"]["type"] == "layers"
    assert cfg["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in archive.layer_tars()]
    assert len(cfg["history"]) == len(m["layers"])


def test_labels_name_source_revision_and_version(archive: Archive):
    labels = archive.config["config"]["Labels"]
    assert labels["org.opencontainers.image.source"] == "https://github.com/asya-rs/asya-rs"
    assert labels["org.opencontainers.image.version"] == workspace_version()
    assert labels["org.opencontainers.image.title"] == archive.name
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    # A tree with changes builds `HEAD-dirty`: never a commit the image was not built from.
    assert labels["org.opencontainers.image.revision"] in (head, f"{head}-dirty")
    assert archive.manifest["annotations"]["org.opencontainers.image.revision"] == labels["org.opencontainers.image.revision"]


def test_user_is_not_root(archive: Archive):
    user = archive.config["config"]["User"]
    uid = user.split(":")[0]
    assert uid not in ("", "0", "root"), f"{archive.name} runs as {user!r}"
    assert int(uid) == NONROOT


def dockerfile_args(name: str) -> dict[str, str]:
    """The ARG defaults of an image's Dockerfile."""
    text = (ROOT / "deploy/images" / name / "Dockerfile").read_text()
    return dict(re.findall(r"^ARG\s+([A-Z0-9_]+)=(\S+)\s*$", text, re.M))


def dockerfile_final_stage(name: str) -> dict:
    """USER, ENTRYPOINT, EXPOSE and LABEL keys of the Dockerfile's last stage."""
    text = (ROOT / "deploy/images" / name / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    stage = text.split("\nFROM ")[-1]
    out: dict = {"labels": set(), "expose": set()}
    for line in stage.splitlines():
        line = line.strip()
        if line.startswith("USER "):
            out["user"] = line.split(None, 1)[1]
        elif line.startswith("ENTRYPOINT "):
            out["entrypoint"] = json.loads(line.split(None, 1)[1])
        elif line.startswith("EXPOSE "):
            out["expose"].update(line.split()[1:])
        elif line.startswith("LABEL "):
            out["labels"].update(re.findall(r'([a-z0-9.\-]+)="', line))
    return out


def test_agrees_with_its_dockerfile(archive: Archive):
    df = dockerfile_final_stage(archive.name)
    cfg = archive.config["config"]
    assert df["user"] == cfg["User"]
    assert df["entrypoint"] == cfg["Entrypoint"]
    assert df["expose"] == set(cfg.get("ExposedPorts", {}))
    missing = df["labels"] - set(cfg["Labels"])
    assert not missing, f"labels in the Dockerfile but not in the image: {missing}"


@pytest.mark.parametrize("name", RUST_IMAGES)
def test_rust_images_hold_no_shell_and_no_package_manager(name: str):
    paths = Archive(name).paths()
    assert f"usr/local/bin/{name}" in paths
    found = [p for p in paths if p in SHELLS or p.endswith(("bin/apt", "bin/dpkg", "bin/apt-get"))]
    assert not found, f"{name} contains {found}"
    # Beyond the binary: the C libraries, certificates, passwd/group, copyright files, /tmp.
    tops = {p.split("/")[0] for p in paths}
    assert tops <= {"etc", "home", "lib", "lib64", "root", "tmp", "usr"}, tops
    if name == "asya-sidecar":
        runtime = (ROOT / "sidecar/runtime/asya_runtime.py").read_bytes()
        tars = Archive(name).layer_tars()
        found_runtime = []
        for raw in tars:
            with tarfile.open(fileobj=io.BytesIO(raw)) as t:
                with contextlib.suppress(KeyError):
                    found_runtime.append(t.extractfile("usr/share/asya/asya_runtime.py").read())
        assert found_runtime == [runtime]


def layer_files(archive: Archive) -> dict[str, bytes]:
    """Every regular file of the image, as its layers leave it (a later layer wins)."""
    out: dict[str, bytes] = {}
    for raw in archive.layer_tars():
        with tarfile.open(fileobj=io.BytesIO(raw)) as t:
            for m in t.getmembers():
                if m.isreg():
                    out[m.name.lstrip("./")] = t.extractfile(m).read()
    return out


@pytest.mark.parametrize("name", list(PYTHON_IMAGES))
def test_python_images_carry_the_runtime_and_their_handlers_under_app(name: str):
    archive = Archive(name)
    files = layer_files(archive)
    assert files["opt/asya/asya_runtime.py"] == (ROOT / "sidecar/runtime/asya_runtime.py").read_bytes()
    src, dst = PYTHON_IMAGES[name]
    sources = sorted((ROOT / src).glob("*.py"))
    assert sources, f"{src} has no handlers"
    for f in sources:
        assert files.get(f"{dst}/{f.name}") == f.read_bytes(), f"{name}: {dst}/{f.name} differs from {src}/{f.name}"
    cfg = archive.config["config"]
    # /app, not /opt/asya: injection mounts the runtime's emptyDir over /opt/asya.
    assert "PYTHONPATH=/app" in cfg["Env"], cfg["Env"]
    assert cfg["WorkingDir"] == "/app"
    assert cfg["Entrypoint"] == ["python3", "/opt/asya/asya_runtime.py"]


def test_sizes_and_the_sidecar_budget():
    sizes = {n: Archive(n).compressed_size() for n in ALL_IMAGES}
    for n, s in sizes.items():
        print(f"IMAGE-SIZE {n} compressed={s / 1e6:.1f}MB")
    assert sizes["asya-sidecar"] < SIDECAR_BUDGET, f"asya-sidecar is {sizes['asya-sidecar']} bytes compressed"
    # The Rust images share their base layer, so a node stores it once.
    bases = {Archive(n).manifest["layers"][0]["digest"] for n in RUST_IMAGES}
    assert len(bases) == 1, bases


# --- under containerd -----------------------------------------------------------------------


def ctr(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([CTL, "ctr", "-n", NS, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ctr {' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


class Imported:
    """The images imported into containerd, each on first use: `imported[name]` is its
    reference (so a test of one image needs only that image's archive)."""

    def __init__(self) -> None:
        self.refs: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        if name not in self.refs:
            path = IMAGES / f"{name}.oci.tar"
            assert path.is_file(), f"{path} is missing: run `make images`"
            ctr("images", "import", str(path), timeout=300)
            ref = f"localhost/asya-rs/{name}:dev"
            listed = ctr("images", "ls", "-q").stdout.split()
            assert ref in listed and f"localhost/asya-rs/{name}:{workspace_version()}" in listed, listed
            self.refs[name] = ref
        return self.refs[name]


@pytest.fixture(scope="module")
def imported() -> Imported:
    st = subprocess.run([CTL, "status"], capture_output=True, text=True)
    assert st.returncode == 0, "containerd is not running: tests/services/up starts it"
    return Imported()


def run_once(ref: str, *args: str, mounts: tuple[str, ...] = (), env: tuple[str, ...] = (), read_only: bool = True):
    """Runs a container to its end. `stdout` is the container's output (stdout and stderr
    together), `stderr` is ctr's own. The output goes through a log file the shim writes, not
    ctr's FIFOs: ctr can lose the output of a process that exits at once (containerd#770; seen
    in CI as an empty `--version`), while the shim finishes copying into the file before the
    task's delete returns."""
    cid = f"t-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="asya-run-once-") as tmp:
        log = Path(tmp, "output")
        flags = ["--rm", "--log-uri", f"file://{log}"] + (["--read-only"] if read_only else [])
        for m in mounts:
            flags += ["--mount", m]
        for e in env:
            flags += ["--env", e]
        proc = ctr("run", *flags, ref, cid, *args, check=False)
        output = log.read_text() if log.exists() else ""
    return subprocess.CompletedProcess(proc.args, proc.returncode, output, proc.stderr)


@contextlib.contextmanager
def running(ref: str, *args: str, mounts: tuple[str, ...] = (), env: tuple[str, ...] = (), net_host: bool = False):
    """A detached container; yields its host pid, removes it afterwards."""
    cid = f"t-{uuid.uuid4().hex[:12]}"
    flags = ["--detach", "--read-only"] + (["--net-host"] if net_host else [])
    for m in mounts:
        flags += ["--mount", m]
    for e in env:
        flags += ["--env", e]
    ctr("run", *flags, ref, cid, *args)
    try:
        pid = None
        deadline = time.monotonic() + 30
        while pid is None and time.monotonic() < deadline:
            for line in ctr("tasks", "ls").stdout.splitlines()[1:]:
                cols = line.split()
                if cols and cols[0] == cid and cols[2] == "RUNNING":
                    pid = int(cols[1])
            if pid is None:
                time.sleep(0.1)
        assert pid, f"container {cid} never reached RUNNING: {ctr('tasks', 'ls').stdout}"
        yield pid
    finally:
        ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and ctr("tasks", "delete", cid, check=False).returncode != 0:
            if cid not in ctr("tasks", "ls", "-q").stdout.split():
                break
            time.sleep(0.1)
        ctr("containers", "delete", cid, check=False)


def uids_of(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError(f"/proc/{pid}/status has no Uid line")


def wait_for(what: str, cond, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def shared_dir():
    """A host directory the container's nonroot user may write into."""
    d = tempfile.mkdtemp(prefix="asya-image-test-")
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("name", RUST_IMAGES)
def test_entry_point_answers_version_and_help(imported, name: str):
    binary = f"/usr/local/bin/{name}"
    out = run_once(imported[name], binary, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{name} {workspace_version()}"
    out = run_once(imported[name], binary, "--help")
    assert out.returncode == 0, out.stderr
    assert f"Usage: {name}" in out.stdout
    # The image's own ENTRYPOINT, with no arguments: the binary itself answers, as it would
    # in a pod that gives it nothing (the user's home is nonroot's: HOME comes from passwd).
    out = run_once(imported[name])
    assert out.returncode != 0
    assert ENTRYPOINT_ANSWERS[name] in out.stdout + out.stderr, (out.stdout, out.stderr)


def test_webhook_writes_certificates_as_nonroot(imported, shared_dir):
    out = run_once(imported["asya-webhook"], "/usr/local/bin/asya-webhook", "certs", "generate", "--out", "/out",
                   "--dns", "asya-webhook.asya-system.svc",
                   mounts=(f"type=bind,src={shared_dir},dst=/out,options=rbind:rw",))
    assert out.returncode == 0, out.stderr
    for f in ("ca.crt", "tls.crt", "tls.key"):
        st = os.stat(os.path.join(shared_dir, f))
        assert st.st_uid == NONROOT, f"{f} owned by uid {st.st_uid}"
    assert Path(shared_dir, "tls.crt").read_text().startswith("-----BEGIN CERTIFICATE-----")
    # The key is for the process's eyes only.
    assert os.stat(os.path.join(shared_dir, "tls.key")).st_mode & 0o077 == 0


def test_sidecar_install_runtime_writes_the_runtime(imported, shared_dir):
    out = run_once(imported["asya-sidecar"], "/usr/local/bin/asya-sidecar", "install-runtime", "/opt/asya",
                   mounts=(f"type=bind,src={shared_dir},dst=/opt/asya,options=rbind:rw",))
    assert out.returncode == 0, out.stderr
    written = Path(shared_dir, "asya_runtime.py")
    assert written.read_bytes() == (ROOT / "sidecar/runtime/asya_runtime.py").read_bytes()
    assert written.stat().st_uid == NONROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_provisioner_serves_health_as_nonroot_on_a_read_only_root(imported, shared_dir):
    # An API server that refuses connections: the provisioner starts, answers /healthz and keeps
    # trying; enough to see the process run as it would in a pod.
    kubeconfig = Path(shared_dir, "kubeconfig")
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    kubeconfig.chmod(0o644)
    port = free_port()
    with running(imported["asya-queue-provisioner"], "/usr/local/bin/asya-queue-provisioner",
                 "--kubeconfig", "/kube/kubeconfig", "--metrics-addr", f"127.0.0.1:{port}",
                 mounts=(f"type=bind,src={shared_dir},dst=/kube,options=rbind:ro",), net_host=True) as pid:
        def healthy():
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    # The body names the phase (queue-provisioner/src/health.rs): "ok: starting".
                    return r.status == 200 and r.read().startswith(b"ok: ")
            return False
        wait_for("the provisioner's /healthz", healthy)
        assert all(u == NONROOT for u in uids_of(pid)), uids_of(pid)


SQS_ENDPOINT = os.environ.get("ASYA_TEST_SQS_ENDPOINT", "http://127.0.0.1:9324")
GATEWAY_TOOLS = """
routes:
  tools:
  - name: echo
    description: Says it back
    parameters:
      text: {type: string, required: true}
    route: [first, second]
"""


def http_json(method: str, url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_gateway_serves_tools_and_sends_envelopes_as_nonroot(imported, shared_dir):
    """The gateway image as the chart runs it (tools file and token Secret mounted read-only,
    no database): /health answers, a call without the token is refused, a call with it puts
    the envelope on the first actor's queue of the SQS server."""
    import boto3

    ns = f"img{uuid.uuid4().hex[:8]}"
    sqs = boto3.client("sqs", endpoint_url=SQS_ENDPOINT, region_name="us-east-1",
                       aws_access_key_id="test", aws_secret_access_key="test")
    queue = sqs.create_queue(QueueName=f"asya-{ns}-first")["QueueUrl"]
    token = "image-test-token-" + uuid.uuid4().hex
    Path(shared_dir, "tools.yaml").write_text(GATEWAY_TOOLS)
    Path(shared_dir, "tokens").write_text(token + "\n")
    for f in ("tools.yaml", "tokens"):
        Path(shared_dir, f).chmod(0o644)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        with running(imported["asya-gateway"], "/usr/local/bin/asya-gateway", "serve",
                     "--addr", f"127.0.0.1:{port}", "--tools", "/etc/asya/tools.yaml",
                     "--auth-tokens", "/etc/asya/tokens", "--namespace", ns,
                     "--sqs-region", "us-east-1", "--sqs-endpoint", SQS_ENDPOINT,
                     env=("AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"),
                     mounts=(f"type=bind,src={shared_dir},dst=/etc/asya,options=rbind:ro",), net_host=True) as pid:
            def healthy():
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                        return r.status == 200
                return False
            wait_for("the gateway's /health", healthy)
            assert all(u == NONROOT for u in uids_of(pid)), uids_of(pid)

            status, body = http_json("POST", f"{base}/tools/call", {"name": "echo", "arguments": {"text": "hi"}})
            assert status == 401, body
            status, body = http_json("POST", f"{base}/tools/call", {"name": "echo", "arguments": {"text": "hi"}},
                                     token=token)
            assert status == 202, body
            got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, WaitTimeSeconds=10).get("Messages", [])
            assert len(got) == 1, got
            envelope = json.loads(got[0]["Body"])
            assert envelope["id"] == body["envelope_id"]
            assert envelope["route"] == {"actors": ["first", "second"], "current": 0}
            assert envelope["payload"] == {"text": "hi"}
    finally:
        sqs.delete_queue(QueueUrl=queue)


def frame(obj) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def read_frame(conn: socket.socket) -> object:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            assert chunk, "the runtime closed the connection mid-frame"
            buf += chunk
        return buf
    (length,) = struct.unpack(">I", exactly(4))
    # Bit 31: the runtime keeps the connection for another request (docs/DESIGN.md §4).
    return json.loads(exactly(length & 0x7FFFFFFF))


def test_examples_image_serves_a_handler_over_the_socket(imported, shared_dir):
    with running(imported["asya-examples"],
                 env=("ASYA_HANDLER=pipeline.shout", "ASYA_SOCKET_DIR=/var/run/asya"),
                 mounts=(f"type=bind,src={shared_dir},dst=/var/run/asya,options=rbind:rw",)) as pid:
        sock_path = os.path.join(shared_dir, "asya-runtime.sock")
        wait_for("the runtime's socket", lambda: os.path.exists(sock_path))
        assert all(u == NONROOT for u in uids_of(pid)), uids_of(pid)
        envelope = {"id": "e1", "route": {"actors": ["shout"], "current": 0}, "headers": {},
                    "payload": {"word": "hello", "position": 3}}
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(30)
            conn.connect(sock_path)
            conn.sendall(frame(envelope))
            answer = read_frame(conn)
        assert answer == {"word": "HELLO", "position": 3}
        # A handler error comes back as an error object with its traceback.
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(30)
            conn.connect(sock_path)
            conn.sendall(frame({**envelope, "payload": {"position": 1}}))
            answer = read_frame(conn)
        assert answer["error"], answer
        assert answer["details"]["type"] == "KeyError"
        assert "shout" in answer["details"]["traceback"]


# The S3 server of tests/services (moto; tests/services/env), for the crew's end actors.
S3_ENDPOINT = os.environ.get("ASYA_TEST_S3_ENDPOINT", "http://127.0.0.1:4566")

CREW_PROBE = """
import json, os
import boto3, botocore, botocore.httpsession
import handlers.end_handlers as crew
print(json.dumps({
    "uid": os.getuid(),
    "boto3": boto3.__version__,
    "botocore": botocore.__version__,
    "module": crew.__file__,
    "handlers": [n for n in ("happy_end_handler", "error_end_handler") if callable(getattr(crew, n, None))],
    "ca_bundle": os.path.isfile(botocore.httpsession.get_cert_path(True)),
}))
"""


def test_crew_image_imports_boto3_and_the_end_handlers(imported):
    # The image's own environment (PYTHONPATH=/app, no --env): as the chart's AsyncActors run it.
    out = run_once(imported["asya-crew"], "python3", "-c", CREW_PROBE)
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert got["uid"] == NONROOT
    assert got["module"] == "/app/handlers/end_handlers.py"
    assert got["handlers"] == ["happy_end_handler", "error_end_handler"]
    # Stores go to S3 over HTTPS: botocore must find a CA bundle.
    assert got["ca_bundle"], "botocore finds no CA bundle in the image"
    # The Dockerfile pins the versions Debian's packages give `make images`: both builds agree.
    args = dockerfile_args("asya-crew")
    assert got["boto3"] == args["BOTO3_VERSION"], (got, args)
    assert got["botocore"] == args["BOTOCORE_VERSION"], (got, args)


# happy-end stores under the route's last actor, error-end under the actor that failed.
@pytest.mark.parametrize("handler, prefix, actor", [
    ("happy_end_handler", "results/", "count"),
    ("error_end_handler", "errors/", "shout"),
], ids=["happy-end", "error-end"])
def test_crew_image_stores_the_envelope_in_s3(imported, shared_dir, handler, prefix, actor):
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test",
                      config=Config(s3={"addressing_style": "path"}))
    bucket = f"crew-image-{uuid.uuid4().hex[:12]}"
    envelope = {"id": f"e-{uuid.uuid4().hex[:8]}", "route": {"actors": ["shout", "count"], "current": 2},
                "headers": {}, "payload": {"word": "HELLO"}}
    if handler == "error_end_handler":
        envelope["route"]["current"] = 0
        envelope["headers"]["x-asya-error"] = {"actor": actor, "error": "boom"}
    env = (f"ASYA_HANDLER=handlers.end_handlers.{handler}", "ASYA_HANDLER_MODE=envelope",
           "ASYA_SOCKET_DIR=/var/run/asya", f"ASYA_S3_BUCKET={bucket}", f"ASYA_S3_ENDPOINT={S3_ENDPOINT}",
           "ASYA_S3_ACCESS_KEY=test", "ASYA_S3_SECRET_KEY=test")
    try:
        with running(imported["asya-crew"], env=env, net_host=True,
                     mounts=(f"type=bind,src={shared_dir},dst=/var/run/asya,options=rbind:rw",)) as pid:
            sock_path = os.path.join(shared_dir, "asya-runtime.sock")
            wait_for("the runtime's socket", lambda: os.path.exists(sock_path))
            assert all(u == NONROOT for u in uids_of(pid)), uids_of(pid)
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(60)
                conn.connect(sock_path)
                conn.sendall(frame(envelope))
                answer = read_frame(conn)
        # An end actor answers nothing; a failed store would be an error object.
        assert answer is None, answer
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert len(keys) == 1, keys
        assert keys[0].startswith(prefix) and keys[0].endswith(f"/{actor}/{envelope['id']}.json"), keys
        assert json.loads(s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read()) == envelope
    finally:
        with contextlib.suppress(Exception):
            for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=o["Key"])
            s3.delete_bucket(Bucket=bucket)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket, as the runtime speaks to a state-proxy connector."""

    def __init__(self, path: str):
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(self.unix_path)


def state_call(sock_path: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = _UnixHTTPConnection(sock_path)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_state_proxy_stores_a_file_in_s3_as_nonroot_on_a_read_only_root(imported, shared_dir):
    import boto3

    bucket = "asya-image-test-state"
    s3 = boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=bucket)
    prefix = f"image-test-{uuid.uuid4().hex[:8]}"
    env = ("CONNECTOR_SOCKET=/var/run/asya/state/ckpt.sock", "ASYA_NAMESPACE=image-test", f"STATE_BUCKET={bucket}",
           f"STATE_PREFIX={prefix}",
           f"AWS_ENDPOINT_URL={S3_ENDPOINT}", "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test",
           "AWS_SECRET_ACCESS_KEY=test")
    with running(imported["asya-state-proxy"], "/usr/local/bin/asya-state-proxy", "s3-buffered-cas", env=env,
                 mounts=(f"type=bind,src={shared_dir},dst=/var/run/asya/state,options=rbind:rw",),
                 net_host=True) as pid:
        sock_path = os.path.join(shared_dir, "ckpt.sock")
        wait_for("the connector's socket", lambda: os.path.exists(sock_path))
        assert all(u == NONROOT for u in uids_of(pid)), uids_of(pid)
        assert state_call(sock_path, "GET", "/healthz")[0] == 200
        status, body = state_call(sock_path, "PUT", "/keys/runs/run-42.json", b'{"step": 7}')
        assert status == 200, body
        assert state_call(sock_path, "GET", "/keys/runs/run-42.json") == (200, b'{"step": 7}')
        # Under the namespace it serves, then its prefix.
        got = s3.get_object(Bucket=bucket, Key=f"image-test/{prefix}/runs/run-42.json")["Body"].read()
        assert got == b'{"step": 7}'
