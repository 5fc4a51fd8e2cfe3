"""deploy/images/images.toml read into typed values: the one definition of the images that
ocibuild.py builds and dockerfiles.py writes Dockerfiles from. A missing or mistyped field is
an error naming the image, the field and what was expected."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TABLE = HERE / "images.toml"


class TableError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Common:
    source: str
    licenses: str
    vendor: str
    user: str


@dataclasses.dataclass(frozen=True)
class RustImage:
    name: str  # also the binary's name
    description: str
    ports: list[str]
    files: dict[str, str]  # path in the image -> repository file
    files_note: str
    note: str

    @property
    def entrypoint(self) -> list[str]:
        return [f"/usr/local/bin/{self.name}"]


@dataclasses.dataclass(frozen=True)
class PythonImage:
    name: str
    description: str
    debian_packages: list[str]
    pip: dict[str, str]  # what the Dockerfile installs with pip: package -> version
    handlers: str  # the directory whose *.py files are the handlers
    under: str  # where they go in the image
    note: str


@dataclasses.dataclass(frozen=True)
class Table:
    common: Common
    rust_image: str
    rust_base: str
    rust_env: dict[str, str]
    rust: dict[str, RustImage]
    python_suite: str
    python_base: str
    python_entrypoint: list[str]
    python_runtime: str
    python_workdir: str
    python_env: dict[str, str]
    python: dict[str, PythonImage]

    def names(self) -> list[str]:
        return [*self.rust, *self.python]


def _get(d: dict, key: str, kind: type, where: str, default=None):
    if key not in d:
        if default is not None:
            return default
        raise TableError(f"{TABLE.name}: {where}: `{key}` is missing")
    value = d[key]
    if not isinstance(value, kind):
        raise TableError(f"{TABLE.name}: {where}: `{key}` = {value!r} is not a {kind.__name__}")
    return value


def _strings(d: dict, key: str, where: str, default=None) -> list[str]:
    value = _get(d, key, list, where, default)
    if not all(isinstance(v, str) for v in value):
        raise TableError(f"{TABLE.name}: {where}: `{key}` = {value!r} must be a list of strings")
    return list(value)


def _mapping(d: dict, key: str, where: str, default=None) -> dict[str, str]:
    value = _get(d, key, dict, where, default)
    if not all(isinstance(v, str) for v in value.values()):
        raise TableError(f"{TABLE.name}: {where}: `{key}` = {value!r} must map strings to strings")
    return dict(value)


def load(path: Path = TABLE) -> Table:
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TableError(f"{path}: {e}") from e
    c = _get(raw, "common", dict, "top level")
    common = Common(*(_get(c, k, str, "[common]") for k in ("source", "licenses", "vendor", "user")))
    r = _get(raw, "rust", dict, "top level")
    rust = {}
    for name, d in _get(r, "images", dict, "[rust]").items():
        where = f"[rust.images.{name}]"
        rust[name] = RustImage(
            name=name,
            description=_get(d, "description", str, where),
            ports=_strings(d, "ports", where),
            files=_mapping(d, "files", where, {}),
            files_note=_get(d, "files_note", str, where, ""),
            note=_get(d, "note", str, where, "").strip(),
        )
    p = _get(raw, "python", dict, "top level")
    python = {}
    for name, d in _get(p, "images", dict, "[python]").items():
        where = f"[python.images.{name}]"
        python[name] = PythonImage(
            name=name,
            description=_get(d, "description", str, where),
            debian_packages=_strings(d, "debian_packages", where),
            pip=_mapping(d, "pip", where, {}),
            handlers=_get(d, "handlers", str, where),
            under=_get(d, "under", str, where),
            note=_get(d, "note", str, where, "").strip(),
        )
    return Table(
        common=common,
        rust_image=_get(r, "rust_image", str, "[rust]"),
        rust_base=_get(r, "base_image", str, "[rust]"),
        rust_env=_mapping(r, "env", "[rust]"),
        rust=rust,
        python_suite=_get(p, "suite", str, "[python]"),
        python_base=_get(p, "base_image", str, "[python]"),
        python_entrypoint=_strings(p, "entrypoint", "[python]"),
        python_runtime=_get(p, "runtime", str, "[python]"),
        python_workdir=_get(p, "workdir", str, "[python]"),
        python_env=_mapping(p, "env", "[python]"),
        python=python,
    )


def workspace_version(root: Path = ROOT) -> str:
    cargo = (root / "Cargo.toml").read_text()
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', cargo, re.M | re.S)
    if not m:
        raise TableError("Cargo.toml has no [workspace.package] version")
    return m.group(1)
