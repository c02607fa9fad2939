"""The layers of docs/architecture.md, checked: a module imports only from its
own layer and the layers below it, function-local imports included.

Every module of `queueapp` and `gpusched` must have a layer here, so a new
module is placed on purpose. The longest matching prefix wins:
`queueapp.live.events` (announcing a change) sits far below
`queueapp.live` (the WebSocket consumers).

No module imports itself through others either (`import_cycles`): within a
layer the order above says nothing, and a cycle there is two modules that
cannot be read, tested or moved apart. Every import counts, at the top,
inside a function or under `TYPE_CHECKING`: an annotation-only cycle still
ties the two modules' designs together (queueapp/simulation/slot_metrics.py
exists to break one). A package's `__init__` is a module like any other:
importing `queueapp.models.jobs` is not counted as importing
`queueapp.models`, so a package that re-exports its modules is no cycle.

The tests have one rule of their own: no module of the suite imports a
`test_*` module; what test modules share lives in a helpers module.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. Each line: the layer's name and the modules (prefixes) in it;
# "=name" is that module alone, not the modules under it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Process plumbing that knows nothing of the queue, and the packages' empty
    # `__init__`s, which importing any module under them runs.
    (
        "platform",
        (
            "gpusched.settings",
            "gpusched.embedded_db",
            "gpusched.server_limits",
            "gpusched.serve",
            "gpusched.manage",
            "gpusched.terminal",
            "gpusched.watchdog",
            "gpusched.upstreams",
            "gpusched.pg_archive",
            "gpusched.version",
            "gpusched.paths",
            "=gpusched",
            "=queueapp",
            "=queueapp.upstream",
        ),
    ),
    # Pure rules and the stand-ins that share them: no Django.
    (
        "policy",
        (
            "queueapp.policy",
            "queueapp.simulation",
            "queueapp.upstream.simulator",
            "queueapp.upstream.model_field",
            "queueapp.upstream.llama_swap_state",
            "queueapp.http_headers",
        ),
    ),
    # Tables, locks, errors, and the notices sent when they change.
    (
        "data",
        (
            "queueapp.models",
            "queueapp.locks",
            "queueapp.prepared",
            "queueapp.errors",
            "queueapp.job_body",
            "queueapp.liveness",
            "queueapp.live.events",
            "queueapp.job_notices",
            "queueapp.dispatch.wakeup",
            "queueapp.upstream.client",
        ),
    ),
    # Reading and rendering: no state changes.
    (
        "reads",
        (
            "queueapp.selectors",
            "queueapp.durations",
            "queueapp.eta",
            "queueapp.queue_forecast",
            "queueapp.line_feed",
            "queueapp.why",
            "queueapp.rendering",
            "queueapp.chain_summaries",
            "queueapp.dashboard",
            "queueapp.integrity",
            "queueapp.metrics",
        ),
    ),
    # Every state change, each in one transaction with its audit row.
    (
        "writes",
        (
            "queueapp.services",
            "queueapp.transitions",
            "queueapp.lanes",
            "queueapp.webhooks",
            "queueapp.retention",
            "queueapp.logins",
        ),
    ),
    # The GPU's side: claim, lease, finish, the dispatch loop. It calls
    # services; services never call it (they take its lock from `locks`).
    ("dispatch", ("queueapp.dispatch",)),
    # What a request, a task or a command enters by: thin callers of the above.
    (
        "entry",
        (
            "queueapp.api",
            "queueapp.pages",
            "queueapp.live",
            "queueapp.frontdoor",
            "queueapp.admin",
            "queueapp.admin_audit",
            "queueapp.admin_models",
            "queueapp.tasks",
            "queueapp.management",
            "queueapp.error_pages",
            "queueapp.middleware",
            "queueapp.apps",
        ),
    ),
    # The project's wiring, and the harness that starts its processes.
    ("wiring", ("gpusched.asgi", "gpusched.wsgi", "gpusched.urls", "gpusched.stack")),
)

WITHOUT_DJANGO = ("django", "rest_framework", "channels", "drf_spectacular", "django_q")
# Layers whose modules must not import the frameworks above (they run in the
# policy simulator, the llama-swap stand-in and plain pytest).
FRAMEWORK_FREE_LAYERS = ("policy",)


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix.startswith("="):
                matches = module == prefix[1:]
            else:
                matches = module == prefix or module.startswith(prefix + ".")
            if matches:
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    if best is None:
        raise LookupError(f"{module} has no layer in tests/test_layers.py")
    return best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str) -> set[str]:
    """Every module `source` imports, at the top or inside a function."""
    package = module.rsplit(".", 1)[0] if "." in module else module
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from queueapp import services` imports the module queueapp.services.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def own_modules() -> dict[str, set[str]]:
    paths = [*ROOT.glob("queueapp/**/*.py"), *ROOT.glob("gpusched/**/*.py")]
    return {
        module_name(path): imports_of(path.read_text(), module_name(path))
        for path in paths
        if "migrations" not in path.parts
    }


def suite_modules() -> dict[str, set[str]]:
    return {
        module_name(path): imports_of(path.read_text(), module_name(path))
        for path in (ROOT / "tests").rglob("*.py")
    }


def imports_of_test_modules(modules: dict[str, set[str]]) -> list[str]:
    """Each import of a `test_*` module by another module of the suite."""
    test_modules = {module for module in modules if module.rsplit(".", 1)[-1].startswith("test_")}
    return [
        f"{module} imports {name}"
        for module, imported in sorted(modules.items())
        for name in sorted(imported & test_modules)
        if name != module
    ]


def is_project(name: str) -> bool:
    return name.split(".")[0] in ("queueapp", "gpusched")


def depends_on(name: str, modules: dict[str, set[str]]) -> bool:
    """Whether importing `name` brings in code of its layer. A package whose
    `__init__` imports nothing of the project (`queueapp.dispatch`, a
    docstring) does not: `from queueapp.dispatch import wakeup` depends on
    `wakeup` alone."""
    if name not in modules:
        return False  # a name inside a module, or another library
    is_package = (ROOT / name.replace(".", "/") / "__init__.py").exists()
    return not is_package or any(is_project(other) for other in modules[name])


def upward_imports(modules: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, imported in sorted(modules.items()):
        own = layer_of(module)
        for name in sorted(imported):
            if not depends_on(name, modules):
                continue
            if layer_of(name) > own:
                problems.append(
                    f"{module} ({LAYERS[own][0]}) imports {name} ({LAYERS[layer_of(name)][0]})"
                )
    return problems


def import_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each module's imports of the other modules of `modules` (a name inside
    a module, another library and the module itself left out)."""
    return {
        module: {name for name in imported if name in modules and name != module}
        for module, imported in modules.items()
    }


