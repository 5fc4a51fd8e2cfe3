"""scripts/check-version: the workspace, the chart, the Dockerfiles, the examples' image tags
and CHANGELOG.md name one version; every disagreement is reported with file, found and
expected value."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-version"


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The files the check reads, copied from this checkout."""
    dst = tmp_path / "repo"
    for rel in ["Cargo.toml", "CHANGELOG.md", "deploy/chart/Chart.yaml"]:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, dst / rel)
    text = (ROOT / "Cargo.toml").read_text()
    for member in re.findall(r'"([^"]+)"', re.search(r"^members\s*=\s*\[([^\]]*)\]", text, re.M).group(1)):
        (dst / member).mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / member / "Cargo.toml", dst / member / "Cargo.toml")
    shutil.copytree(ROOT / "deploy/images", dst / "deploy/images", ignore=shutil.ignore_patterns("*.py"))
    shutil.copytree(ROOT / "deploy/examples", dst / "deploy/examples")
    return dst


def version_of(root: Path) -> str:
    out = check(root)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[1]


def test_this_checkout_agrees():
    out = check(ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("check-version: ") and "everywhere" in out.stdout


def test_a_copy_agrees_before_it_is_changed(copy: Path):
    assert version_of(copy) == version_of(ROOT)


def replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_chart_app_version_differing_is_named(copy: Path):
    v = version_of(copy)
    replace(copy / "deploy/chart/Chart.yaml", f'appVersion: "{v}"', 'appVersion: "9.9.9"')
    out = check(copy)
    assert out.returncode == 1
    assert f"deploy/chart/Chart.yaml: appVersion 9.9.9, expected {v}" in out.stderr
    assert "Chart.yaml: version " not in out.stderr  # only the field that differs


def test_bumping_only_the_workspace_names_every_other_place(copy: Path):
    v = version_of(copy)
    replace(copy / "Cargo.toml", f'version = "{v}"', 'version = "0.2.0"')
    err = check(copy).stderr
    assert f"deploy/chart/Chart.yaml: version {v}, expected 0.2.0" in err
    assert f"deploy/chart/Chart.yaml: appVersion {v}, expected 0.2.0" in err
    assert f"CHANGELOG.md: newest release is {v}, expected the workspace version 0.2.0" in err
    assert f"deploy/images/asya-sidecar/Dockerfile: ARG VERSION={v}, expected 0.2.0" in err
    assert f"image asya-crew:{v}, expected tag 0.2.0" in err


def test_changelog_needs_unreleased_first_and_dated_releases(copy: Path):
    v = version_of(copy)
    replace(copy / "CHANGELOG.md", "## [Unreleased]", "## Unreleased")
    assert "the first section must be `## [Unreleased]`" in check(copy).stderr
    replace(copy / "CHANGELOG.md", "## Unreleased", "## [Unreleased]")
    text = (copy / "CHANGELOG.md").read_text()
    (copy / "CHANGELOG.md").write_text(re.sub(rf"^## \[{re.escape(v)}\] - \S+", f"## [{v}]", text, flags=re.M))
    out = check(copy)
    assert out.returncode == 1 and f"release {v} has no date" in out.stderr


def test_a_member_with_its_own_version_is_named(copy: Path):
    replace(copy / "cli/Cargo.toml", "version.workspace = true", 'version = "0.1.1"')
    out = check(copy)
    assert out.returncode == 1
    assert "cli/Cargo.toml: version 0.1.1, expected `version.workspace = true`" in out.stderr
