#!/usr/bin/env python3
"""The Dockerfiles of deploy/images/NAME/, generated from deploy/images/images.toml (the
table `make images` builds from too), for users whose machines reach a registry.

    dockerfiles.py --write    write them
    dockerfiles.py --check    exit 1, naming each file and its first differing line, when a
                              committed Dockerfile is not the generated one (`make lint`)

`--root DIR` reads and writes another checkout (the tests use a copy).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from table import ROOT, PythonImage, RustImage, Table, TableError, load, workspace_version

HEADER = "# Generated from deploy/images/images.toml by deploy/images/dockerfiles.py --write: edit those."


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()] if text else []


def _labels(t: Table, name: str, description: str) -> list[str]:
    pairs = [
        ("title", name),
        ("description", description),
        ("source", t.common.source),
        ("url", t.common.source),
        ("licenses", t.common.licenses),
        ("vendor", t.common.vendor),
        ("version", "${VERSION}"),
        ("revision", "${REVISION}"),
    ]
    lines = [f'org.opencontainers.image.{k}="{v}"' for k, v in pairs]
    return ["LABEL " + " \\\n      ".join(lines)]


def _env(env: dict[str, str]) -> str:
    return "ENV " + " ".join(f"{k}={v}" for k, v in env.items())


def rust_dockerfile(t: Table, img: RustImage, version: str) -> str:
    n = img.name
    out = [
        "# syntax=docker/dockerfile:1",
        HEADER,
        f"# {n}, built from the repository root:",
        f"#   docker build -f deploy/images/{n}/Dockerfile -t REGISTRY/{n}:VERSION .",
        "# `make images` builds the same image without a registry (deploy/images/ocibuild.py).",
        *_comment(img.note),
        f"ARG RUST_IMAGE={t.rust_image}",
        "# glibc, libgcc, CA certificates, passwd with nonroot (65532), no shell: all the binary needs.",
        f"ARG BASE_IMAGE={t.rust_base}",
        "",
        "FROM ${RUST_IMAGE} AS build",
        "WORKDIR /src",
        "COPY . .",
        "RUN --mount=type=cache,target=/usr/local/cargo/registry \\",
        "    --mount=type=cache,target=/src/target \\",
        f"    cargo build --release --locked -p {n} --bin {n} \\",
        f" && install -D -m 0755 target/release/{n} /out/usr/local/bin/{n}",
    ]
    if img.files:
        out += _comment(img.files_note)
        out += [f"RUN install -D -m 0644 {src} /out/{dst}" for dst, src in img.files.items()]
    out += [
        "",
        "FROM ${BASE_IMAGE}",
        f"ARG VERSION={version}",
        "ARG REVISION=unknown",
        *_labels(t, n, img.description),
        "COPY --from=build /out/ /",
        _env(t.rust_env),
        f"USER {t.common.user}",
    ]
    if img.ports:
        out.append("EXPOSE " + " ".join(f"{p}/tcp" for p in img.ports))
    out.append(f"ENTRYPOINT {json.dumps(img.entrypoint)}")
    return "\n".join(out) + "\n"


def python_dockerfile(t: Table, img: PythonImage, version: str) -> str:
    n = img.name
    out = [
        "# syntax=docker/dockerfile:1",
        HEADER,
        f"# {n}, built from the repository root:",
        f"#   docker build -f deploy/images/{n}/Dockerfile -t REGISTRY/{n}:VERSION .",
        "# `make images` builds the same image from Debian's packages (mmdebstrap,",
        f"# {t.python_suite}: {', '.join(img.debian_packages)}).",
        *_comment(img.note),
        f"ARG BASE_IMAGE={t.python_base}",
        "",
        "FROM ${BASE_IMAGE}",
        f"ARG VERSION={version}",
        "ARG REVISION=unknown",
    ]
    pins = {pkg: f"{pkg.upper().replace('-', '_')}_VERSION" for pkg in img.pip}
    out += [f"ARG {arg}={img.pip[pkg]}" for pkg, arg in pins.items()]
    out += _labels(t, n, img.description)
    if pins:
        reqs = " ".join(f'"{pkg}==${{{arg}}}"' for pkg, arg in pins.items())
        out += [
            "# The versions Debian ships, which `make images` installs from Debian's packages.",
            "RUN pip install --no-cache-dir --disable-pip-version-check --no-compile \\",
            f"        {reqs}",
        ]
    out += [
        f"COPY sidecar/runtime/asya_runtime.py {t.python_runtime}",
        "# The handlers outside /opt/asya: injection mounts the runtime's emptyDir over /opt/asya.",
        f"COPY {img.handlers}/*.py {img.under.rstrip('/')}/",
        f"WORKDIR {t.python_workdir}",
        _env(t.python_env),
        f"USER {t.common.user}",
        f"ENTRYPOINT {json.dumps(t.python_entrypoint)}",
    ]
    return "\n".join(out) + "\n"


def render(t: Table, version: str) -> dict[str, str]:
    """NAME -> the text of deploy/images/NAME/Dockerfile."""
    out = {n: rust_dockerfile(t, img, version) for n, img in t.rust.items()}
    out.update({n: python_dockerfile(t, img, version) for n, img in t.python.items()})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    ap.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args()
    try:
        texts = render(load(args.root / "deploy/images/images.toml"), workspace_version(args.root))
    except TableError as e:
        print(f"deploy/images/dockerfiles.py: {e}", file=sys.stderr)
        return 1
    bad = 0
    for name, text in texts.items():
        rel = f"deploy/images/{name}/Dockerfile"
        path = args.root / rel
        old = path.read_text() if path.exists() else None
        if old == text:
            continue
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"dockerfiles: wrote {rel}")
            continue
        bad += 1
        if old is None:
            print(f"{rel}: missing; `python3 deploy/images/dockerfiles.py --write` writes it", file=sys.stderr)
            continue
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), rel, "generated", n=0, lineterm=""))
        print(f"{rel}: not the one deploy/images/images.toml gives "
              "(`python3 deploy/images/dockerfiles.py --write`):", file=sys.stderr)
        print("\n".join(diff[:12]), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
