#!/usr/bin/env python3
"""Writes the project's container images as OCI image archives, with no registry and no
container engine: the machines that build them here reach Debian's packages but no image
registry, so the bases are made from this machine's Debian files (the Rust images) or by
mmdebstrap (the Python images: asya-examples, asya-crew), and the layers are written by this
script.

    ocibuild.py --out target/images --bin-dir DIR [--only NAME]... [--keda-dir DIR]

What the images are (names, descriptions, ports, users, environment, Debian packages,
handlers, extra files) is deploy/images/images.toml, the table the Dockerfiles beside this
file are generated from (dockerfiles.py); this script holds only how an archive is written.

Every archive is a deterministic function of its inputs (sorted entries, fixed owners and
times, gzip without a timestamp, `created` from the commit): the same inputs give the same
digests, so a rebuild that changes nothing rewrites nothing and takes seconds. Compressed
layers are cached by the digest of their uncompressed content under $ASYA_IMAGES_CACHE.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import table
from table import ROOT, TableError

try:
    TABLE = table.load()
except TableError as e:
    sys.exit(f"deploy/images/ocibuild.py: {e}")
NAME_PREFIX = "localhost/asya-rs"
NONROOT = int(TABLE.common.user.split(":")[0])
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# Debian releases the Python bases are made from: the table's suite with its updates.
DEBIAN_SUITE = TABLE.python_suite
DEBIAN_SOURCES = [
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE} main",
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main",
]
# Part of a layer's identity: the same files at another level are other bytes, another digest.
GZIP_LEVEL = 6


def log(msg: str) -> None:
    print(f"images: {msg}", flush=True)


class BuildError(Exception):
    pass


# --- layers -------------------------------------------------------------------------------


@dataclasses.dataclass
class Entry:
    """One path in a layer. `data` for files, `target` for symlinks, neither for dirs."""

    path: str  # without a leading slash
    mode: int
    uid: int = 0
    gid: int = 0
    data: bytes | None = None
    target: str | None = None

    @property
    def kind(self) -> bytes:
        if self.target is not None:
            return tarfile.SYMTYPE
        return tarfile.REGTYPE if self.data is not None else tarfile.DIRTYPE


class Layer:
    """Entries of one layer; parent directories are added as root-owned 0755."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def _parents(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            self.entries.setdefault(p, Entry(p, 0o755))

    def dir(self, path: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = Entry(path, mode, uid, gid)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = Entry(path, mode, data=data)

    def symlink(self, path: str, target: str) -> None:
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = Entry(path, 0o777, target=target)

    def tar_bytes(self, mtime: int) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                e = self.entries[path]
                info = tarfile.TarInfo(e.path)
                info.type = e.kind
                info.mode = e.mode
                info.uid, info.gid = e.uid, e.gid
                info.uname = info.gname = ""
                info.mtime = mtime
                if e.target is not None:
                    info.linkname = e.target
                if e.data is not None:
                    info.size = len(e.data)
                    tar.addfile(info, io.BytesIO(e.data))
                else:
                    tar.addfile(info)
        return buf.getvalue()


def _rel(name: str) -> str:
    """A tar member name without its leading "./" or "/" (but ".bashrc" stays .bashrc)."""
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/").rstrip("/")


def normalise_tar(raw: bytes, mtime: int) -> bytes:
    """A rootfs tarball (mmdebstrap's) rewritten with sorted entries and clamped times, so the
    layer's digest depends only on the files. Device nodes are dropped: a runtime makes its
    own /dev."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as src, tarfile.open(
        fileobj=out, mode="w", format=tarfile.PAX_FORMAT
    ) as dst:
        members = [m for m in src.getmembers() if not (m.ischr() or m.isblk() or m.isfifo())]
        for m in sorted(members, key=lambda m: _rel(m.name)):
            name = _rel(m.name)
            if not name or name.startswith("dev/"):
                continue
            m.name = name
            if m.islnk():
                m.linkname = _rel(m.linkname)
            m.mtime = min(m.mtime, mtime)
            m.uname = m.gname = ""
            m.pax_headers = {}
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    return out.getvalue()


@dataclasses.dataclass
class Blob:
    digest: str
    size: int
    path: Path


class BlobStore:
    """Content-addressed blobs on disk, plus the gzip cache keyed by uncompressed digest."""

    def __init__(self, cache: Path) -> None:
        self.dir = cache / "blobs" / "sha256"
        self.gz_index = cache / "gz-index"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.gz_index.mkdir(parents=True, exist_ok=True)

    def put(self, data: bytes) -> Blob:
        digest = hashlib.sha256(data).hexdigest()
        path = self.dir / digest
        if not path.exists():
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(path)
        return Blob(f"sha256:{digest}", len(data), path)

    def layer(self, tar: bytes) -> tuple[Blob, str]:
        """The gzip blob of an uncompressed layer and the layer's diff id."""
        diff_id = hashlib.sha256(tar).hexdigest()
        known = self.gz_index / f"{diff_id}-gz{GZIP_LEVEL}"
        if known.exists():
            digest = known.read_text().strip()
            path = self.dir / digest
            if path.exists():
                return Blob(f"sha256:{digest}", path.stat().st_size, path), f"sha256:{diff_id}"
        buf = io.BytesIO()
        # mtime=0 and no file name: the compressed bytes depend on the content only.
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=GZIP_LEVEL) as gz:
            gz.write(tar)
        blob = self.put(buf.getvalue())
        known.write_text(blob.digest.split(":", 1)[1])
        return blob, f"sha256:{diff_id}"


