"""The architecture (docs/architecture.md), enforced: the layers' import contract, no import cycle, no function
over 100 lines, and which files enter a run's content address."""
import ast
import subprocess
import sys

import grimp

from pflrepro.pipeline.store import PACKAGE, RESULT_CODE, result_code

ROOT = PACKAGE.parent


def test_import_contract_holds():
    """`lint-imports` checks the layers declared in pyproject.toml: a module imports only from layers below its own."""
    out = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                          "lint_imports_command()"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 kept, 0 broken" in out.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index, low, stack, on, out, n = {}, {}, [], set(), [], 0
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = n
                n += 1
                stack.append(v)
                on.add(v)
            for j in range(i, len(adj[v])):
                w = adj[v][j]
                if w not in index:
                    work += [(v, j + 1), (w, 0)]
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
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
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
    return out


def test_no_import_cycle_even_through_function_level_imports():
    graph = grimp.build_graph("pflrepro", exclude_type_checking_imports=False)
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    """The check above can fail: a graph with a -> b -> a has one cycle."""
    class G:
        modules = {"a", "b", "c"}

        @staticmethod
        def find_modules_directly_imported_by(m):
            return {"a": {"b"}, "b": {"a", "c"}, "c": set()}[m]
    assert _cycles(G) == [["a", "b"]]


def test_no_function_over_100_lines():
    long = []
    for f in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 100:
                long.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def _rel(files) -> set[str]:
    return {f.relative_to(PACKAGE).as_posix() for f in files}


def test_which_files_change_a_runs_address():
    """The address covers the layers that decide results, whole (params.py, settings.py, data/, core/, federation/), and of
    algorithms/ only the files the run's algorithm executes; nothing that only runs configs or reads results."""
    assert RESULT_CODE == ("params.py", "settings.py", "data", "core", "federation")
    layers = {f for f in _rel(result_code("fedavg")) if not f.startswith("algorithms/")}
    expected = {"params.py", "settings.py"} | {p.relative_to(PACKAGE).as_posix() for d in ("data", "core", "federation")
                                            for p in (PACKAGE / d).rglob("*.py")}
    assert layers == expected
    assert _rel(result_code("fedavg")) - layers == {"algorithms/base.py"}
    assert _rel(result_code("scd")) - layers == {"algorithms/base.py", "algorithms/ditto.py", "algorithms/scd.py",
                                                  "algorithms/spectral.py"}
    everything = _rel(PACKAGE.rglob("*.py"))
    never = {f for f in everything if f.split("/")[0] in ("pipeline", "reporting", "papers")} | {"cli.py", "__main__.py"}
    assert not never & _rel(result_code(None))
    assert _rel(result_code(None)) >= {f for f in everything if f.startswith("algorithms/")}


def test_a_run_reaches_only_modules_in_its_address():
    """Every pflrepro module the run store reaches through imports (function-level ones too) is in the address,
    except the few that only drive a run: the store itself, its progress heartbeat, the package roots, the version
    string, where results live, the GPU share (pipeline.gpu: a memory cap and a refusal before round 1), the
    training lock (pipeline.locks), the address's own computation (pipeline.address) and what a run records about
    itself (pipeline.provenance). The tensor caches' check is in data.datasets, in the address."""
    graph = grimp.build_graph("pflrepro", exclude_type_checking_imports=False)
    reached = graph.find_upstream_modules("pflrepro.pipeline.store")
    drivers = {"pflrepro", "pflrepro.version", "pflrepro.paths", "pflrepro.pipeline", "pflrepro.pipeline.progress",
               "pflrepro.pipeline.gpu", "pflrepro.pipeline.locks", "pflrepro.pipeline.address",
               "pflrepro.pipeline.provenance"}
    in_address = {"pflrepro." + f[:-3].replace("/", ".").removesuffix(".__init__") for f in _rel(result_code(None))}
    assert reached - drivers - {"pflrepro.algorithms"} <= in_address, reached - drivers - in_address
    assert {"pflrepro.core.loop", "pflrepro.core.engines.batched", "pflrepro.federation.build"} <= reached


