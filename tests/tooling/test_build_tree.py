"""scripts/build-tree: the build tree holds exactly the checkout's files, and only what changed
is rewritten (cargo rebuilds by file time, so an unchanged file must keep its time and a
changed one must not)."""

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-tree"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    (repo / "api" / "src").mkdir(parents=True)
    (repo / "api" / "src" / "lib.rs").write_text("pub fn a() {}\n")
    (repo / "api" / "tests").mkdir()
    (repo / "api" / "tests" / "old.rs").write_text("#[test] fn t() {}\n")
    (repo / "crds").mkdir()
    (repo / "crds" / "a.yaml").write_text("kind: A\n")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    os.symlink("../crds", repo / "api" / "crds")
    (repo / ".gitignore").write_text("target/\n")
    (repo / "target").mkdir()
    (repo / "target" / "big.bin").write_text("not source\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x")
    return repo


def run(checkout: Path, tree: Path, *cmd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ASYA_BUILD_TREE_DIR=str(tree))
    return subprocess.run([sys.executable, str(SCRIPT), "run", *cmd], cwd=checkout, env=env,
                          capture_output=True, text=True, check=False)


def listing(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.split("/")[0] in (".git", "target"):
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_text() + f" mode={oct(p.stat().st_mode & 0o777)}"
    return out


def test_the_tree_holds_the_checkout_and_the_command_runs_there(checkout: Path, tmp_path: Path):
    tree = tmp_path / "tree"
    r = run(checkout, tree, "sh", "-c", 'echo "$ASYA_BUILD_TREE"')
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tree)
    assert listing(tree) == listing(checkout)
    assert not (tree / "target").exists()  # ignored files stay out
    assert not (tree / ".git").exists()
    assert (tree / "api" / "crds").is_symlink()


def test_only_changed_files_get_a_new_time_and_removed_files_go(checkout: Path, tmp_path: Path):
    tree = tmp_path / "tree"
    assert run(checkout, tree, "true").returncode == 0
    old = 1_000_000_000  # 2001: older than any build output
    for p in tree.rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.utime(p, (old, old))
    (checkout / "api" / "src" / "lib.rs").write_text("pub fn b() {}\n")
    (checkout / "api" / "tests" / "old.rs").unlink()
    (checkout / "api" / "src" / "new.rs").write_text("// new, untracked\n")
    (checkout / "run.sh").chmod(0o644)
    # A file where the tree had a directory, and a directory where it had a file.
    for f in (checkout / "crds").iterdir():
        f.unlink()
    (checkout / "crds").rmdir()
    (checkout / "crds").write_text("now a file\n")
    r = run(checkout, tree, "true")
    assert r.returncode == 0, r.stderr
    assert "written" in r.stderr
    assert (tree / "api" / "src" / "lib.rs").read_text() == "pub fn b() {}\n"
    assert (tree / "api" / "src" / "lib.rs").stat().st_mtime > old
    assert (tree / "api" / "src" / "new.rs").exists()
    assert not (tree / "api" / "tests").exists(), "a test file deleted in the checkout must not build"
    assert (tree / "crds").read_text() == "now a file\n"
    assert (tree / "run.sh").stat().st_mode & 0o777 == 0o644
    assert (tree / ".gitignore").stat().st_mtime == old, "an unchanged file keeps its time"


def test_a_second_run_at_the_same_time_builds_in_its_checkout(checkout: Path, tmp_path: Path):
    tree = tmp_path / "tree"
    with open(tmp_path / "build-tree.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run(checkout, tree, "sh", "-c", 'echo "$ASYA_BUILD_TREE"')
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(checkout)
    assert "in use by another run" in r.stderr
    assert not tree.exists()


def test_the_command_status_is_returned(checkout: Path, tmp_path: Path):
    assert run(checkout, tmp_path / "tree", "sh", "-c", "exit 3").returncode == 3


def test_a_directory_without_git_builds_in_place(tmp_path: Path):
    plain = tmp_path / "export"
    plain.mkdir()
    (plain / "Cargo.toml").write_text("[workspace]\n")
    env = dict(os.environ, ASYA_BUILD_TREE_DIR=str(tmp_path / "tree"), GIT_CEILING_DIRECTORIES=str(tmp_path))
    r = subprocess.run([sys.executable, str(SCRIPT), "run", "sh", "-c", 'echo "$ASYA_BUILD_TREE"'], cwd=plain,
                       env=env, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(plain)
    assert "not a git checkout" in r.stderr
    assert not (tmp_path / "tree").exists()
