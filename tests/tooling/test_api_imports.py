"""`api` has no import circle (issue 37): its modules, read from their `crate::` paths, form a
graph without cycles, and `basics` (the leaf rules) uses no other module of the crate. Test
code is left out (`#[cfg(test)]` and the modules' `tests.rs` files): a test may use anything."""

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "api" / "src"
CRATE_PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
USE_GROUP = re.compile(r"\buse crate::\{([^}]*)\}")


def module_of(path: Path, src: Path) -> str:
    """The top-level module a file belongs to: `privilege/x.rs` is `privilege`."""
    return path.relative_to(src).parts[0].removesuffix(".rs")


def is_test_file(path: Path, src: Path) -> bool:
    inner = path.relative_to(src).parts
    return path.name == "tests.rs" or path.stem.endswith("_tests") or "tests" in inner[:-1]


def production_text(path: Path) -> str:
    """The file without its test module(s): what follows a `#[cfg(test)]` is dropped."""
    text = path.read_text()
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def graph(src: Path = SRC) -> dict[str, set[str]]:
    modules = {module_of(p, src) for p in src.rglob("*.rs") if p.parent == src or p.parent.parent == src}
    modules.discard("lib")
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for path in src.rglob("*.rs"):
        if path.parts[len(src.parts)] == "bin" or is_test_file(path, src):
            continue
        me = module_of(path, src)
        if me not in edges:
            continue
        text = production_text(path)
        names = set(CRATE_PATH.findall(text))
        for group in USE_GROUP.findall(text):
            names.update(n.strip().split("::")[0] for n in group.split(",") if n.strip())
        edges[me].update(n for n in names if n in modules and n != me)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_api_modules_import_in_one_direction():
    edges = graph()
    assert {"config", "privilege", "resolved", "validate", "state_proxy", "basics"} <= edges.keys()
    assert edges["validate"] >= {"config", "naming", "resolved"}, "the reader of crate:: paths lost its way"
    assert cycles(edges) == [], cycles(edges)


def test_basics_is_a_leaf():
    assert graph()["basics"] == set()


def test_a_circle_is_found(tmp_path: Path):
    """The checker can fail: the circle issue 37 found (config -> privilege -> resolved -> config)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.rs").write_text("pub mod config; pub mod privilege; pub mod resolved;\n")
    (src / "config.rs").write_text("pub struct C { l: crate::privilege::Level }\n")
    (src / "privilege.rs").write_text("use crate::resolved::ResolvedActor;\npub enum Level {}\n")
    (src / "resolved.rs").write_text("use crate::{config::C};\n#[cfg(test)]\nmod tests { use crate::privilege; }\n")
    assert cycles(graph(src)) == [["config", "privilege", "resolved"]]
    (src / "resolved.rs").write_text("pub struct ResolvedActor;\n#[cfg(test)]\nmod tests { use crate::config::C; }\n")
    assert cycles(graph(src)) == []