# --- host facts ------------------------------------------------------------------------------


def run(*cmd: str, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def debian_arch() -> str:
    return run("dpkg", "--print-architecture").strip()


def oci_arch(deb: str) -> str:
    return {"amd64": "amd64", "arm64": "arm64", "armhf": "arm", "ppc64el": "ppc64le", "s390x": "s390x"}.get(deb, deb)


def shared_libraries(binary: Path) -> list[str]:
    """Absolute paths of the libraries (and the loader) `binary` needs, as ldd finds them."""
    out = run("ldd", str(binary))
    paths = []
    for line in out.splitlines():
        line = line.strip()
        if "not found" in line:
            raise BuildError(f"{binary}: {line}")
        m = re.search(r"=>\s+(/\S+)", line) or re.match(r"(/\S+)\s+\(", line)
        if m:
            paths.append(m.group(1))
    return paths


def add_host_path(layer: Layer, path: str) -> None:
    """Adds `path` as the host has it: every symlink on the way (so /lib64/ld-linux… resolves
    in the image as on Debian's merged /usr), then the file's bytes."""
    seen = 0
    while True:
        seen += 1
        if seen > 40:
            raise BuildError(f"symlink loop at {path}")
        parts = Path(path).parts  # ('/', 'lib', 'x86_64-linux-gnu', 'libc.so.6')
        cur = Path("/")
        for i, part in enumerate(parts[1:], start=1):
            cur = cur / part
            if cur.is_symlink():
                target = os.readlink(cur)
                layer.symlink(str(cur), target)
                rest = Path(*parts[i + 1 :]) if i + 1 < len(parts) else None
                resolved = (cur.parent / target) if not target.startswith("/") else Path(target)
                path = str(Path(os.path.normpath(resolved / rest if rest else resolved)))
                break
        else:
            layer.file(path, Path(path).read_bytes(), mode=Path(path).stat().st_mode & 0o755)
            return


def debian_package_of(path: str) -> tuple[str, str] | None:
    """(package, version) that installed `path` on this machine, or None."""
    real = os.path.realpath(path)
    for candidate in (path, real, real.replace("/usr/lib/", "/lib/", 1)):
        try:
            pkg = run("dpkg-query", "-S", candidate).split(":", 1)[0].strip()
        except subprocess.CalledProcessError:
            continue
        version = run("dpkg-query", "-W", "-f=${Version}", pkg).strip()
        return pkg.split(":")[0], version
    return None


# --- images -------------------------------------------------------------------------------


@dataclasses.dataclass
class Image:
    name: str
    description: str
    entrypoint: list[str]
    layers: list[tuple[bytes, str]]  # (uncompressed tar, what it holds)
    env: list[str]
    labels: dict[str, str]
    user: str = TABLE.common.user
    workdir: str = "/"
    ports: list[str] = dataclasses.field(default_factory=list)
    tags: tuple[str, ...] = ()  # default: dev and the workspace version


def git(*args: str) -> str:
    try:
        return run("git", "-C", str(ROOT), *args).strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return ""


def source_facts() -> tuple[str, str, int]:
    """(version, revision, epoch). The revision says -dirty when the tree has changes, so an
    image never claims a commit it was not built from; the epoch is the commit's time (or
    SOURCE_DATE_EPOCH), for reproducible timestamps."""
    version = table.workspace_version()
    rev = git("rev-parse", "HEAD") or "unknown"
    if rev != "unknown" and git("status", "--porcelain", "--untracked-files=no"):
        rev += "-dirty"
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or git("log", "-1", "--format=%ct") or "0"
    return version, rev, int(epoch)


def base_labels(name: str, description: str, version: str, revision: str, created: str) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": name,
        "org.opencontainers.image.description": description,
        "org.opencontainers.image.source": TABLE.common.source,
        "org.opencontainers.image.url": TABLE.common.source,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": TABLE.common.licenses,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.vendor": TABLE.common.vendor,
    }