def cycle_through(module: str, graph: dict[str, set[str]]) -> list[str] | None:
    """The shortest chain of imports that leads from `module` back to it, as
    `[module, ..., module]`; None when there is none."""
    came_from: dict[str, str] = {}
    frontier = deque([module])
    while frontier:
        current = frontier.popleft()
        for name in sorted(graph[current]):
            if name == module:
                chain = [current]
                while chain[-1] != module:
                    chain.append(came_from[chain[-1]])
                return [*reversed(chain), module]
            if name not in came_from:
                came_from[name] = current
                frontier.append(name)
    return None


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle, once, as `a -> b -> a` from its first module by name."""
    cycles = set()
    for module in graph:
        if (chain := cycle_through(module, graph)) is not None:
            ring = chain[:-1]
            start = ring.index(min(ring))
            ring = ring[start:] + ring[:start]
            cycles.add(" -> ".join([*ring, ring[0]]))
    return sorted(cycles)


@pytest.fixture(scope="module")
def modules() -> dict[str, set[str]]:
    return own_modules()


def test_every_module_has_a_layer(modules):
    missing = []
    for module in modules:
        try:
            layer_of(module)
        except LookupError as exc:
            missing.append(str(exc))
    assert not missing


def test_no_module_imports_from_a_higher_layer(modules):
    assert upward_imports(modules) == []


def test_the_policy_layer_imports_no_framework(modules):
    framework_free = [
        index for index, (name, _) in enumerate(LAYERS) if name in FRAMEWORK_FREE_LAYERS
    ]
    offenders = [
        f"{module} imports {name}"
        for module, imported in sorted(modules.items())
        if layer_of(module) in framework_free
        for name in sorted(imported)
        if name.split(".")[0] in WITHOUT_DJANGO or name.startswith("gpusched")
    ]
    assert offenders == []


def test_rendering_imports_no_rest_framework(modules):
    assert not {name for name in modules["queueapp.rendering"] if name.startswith("rest_framework")}


def test_nothing_but_the_api_and_the_url_map_imports_the_api(modules):
    importers = sorted(
        module
        for module, imported in modules.items()
        if not module.startswith("queueapp.api")
        and module != "gpusched.urls"
        and any(name == "queueapp.api" or name.startswith("queueapp.api.") for name in imported)
    )
    assert importers == []


def test_the_check_sees_an_import_inside_a_function():
    source = "def f():\n    from queueapp.api import views\n"
    modules = {
        "queueapp.selectors": imports_of(source, "queueapp.selectors"),
        "queueapp.api.views": set(),
    }
    assert upward_imports(modules) == [
        "queueapp.selectors (reads) imports queueapp.api.views (entry)"
    ]


def test_no_module_imports_itself_through_others(modules):
    cycles = import_cycles(import_graph(modules))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_names_cycles_through_function_local_and_type_checking_imports():
    modules = {
        "queueapp.simulation.parallel": imports_of(
            "from queueapp.simulation import report", "queueapp.simulation.parallel"
        ),
        "queueapp.simulation.report": imports_of(
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from queueapp.simulation.parallel import ParallelComparison\n",
            "queueapp.simulation.report",
        ),
        "queueapp.eta": imports_of(
            "def f():\n    from queueapp.why import parts\n", "queueapp.eta"
        ),
        "queueapp.why": imports_of("from queueapp.selectors import now", "queueapp.why"),
        "queueapp.selectors": imports_of("import queueapp.eta", "queueapp.selectors"),
        "queueapp.simulation": set(),
    }
    assert import_cycles(import_graph(modules)) == [
        "queueapp.eta -> queueapp.why -> queueapp.selectors -> queueapp.eta",
        "queueapp.simulation.parallel -> queueapp.simulation.report"
        " -> queueapp.simulation.parallel",
    ]


def test_a_package_that_imports_its_own_modules_is_no_cycle():
    modules = {
        "queueapp.models": imports_of("from queueapp.models.jobs import Job", "queueapp.models"),
        "queueapp.models.jobs": imports_of(
            "from queueapp.models.gpus import Gpu", "queueapp.models.jobs"
        ),
        "queueapp.models.gpus": set(),
    }
    assert import_cycles(import_graph(modules)) == []


def test_the_check_resolves_relative_imports():
    assert "queueapp.policy.score" in imports_of(
        "from .score import rank", "queueapp.policy.explain"
    )


def test_no_test_module_imports_another():
    # What test modules share lives in a helpers module (tests/e2e/helpers.py,
    # tests/<area>/helpers.py, tests/factories.py): a test module then runs on
    # its own, and shared code is not hidden among another module's tests.
    assert imports_of_test_modules(suite_modules()) == []


def test_the_test_module_check_sees_relative_and_function_local_imports():
    modules = {
        "tests.area.test_one": set(),
        "tests.area.test_two": imports_of("from .test_one import shared", "tests.area.test_two"),
        "tests.area.test_three": imports_of(
            "def f():\n    from tests.area import test_one\n", "tests.area.test_three"
        ),
        "tests.area.helpers": set(),
        "tests.area.test_four": imports_of(
            "from tests.area.helpers import x", "tests.area.test_four"
        ),
    }
    assert imports_of_test_modules(modules) == [
        "tests.area.test_three imports tests.area.test_one",
        "tests.area.test_two imports tests.area.test_one",
    ]


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize(
    "module",
    ["queueapp.policy", "queueapp.simulation.engine", "queueapp.upstream.simulator.cli"],
)
def test_the_pure_layers_load_without_django(module):
    # They run where no Django settings exist: the llama-swap simulator as a
    # process of its own, the policy simulator and the benchmarks' policy calls.
    # This sees imports made by imports, which the checks above do not follow.
    code = (
        f"import sys, {module}; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'django'); "
        "assert not loaded, loaded"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# A statement that changes rows, in any SQL string of a module.
WRITING_SQL = re.compile(
    r"\b(INSERT\s+INTO|UPDATE\s+\w+\s+(?:AS\s+\w+\s+)?SET|DELETE\s+FROM)\b", re.IGNORECASE
)
# The ORM's writes, called on a manager's chain (`Model.objects....update(...)`).
ORM_WRITES = {"update", "create", "get_or_create", "update_or_create", "delete", "bulk_create"}


def _on_a_manager(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute | ast.Call):
        if isinstance(node, ast.Attribute) and node.attr == "objects":
            return True
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return False


def writes_in(source: str) -> list[str]:
    """The SQL writes, ORM writes and `.save(...)` calls of a module's source."""
    found = [match.group(1).split()[0].upper() for match in WRITING_SQL.finditer(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method == "save" or (method in ORM_WRITES and _on_a_manager(node.func.value)):
                found.append(method)
    return found


def test_the_reads_layer_changes_no_row():
    # "Reading and rendering: no state changes": a write there would escape
    # the services' one-transaction-with-its-audit-row rule.
    reads = dict(LAYERS)["reads"]
    offenders = {}
    for path in [*ROOT.glob("queueapp/**/*.py")]:
        module = module_name(path)
        if "migrations" in path.parts or LAYERS[layer_of(module)][0] != "reads":
            continue
        assert any(module == p or module.startswith(p + ".") for p in reads)
        if found := writes_in(path.read_text()):
            offenders[module] = found
    assert offenders == {}


def test_the_write_check_sees_sql_and_orm_writes():
    assert writes_in('cursor.execute("INSERT INTO queueapp_runstats (model) VALUES (%s)")')
    assert writes_in('sql = """UPDATE queueapp_job AS job\n   SET status = 1"""')
    assert writes_in("RunStats.objects.filter(model=m).update(warm_seconds=1)")
    assert writes_in("Policy.objects.get_or_create(pk=1)")
    assert writes_in("job.save()")
    assert not writes_in('sql = "SELECT 1 FROM queueapp_job WHERE updated_at > now()"')
    assert not writes_in("seen = set()\nseen.update([1])\nentry = {}\nentry.update(a=1)")
