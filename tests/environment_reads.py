"""Which environment variables gpusched's settings read, found by reading
the settings' source and the project modules it imports, not by a hand list
(the reference page and the service's settings file are checked against it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "gpusched" / "settings.py"
# The settings' helpers whose first argument is a variable's name.
ENV_READERS = frozenset({"env_float", "env_list"})


def _module_path(module: str) -> Path | None:
    """The file of a project module (`gpusched.upstreams`), or None."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imported_project_modules(tree: ast.Module) -> list[Path]:
    """The gpusched modules a module imports, at the top or inside a block."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpusched"):
            module = node.module or ""
            for alias in node.names:
                path = _module_path(f"{module}.{alias.name}") or _module_path(module)
                if path is not None:
                    found.append(path)
    return found


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "TEXT"` assignments."""
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = node.value.value
    return constants


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, or a parameter named `environ`."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _read_names(tree: ast.Module) -> list[ast.expr]:
    """The expressions naming a variable the module reads: the key of
    `os.environ.get(KEY)`, `environ.get(KEY)`, `os.environ[KEY]` (read),
    `os.getenv(KEY)`, `env_float(KEY, ...)` and `env_list(KEY, ...)`."""
    keys: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value):
                keys.append(node.args[0])
            elif isinstance(func, ast.Attribute) and func.attr == "getenv":
                keys.append(node.args[0])
            elif isinstance(func, ast.Name) and func.id in ENV_READERS:
                keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if _is_environ(node.value):
                keys.append(node.slice)
    return keys


def environment_variables_read(entry: Path = SETTINGS) -> set[str]:
    """Every variable `entry` and the project modules it imports read; a key
    given as a constant (`CONFIG_VARIABLE`) is looked up where it is defined."""
    seen: set[Path] = set()
    pending = [entry]
    modules: dict[Path, ast.Module] = {}
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        modules[path] = ast.parse(path.read_text())
        pending.extend(_imported_project_modules(modules[path]))
    constants: dict[str, str] = {}
    for tree in modules.values():
        constants.update(_string_constants(tree))
    names = set()
    for tree in modules.values():
        for key in _read_names(tree):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                names.add(key.value)
            elif isinstance(key, ast.Name) and key.id in constants:
                names.add(constants[key.id])
            elif isinstance(key, ast.Name) and key.id == "name":
                continue  # env_float's and env_list's own parameter
            else:
                raise AssertionError(f"an environment read the test cannot name: {ast.dump(key)}")
    return names
