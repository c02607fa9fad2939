"""docs/architecture.md is a map, and a map that names what is gone misleads.

The doc fails here when it runs past MAX_LINES lines, names a file or folder
of the project that does not exist, or gives in backticks a Python name that
nothing in queueapp/ or gpusched/ defines (a `def`, a `class`, an assignment,
a module or a package). The full reasons live in the module docstrings the
map points to; the map only has to stay short and true. Words in backticks
that are not code go in NOT_CODE.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
MAX_LINES = 300

# The project's own source, where a name the doc gives must be defined.
SOURCE_ROOTS = ("queueapp", "gpusched")
# Folders whose paths the doc may name; a path under one of them must exist.
PATH_ROOTS = ("queueapp", "gpusched", "tests", "benchmarks", "docs", "fixtures")

# Backticked words of the doc that are not Python names of the project.
NOT_CODE = frozenset(
    {
        # PostgreSQL: its commands, the work channel, the jobs table's indexes.
        "LISTEN",
        "NOTIFY",
        "pg_notify",
        "gpusched_work",
        "job_one_running_per_gpu",
        "job_queued_model_rank",
        # What the trigger says about a job (queueapp/sql/job_notify.sql).
        "queued",
        "freed",
        "granted",
    }
)

# A project path: `queueapp/dispatch/claim.py`, `queueapp/sql/job_notify.sql`,
# `queueapp/why/`.
PROJECT_PATH = re.compile(rf"(?<![\w/.-])(?:{'|'.join(PATH_ROOTS)})/[\w./-]*[\w/]")
# A Python file named without its folder: `claim.py`, `dispatch/lease.py`.
PYTHON_FILE = re.compile(r"(?<![\w/.-])([\w/]*\w\.py)\b")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
BACKTICKED = re.compile(r"`([^`\n]+)`")
# `name`, `module.name`, `Class.method`, `name()`, `Name(keyword=value)`.
PYTHON_NAME = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?")
# `locks.py`, `job_notify.sql`: a file, which the path check reads.
FILE_NAME = re.compile(r"\.(?:py|sql|md|json|jsonl|toml)$")


def _python_files(roots: tuple[str, ...]) -> list[Path]:
    return [path for root in roots for path in sorted((ROOT / root).rglob("*.py"))]


@cache
def defined_names() -> frozenset[str]:
    """Every name queueapp/ and gpusched/ define: functions, classes,
    assigned names and attributes (model fields, dataclass fields, enum
    members, `self.x = ...`), and the modules and packages themselves."""
    names: set[str] = set()
    for path in _python_files(SOURCE_ROOTS):
        names.update(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for part in ast.walk(target):
                        if isinstance(part, ast.Name):
                            names.add(part.id)
                        elif isinstance(part, ast.Attribute):
                            names.add(part.attr)
    return frozenset(names)


@cache
def project_files() -> tuple[str, ...]:
    """The repository's Python files, as paths from its root."""
    found = [*_python_files(PATH_ROOTS), *ROOT.glob("*.py")]
    return tuple(str(path.relative_to(ROOT)) for path in found)


def missing_paths(text: str) -> list[str]:
    """The project paths and Python files `text` names that do not exist."""
    missing = [
        path for path in PROJECT_PATH.findall(text) if not (ROOT / path.rstrip("/")).exists()
    ]
    for name in PYTHON_FILE.findall(text):
        if name.split("/")[0] in PATH_ROOTS:
            continue  # a project path, checked above
        if not any(file == name or file.endswith("/" + name) for file in project_files()):
            missing.append(name)
    return sorted(set(missing))


def unknown_names(text: str) -> list[str]:
    """The Python names given in backticks outside code blocks that nothing
    in the project defines; for a dotted name, each part is checked."""
    unknown = []
    for span in BACKTICKED.findall(FENCE.sub("", text)):
        match = PYTHON_NAME.fullmatch(span.strip())
        if match is None or FILE_NAME.search(span.strip()):
            continue  # not a name: a file, a URL, a command, SQL, a header
        for part in match.group(1).split("."):
            if part not in defined_names() and part not in NOT_CODE:
                unknown.append(part)
    return sorted(set(unknown))


def layer_names() -> list[str]:
    """The layers' names, read from tests/test_layers.py's LAYERS (read, not
    imported: no test module imports another)."""
    tree = ast.parse((ROOT / "tests" / "test_layers.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "LAYERS":
            assert node.value is not None
            layers = ast.literal_eval(node.value)
            return [name for name, _ in layers]
    raise LookupError("tests/test_layers.py has no LAYERS")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_doc_is_a_map_of_at_most_300_lines():
    assert len(DOC.read_text().splitlines()) <= MAX_LINES


def test_every_path_the_doc_names_exists():
    assert missing_paths(DOC.read_text()) == []


def test_every_name_the_doc_gives_in_backticks_is_defined_in_the_source():
    assert unknown_names(DOC.read_text()) == []


def test_the_layers_section_names_every_layer_of_the_layer_test():
    layers = _section(DOC.read_text(), "Layers")
    assert [name for name in layer_names() if not re.search(rf"\b{name}\b", layers)] == []


def test_the_checks_see_a_name_that_is_gone():
    doc = DOC.read_text()
    assert unknown_names(doc + "\nThe claim skips (`_placed_here`).\n") == ["_placed_here"]
    assert unknown_names("`claim._placed_here`, `gateways.RECONNECT_GRACE_SECONDS`") == [
        "_placed_here",
        "gateways",
    ]
    assert unknown_names("`job_finish` and `claim_after_an_end()`") == [
        "claim_after_an_end",
        "job_finish",
    ]


def test_the_checks_see_a_path_that_is_gone():
    doc = DOC.read_text()
    assert missing_paths(doc + "\nLiveness: queueapp/gateways.py.\n") == ["queueapp/gateways.py"]
    assert missing_paths("`queueapp/chains.py`, queueapp/sql/gone.sql, `gpus/x.py`") == [
        "gpus/x.py",
        "queueapp/chains.py",
        "queueapp/sql/gone.sql",
    ]
    assert missing_paths("data: models.py  gateways.py") == ["gateways.py"]
    assert missing_paths("liveness (`gateways.py`, `gpus.py`)") == ["gateways.py"]


def test_the_checks_accept_what_exists():
    text = (
        "`job_end_durable`, `decide`, `Dispatcher.tick`, `queueapp.policy.decide`, "
        "`GpuBusy(draining=True)`, `prepared_cursor()`, `ClaimedJob.claim_token`; "
        "queueapp/dispatch/lease.py, queueapp/sql/job_notify.sql, queueapp/why/, "
        "tests/test_layers.py, dispatch/claim.py, manage.py; `GET /running`, "
        "`SELECT ... FOR UPDATE`"
    )
    assert unknown_names(text) == []
    assert missing_paths(text) == []


def test_code_blocks_are_checked_for_paths_but_not_names():
    block = "```\n data   models.py  gateways.py  `whatever`\n```\n"
    assert missing_paths(block) == ["gateways.py"]
    assert unknown_names(block) == []
