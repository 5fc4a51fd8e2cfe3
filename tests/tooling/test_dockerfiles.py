"""deploy/images/dockerfiles.py: the Dockerfiles are generated from deploy/images/images.toml,
the table `make images` builds from; `--check` (in `make lint`) names a Dockerfile edited by
hand or out of date with the table, and the generated Dockerfiles say what ocibuild.py's
images are (user, entry point, ports, labels, environment, the crew's pins)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy/images/dockerfiles.py"


def run(root: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), mode, "--root", str(root)], capture_output=True, text=True)


def load_table():
    sys.path.insert(0, str(ROOT / "deploy/images"))
    import table

    return table


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    dst.mkdir()
    shutil.copy(ROOT / "Cargo.toml", dst / "Cargo.toml")
    shutil.copytree(ROOT / "deploy/images", dst / "deploy/images", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_this_checkout_has_the_generated_dockerfiles():
    out = run(ROOT, "--check")
    assert out.returncode == 0, out.stderr


def test_a_hand_edit_is_named_with_its_line(copy: Path):
    path = copy / "deploy/images/asya-gateway/Dockerfile"
    path.write_text(path.read_text().replace("EXPOSE 8080/tcp", "EXPOSE 8081/tcp"))
    out = run(copy, "--check")
    assert out.returncode == 1
    assert "deploy/images/asya-gateway/Dockerfile: not the one deploy/images/images.toml gives" in out.stderr
    assert "-EXPOSE 8081/tcp" in out.stderr and "+EXPOSE 8080/tcp" in out.stderr
    assert "asya-webhook" not in out.stderr  # only the file that differs


def test_a_table_change_reaches_the_dockerfile_by_write(copy: Path):
    table = copy / "deploy/images/images.toml"
    table.write_text(table.read_text().replace('boto3 = "1.26.27"', 'boto3 = "1.26.99"'))
    out = run(copy, "--check")
    assert out.returncode == 1 and "deploy/images/asya-crew/Dockerfile" in out.stderr
    assert run(copy, "--write").returncode == 0
    assert "ARG BOTO3_VERSION=1.26.99" in (copy / "deploy/images/asya-crew/Dockerfile").read_text()
    assert run(copy, "--check").returncode == 0


def test_a_deleted_dockerfile_is_named(copy: Path):
    (copy / "deploy/images/asya-sidecar/Dockerfile").unlink()
    out = run(copy, "--check")
    assert out.returncode == 1 and "deploy/images/asya-sidecar/Dockerfile: missing" in out.stderr


def test_a_mistyped_field_is_named(copy: Path):
    table = copy / "deploy/images/images.toml"
    table.write_text(table.read_text().replace('ports = ["8443", "9090"]', 'ports = "8443"'))
    out = run(copy, "--check")
    assert out.returncode == 1
    assert "[rust.images.asya-webhook]: `ports` = '8443' is not a list" in out.stderr


def test_the_dockerfiles_say_what_the_table_says():
    t = load_table().load()
    for name, img in {**t.rust, **t.python}.items():
        text = (ROOT / "deploy/images" / name / "Dockerfile").read_text()
        final = text.split("\nFROM ")[-1]
        assert f"USER {t.common.user}\n" in final
        assert f'org.opencontainers.image.description="{img.description}"' in final
        if name in t.rust:
            assert f'ENTRYPOINT ["/usr/local/bin/{name}"]' in final
            assert set(re.findall(r"(\d+)/tcp", final)) == set(img.ports)
            for dst in img.files:
                assert f"/out/{dst}" in text
        else:
            assert f"COPY {img.handlers}/*.py {img.under}/" in final
            for pkg, version in img.pip.items():
                assert f'"{pkg}==${{{pkg.upper()}_VERSION}}"' in final and f"={version}\n" in text