def rust_base_layer(binaries: list[Path], mtime: int) -> tuple[bytes, dict[str, str]]:
    """The base of the Rust images, in the manner of distroless/cc: the C libraries the
    binaries link (from this machine's Debian packages, with their copyright files), CA
    certificates, a passwd/group naming the nonroot user, /tmp. No shell, no package manager."""
    layer = Layer()
    libs = sorted({p for b in binaries for p in shared_libraries(b)})
    packages: dict[str, str] = {}
    for lib in libs:
        add_host_path(layer, lib)
        owner = debian_package_of(lib)
        if owner:
            packages[owner[0]] = owner[1]
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if not ca.exists():
        raise BuildError("/etc/ssl/certs/ca-certificates.crt is missing (apt-get install ca-certificates)")
    layer.file("etc/ssl/certs/ca-certificates.crt", ca.read_bytes())
    packages["ca-certificates"] = run("dpkg-query", "-W", "-f=${Version}", "ca-certificates").strip()
    for pkg in sorted(packages):
        copyright_file = Path(f"/usr/share/doc/{pkg}/copyright")
        if copyright_file.exists():
            layer.file(f"usr/share/doc/{pkg}/copyright", copyright_file.read_bytes())
    identity_files(layer)
    return layer.tar_bytes(mtime), packages


def identity_files(layer: Layer) -> None:
    """passwd and group naming root and nonroot (65532), /tmp, the users' homes."""
    layer.file(
        "etc/passwd",
        f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n".encode(),
    )
    layer.file("etc/group", f"root:x:0:\nnonroot:x:{NONROOT}:\n".encode())
    layer.file("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n")
    layer.dir("home/nonroot", 0o700, NONROOT, NONROOT)
    layer.dir("root", 0o700)
    layer.dir("tmp", 0o1777)


def binary_layer(path_in_image: str, binary: Path, mtime: int, extra: dict[str, bytes] | None = None) -> bytes:
    layer = Layer()
    layer.file(path_in_image, binary.read_bytes(), mode=0o755)
    for p, data in (extra or {}).items():
        layer.file(p, data)
    return layer.tar_bytes(mtime)