def test_every_third_party_import_is_declared():
    """Issue 33: a package the code imports is a declared dependency (pyproject.toml: dependencies or an extra), not
    one that happens to come with another (ruamel.yaml came with dvc, mistune with jupyterlab)."""
    import importlib.metadata as md
    import re

    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-")
                for d in project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]}
    dists = md.packages_distributions()
    imported = set()
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third = {m for m in imported if m not in sys.stdlib_module_names and m != "pflrepro"}
    missing = {m: dists.get(m) for m in third if not {d.lower().replace("_", "-") for d in dists.get(m, [m])} & declared}
    assert missing == {}
    assert {"torch", "ruamel", "mistune"} <= third


def test_settings_are_declared_once_and_core_reads_them_from_below():
    """RunSettings' fields are RUN_SCHEMA's keys with its defaults (generated, not written twice); RunConfig adds only
    validation; core annotates with RunSettings, a layer below it, so no import, type-checking ones included, goes up."""
    import dataclasses

    from pflrepro.federation.config import RunConfig
    from pflrepro.settings import RUN_SCHEMA, RunSettings
    fields = {f.name: f for f in dataclasses.fields(RunSettings)}
    assert list(fields) == list(RUN_SCHEMA)
    plain = RunSettings()
    assert all(getattr(plain, k) == p.default for k, p in RUN_SCHEMA.items())
    assert dataclasses.fields(RunConfig) == dataclasses.fields(RunSettings) and RunConfig.__slots__ == ()
    graph = grimp.build_graph("pflrepro", exclude_type_checking_imports=False)
    for m in graph.modules:
        if m.startswith("pflrepro.core."):
            assert not {i for i in graph.find_modules_directly_imported_by(m)
                        if i.startswith(("pflrepro.federation", "pflrepro.pipeline", "pflrepro.algorithms"))}, m


def test_nothing_outside_core_imports_an_engines_module():
    """The engines (core/engines/: batched, many, memory, grouped, forked, together) sit behind one entry: the package's
    other layers import `pflrepro.core.engines` (its __init__'s names), never one engine's module; and the readable
    core (loop, context, training, aggregation, schedule, clock, seeds) reaches them only through that entry too."""
    graph = grimp.build_graph("pflrepro", exclude_type_checking_imports=False)
    inside = {m for m in graph.modules if m.startswith("pflrepro.core.engines.")}
    assert {"pflrepro.core.engines.batched", "pflrepro.core.engines.many"} <= inside
    for m in sorted(graph.modules):
        if m.startswith("pflrepro.core.engines"):
            continue
        assert not graph.find_modules_directly_imported_by(m) & inside, m
    assert "pflrepro.core.engines" in graph.find_modules_directly_imported_by("pflrepro.core.loop")


def test_no_file_over_600_lines():
    """Files a reader can hold (issue 55): claims, partitioners, models and the batched engine were 785-1,447 lines;
    each is now a folder of modules by concern."""
    long = {f.relative_to(PACKAGE).as_posix(): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > 600}
    assert long == {}, long


def test_function_level_imports_say_why():
    """Issue 55: 80 internal imports inside functions carried no reason. Now each one outside the CLI (whose verbs
    import what they run, the reason written once at `VERBS`) says why on its line or the line above, or sits at the
    top of its module (FedGen's three moved with the FedALA hooks, which re-addressed every run anyway)."""
    import re
    silent = []
    for f in PACKAGE.rglob("*.py"):
        rel = f.relative_to(PACKAGE).as_posix()
        if rel == "cli.py":
            continue
        lines = f.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(node):
                    if isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or "").startswith("pflrepro")):
                        here, above = lines[n.lineno - 1], lines[n.lineno - 2]
                        if "#" not in here and not above.strip().startswith("#"):
                            silent.append(f"{rel}:{n.lineno}")
    assert silent == [], silent
    assert re.search(r"function-level imports of this module are deliberate", (PACKAGE / "cli.py").read_text())