def python_base(cache: Path, mtime: int, packages: list[str]) -> bytes:
    """A Debian root filesystem with `packages` (python3 and what the image's handlers import)
    from Debian's packages (mmdebstrap), cached by its recipe, so each package list is its own
    base; ASYA_IMAGES_REFRESH_BASE=1 makes it anew (security updates)."""
    recipe = json.dumps({"suite": DEBIAN_SUITE, "sources": DEBIAN_SOURCES, "packages": packages,
                         "arch": debian_arch(), "v": 2}, sort_keys=True)
    key = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    out = cache / f"python-base-{key}.tar"
    if out.exists() and os.environ.get("ASYA_IMAGES_REFRESH_BASE") != "1":
        return out.read_bytes()
    if not shutil.which("mmdebstrap"):
        raise BuildError("mmdebstrap is not installed (scripts/deps.sh installs it)")
    log(f"making the Python base ({', '.join(packages)}) with mmdebstrap (Debian packages; about a minute, once)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "rootfs.tar"
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(mtime))
        cmd = [
            "mmdebstrap", "--quiet", "--mode=root", "--variant=essential", "--format=tar",
            f"--include={','.join(packages)}",
            # No documentation, manuals or locales: nothing the interpreter reads.
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--dpkgopt=path-exclude=/usr/share/info/*",
            "--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/* \"$1\"/var/log/*",
            DEBIAN_SUITE, str(raw), *DEBIAN_SOURCES,
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"mmdebstrap failed:\n{proc.stderr[-3000:]}")
        data = normalise_tar(raw.read_bytes(), mtime)
    tmp_out = out.with_suffix(f".tmp{os.getpid()}")
    tmp_out.write_bytes(data)
    tmp_out.replace(out)
    log(f"Python base made in {time.monotonic() - t0:.0f}s ({len(data) / 1e6:.1f} MB)")
    return data


# KEDA's operator and metrics API server for the test node, from binaries built of KEDA's Go
# module (tests/cluster/keda): static, so the image is the binary and the identity files.
KEDA_IMAGES = {
    "keda": ("keda", "KEDA operator (test node)"),
    "keda-metrics-apiserver": ("keda-adapter", "KEDA metrics API server (test node)"),
}


def static_image(name: str, binary: Path, desc: str, version: str, revision: str, created: str, epoch: int) -> Image:
    if not binary.is_file():
        raise BuildError(f"{binary} is missing")
    layer = Layer()
    identity_files(layer)
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if ca.exists():
        layer.file("etc/ssl/certs/ca-certificates.crt", ca.read_bytes())
    layer.file(binary.name, binary.read_bytes(), mode=0o755)
    labels = base_labels(name, desc, version, revision, created)
    return Image(name=name, description=desc, entrypoint=[f"/{binary.name}"],
                 layers=[(layer.tar_bytes(epoch), name)], env=["PATH=/"], labels=labels, tags=("dev", version))


# What --only accepts; asya-pause is built only when named.
KNOWN_IMAGES = [*TABLE.names(), "asya-pause"]


def define_images(bin_dir: Path, cache: Path, only: set[str], keda_dir: Path | None = None) -> list[Image]:
    version, revision, epoch = source_facts()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    arch = debian_arch()
    runtime_py = (ROOT / "sidecar/runtime/asya_runtime.py").read_bytes()
    images: list[Image] = []
    wanted_rust = [n for n in TABLE.rust if not only or n in only]
    if wanted_rust:
        binaries = {n: bin_dir / n for n in TABLE.rust}
        for n, b in binaries.items():
            if not b.is_file():
                raise BuildError(f"{b} is missing: build it first (make images, or cargo build --release -p {n})")
        # One base for all of them (built from all their libraries), so a node stores it once.
        base, packages = rust_base_layer(list(binaries.values()), epoch)
        for n in wanted_rust:
            rust = TABLE.rust[n]
            desc, ports = rust.description, rust.ports
            extra = {dst: (ROOT / src).read_bytes() for dst, src in rust.files.items()}
            labels = base_labels(n, desc, version, revision, created)
            labels["sh.asya.base.debian-packages"] = ",".join(f"{p}={v}" for p, v in sorted(packages.items()))
            images.append(Image(
                name=n, description=desc, entrypoint=rust.entrypoint,
                layers=[(base, f"base: {', '.join(sorted(packages))}"),
                        (binary_layer(f"usr/local/bin/{n}", binaries[n], epoch, extra), n)],
                # PATH is the base's (distroless sets it); the rest is the table's.
                env=["PATH=/usr/local/bin:/usr/bin:/bin", *(f"{k}={v}" for k, v in TABLE.rust_env.items())],
                labels=labels, ports=ports,
            ))
    for name, py in TABLE.python.items():
        if only and name not in only:
            continue
        handlers = sorted((ROOT / py.handlers).glob("*.py"))
        if not handlers:
            raise BuildError(f"{py.handlers} has no handlers (*.py)")
        base = python_base(cache, epoch, py.debian_packages)
        app = Layer()
        app.file(TABLE.python_runtime, runtime_py, mode=0o755)
        for f in handlers:
            app.file(f"{py.under}/{f.name}", f.read_bytes())
        labels = base_labels(name, py.description, version, revision, created)
        labels["sh.asya.base.debian-suite"] = DEBIAN_SUITE
        images.append(Image(
            name=name, description=py.description,
            entrypoint=TABLE.python_entrypoint,
            layers=[(base, f"base: Debian {DEBIAN_SUITE} with {', '.join(py.debian_packages)}"),
                    (app.tar_bytes(epoch), f"runtime and handlers ({py.handlers})")],
            # PATH is the base's (python:*-slim sets it); the rest is the table's.
            env=["PATH=/usr/local/bin:/usr/bin:/bin", *(f"{k}={v}" for k, v in TABLE.python_env.items())],
            labels=labels, workdir=TABLE.python_workdir,
        ))
    if "asya-pause" in only:
        images.append(pause_image(version, revision, created, epoch))
    if keda_dir is not None:
        keda_version = (keda_dir / "VERSION").read_text().strip()
        for name, (binary, desc) in KEDA_IMAGES.items():
            images.append(static_image(name, keda_dir / binary, desc, keda_version, revision, created, epoch))
    for img in images:
        img.labels["sh.asya.architecture"] = arch
    return images


def pause_image(version: str, revision: str, created: str, epoch: int) -> Image:
    """The test node's sandbox image (tests/cluster/pause/pause.c, static): built only when
    asked for by name, since real clusters use registry.k8s.io/pause."""
    src = ROOT / "tests/cluster/pause/pause.c"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pause"
        proc = subprocess.run(["gcc", "-Os", "-static", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(src)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"building {src} failed (gcc, static glibc):\n{proc.stderr}")
        subprocess.run(["strip", str(out)], check=True)
        layer = Layer()
        layer.file("pause", out.read_bytes(), mode=0o755)
    desc = "Pod sandbox process of the asya-rs test node"
    # 65535: the uid registry.k8s.io/pause runs as.
    return Image(name="asya-pause", description=desc, entrypoint=["/pause"],
                 layers=[(layer.tar_bytes(epoch), "pause")], env=[],
                 labels=base_labels("asya-pause", desc, version, revision, created), user="65535:65535")


def write_archive(img: Image, store: BlobStore, out_dir: Path, version: str, arch: str) -> tuple[str, bool, int]:
    """Writes NAME.oci.tar unless an identical one is there. (manifest digest, written?, compressed size)."""
    layers, diff_ids = [], []
    for tar, what in img.layers:
        blob, diff_id = store.layer(tar)
        layers.append({"mediaType": MT_LAYER, "digest": blob.digest, "size": blob.size,
                       "annotations": {"sh.asya.layer": what}})
        diff_ids.append(diff_id)
    config = {
        "created": img.labels["org.opencontainers.image.created"],
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": img.user,
            "Env": img.env,
            "Entrypoint": img.entrypoint,
            "WorkingDir": img.workdir,
            "Labels": img.labels,
            **({"ExposedPorts": {f"{p}/tcp": {} for p in img.ports}} if img.ports else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": img.labels["org.opencontainers.image.created"], "created_by": f"deploy/images/ocibuild.py: {w}"}
                    for _, w in img.layers],
    }
    config_blob = store.put(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config_blob.digest, "size": config_blob.size},
        "layers": layers,
        "annotations": {k: v for k, v in img.labels.items() if k.startswith("org.opencontainers.")},
    }
    manifest_blob = store.put(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    refs = []
    for tag in img.tags or ("dev", version):
        refs.append({
            "mediaType": MT_MANIFEST, "digest": manifest_blob.digest, "size": manifest_blob.size,
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {
                # containerd's import names the image from this one …
                "io.containerd.image.name": f"{NAME_PREFIX}/{img.name}:{tag}",
                # … the OCI layout's own tag (skopeo, podman, crane read this one).
                "org.opencontainers.image.ref.name": tag,
            },
        })
    index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": refs}
    index_bytes = json.dumps(index, sort_keys=True, indent=2).encode() + b"\n"
    size = sum(layer["size"] for layer in layers)

    target = out_dir / f"{img.name}.oci.tar"
    if target.exists():
        try:
            with tarfile.open(target) as old:
                f = old.extractfile("index.json")
                if f is not None and f.read() == index_bytes:
                    return manifest_blob.digest, False, size
        except (tarfile.TarError, KeyError, OSError):
            pass  # unreadable: write it anew
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes | None = None, path: Path | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = 0o644, 0
            if path is not None:
                info.size = path.stat().st_size
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                assert data is not None
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index_bytes)
        done = set()
        for b in [config_blob, manifest_blob] + [Blob(x["digest"], x["size"], store.dir / x["digest"].split(":")[1]) for x in layers]:
            if b.digest not in done:
                done.add(b.digest)
                add(f"blobs/sha256/{b.digest.split(':', 1)[1]}", path=b.path)
    tmp.replace(target)
    return manifest_blob.digest, True, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "target/images")
    ap.add_argument("--bin-dir", type=Path, required=False,
                    default=Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release")
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("ASYA_IMAGES_CACHE", Path.home() / ".cache/asya-rs/images")))
    ap.add_argument("--only", action="append", default=[], choices=KNOWN_IMAGES, metavar="NAME",
                    help=f"build only this image (repeatable): {', '.join(KNOWN_IMAGES)}")
    ap.add_argument("--keda-dir", type=Path, help="also the KEDA images, from DIR/keda, DIR/keda-adapter, DIR/VERSION")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    try:
        version, _, _ = source_facts()
        arch = oci_arch(debian_arch())
        store = BlobStore(args.cache)
        for img in define_images(args.bin_dir, args.cache, set(args.only), args.keda_dir):
            digest, written, size = write_archive(img, store, args.out, version, arch)
            state = "written" if written else "unchanged"
            log(f"{img.name}: {state} {args.out / (img.name + '.oci.tar')} ({size / 1e6:.1f} MB compressed, {digest[:19]}…)")
    except (BuildError, TableError) as e:
        print(f"deploy/images/ocibuild.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
