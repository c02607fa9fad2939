"""llama-swap's two routing engines, as the simulator runs them: which running models a
request's model evicts. Pure Python, no simulator state, no policy import.

This is the simulator's own reading of llama-swap v250's source (mostlygeek/llama-swap),
kept apart from ``queueapp.policy.routing`` on purpose: two implementations written
independently can be compared against each other, one copy cannot.

Both engines answer ``eviction_for(target, running)``: the models of ``running`` (every
model not stopped, the starting ones included, and ``target`` itself when it is running)
to stop before ``target`` may run. They never look at what is busy: the simulator's
admission (``residency.py``) makes a request wait rather than stop a model with requests
in flight, as llama-swap's scheduler (internal/router/scheduler/fifo.go) queues it.

Group engine (internal/router/group.go ``EvictionFor``), one rule per running model:

1. a sibling in the target's group is stopped when that group has ``swap: true``;
2. a member of another group is stopped when the target's group is ``exclusive`` and
   that other group is not ``persistent``.

The quirk is kept, as llama-swap keeps it from its old ProcessGroup: loading a model of a
non-exclusive group leaves every other group running, exclusive ones included. The rules
hold whether or not the target is already running (a running model of an exclusive group
still stops the other groups' members that came up beside it). Models in no group form
llama-swap's default group ``(default)``: ``swap`` and ``exclusive`` true.

Matrix engine (internal/matrix/program.go ``Solve``): each named set is a DSL expression
over models (``&`` and, ``|`` or, ``( )``, ``+name`` another set; ``&`` binds tighter); a
set allows any subset of one of its combinations to run together.

1. the target already running: nothing is stopped;
2. the target in no set: it runs alone, every running model is stopped;
3. otherwise the combination holding the target that stops the running models with the
   lowest total ``evict_costs`` (1 when not listed) wins; on a tie, the first in program
   order (sets in definition order, a referenced set before the set that references it;
   a set's combinations in the order its expression lists them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_GROUP_ID = "(default)"  # llama-swap's config.DEFAULT_GROUP_ID
DEFAULT_EVICT_COST = 1


class RoutingError(ValueError):
    """A routing block llama-swap would refuse to load."""


class Router(Protocol):
    def eviction_for(self, target: str, running: Sequence[str]) -> list[str]: ...


# -- group engine -------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One of llama-swap's ``groups``, with its YAML defaults (config.go ``GroupConfig``)."""

    members: tuple[str, ...]
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False


@dataclass(frozen=True)
class GroupRouter:
    groups: Mapping[str, Group]
    group_of: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, groups: Mapping[str, Group], models: Sequence[str]) -> GroupRouter:
        """The groups as given plus the default group for every model left out of them."""
        group_of: dict[str, str] = {}
        for gid, group in groups.items():
            for member in group.members:
                if member in group_of:
                    raise RoutingError(
                        f"{gid}.members: model member {member} is used in multiple groups: "
                        f"{group_of[member]} and {gid}"
                    )
                if member not in models:
                    raise RoutingError(f"{gid}.members: unknown model {member!r}")
                group_of[member] = gid
        everything = dict(groups)
        loose = tuple(sorted(m for m in models if m not in group_of))
        if loose:
            everything[DEFAULT_GROUP_ID] = Group(members=loose)
            group_of.update(dict.fromkeys(loose, DEFAULT_GROUP_ID))
        return cls(groups=everything, group_of=group_of)

    def eviction_for(self, target: str, running: Sequence[str]) -> list[str]:
        own_id = self.group_of[target]
        own = self.groups[own_id]
        evict: list[str] = []
        for model in running:
            if model == target or model in evict:
                continue
            other_id = self.group_of[model]
            if other_id == own_id:
                if own.swap:
                    evict.append(model)
            elif own.exclusive and not self.groups[other_id].persistent:
                evict.append(model)
        return evict


# -- matrix engine: the DSL ---------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    name: str


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class AllOf:
    children: tuple[Expr, ...]


@dataclass(frozen=True)
class AnyOf:
    children: tuple[Expr, ...]


Expr = Leaf | Ref | AllOf | AnyOf


def _is_ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_-."


def _tokens(text: str) -> list[str]:
    """Operators as themselves, ``+name`` as one token, names as themselves."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "&|()":
            out.append(ch)
            i += 1
        else:
            start = i + 1 if ch == "+" else i
            end = start
            while end < len(text) and _is_ident_char(text[end]):
                end += 1
            if end == start:
                what = "set name after '+'" if ch == "+" else f"a name, not {ch!r}"
                raise RoutingError(f"expected {what} at position {start}")
            out.append(text[i:end])
            i = end
    return out


def parse_expression(text: str) -> Expr:
    """One set's DSL: ``or := and ('|' and)*``, ``and := atom ('&' atom)*``."""
    tokens = _tokens(text)
    if not tokens:
        raise RoutingError("empty DSL expression")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str | None:
        nonlocal pos
        token = peek()
        pos += token is not None
        return token

    def either() -> Expr:
        children = [both()]
        while peek() == "|":
            take()
            children.append(both())
        return children[0] if len(children) == 1 else AnyOf(tuple(children))

    def both() -> Expr:
        children = [atom()]
        while peek() == "&":
            take()
            children.append(atom())
        return children[0] if len(children) == 1 else AllOf(tuple(children))

    def atom() -> Expr:
        token = take()
        if token is None or token in "&|)":
            raise RoutingError(f"unexpected token {token or 'end of expression'!r}")
        if token == "(":
            inner = either()
            if take() != ")":
                raise RoutingError("missing closing parenthesis")
            return inner
        return Ref(token[1:]) if token.startswith("+") else Leaf(token)

    root = either()
    if peek() is not None:
        raise RoutingError(f"unexpected token {peek()!r} after expression")
    return root


# -- matrix engine: the solver ------------------------------------------------------------


def _add_to_frontier(states: list[frozenset[str]], candidate: frozenset[str]) -> None:
    """Keep only combinations no other one contains: costs are positive, so a superset
    keeps at least as much running and never decides worse. The superset goes last, as
    program.go's addToFrontier appends it, which is what ties are broken by."""
    if any(candidate <= state for state in states):
        return
    states[:] = [state for state in states if not state <= candidate]
    states.append(candidate)


@dataclass(frozen=True)
class MatrixRouter:
    """Compiled sets, in program order, each an expression over real model names."""

    sets: tuple[tuple[str, Expr], ...]
    evict_costs: Mapping[str, int]

    @classmethod
    def build(
        cls,
        sets: Sequence[tuple[str, str]],
        *,
        vars: Mapping[str, str],
        evict_costs: Mapping[str, int],
        models: Sequence[str],
    ) -> MatrixRouter:
        if not sets:
            raise RoutingError("sets: matrix must define at least one set")
        for key, model in vars.items():
            if model not in models:
                raise RoutingError(f"vars.{key}: references unknown model {model!r}")

        def resolve(name: str) -> str | None:
            if name in vars:
                return vars[name]
            return name if name in models else None

        costs: dict[str, int] = {}
        for key, cost in evict_costs.items():
            if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
                raise RoutingError(f"evict_costs.{key}: must be a positive integer, got {cost!r}")
            resolved = resolve(key)
            if resolved is None:
                raise RoutingError(f"evict_costs.{key}: unknown var or model {key!r}")
            costs[resolved] = cost
        names = [name for name, _ in sets]
        parsed: dict[str, Expr] = {}
        deps: dict[str, list[str]] = {}
        for name, text in sets:
            try:
                expr = parse_expression(text)
            except RoutingError as exc:
                raise RoutingError(f"sets.{name}: {exc}") from None
            parsed[name], deps[name] = cls._resolved(name, expr, resolve, names)
        return cls(
            sets=tuple((n, parsed[n]) for n in _program_order(names, deps)), evict_costs=costs
        )

    @staticmethod
    def _resolved(
        set_name: str, expr: Expr, resolve: Callable[[str], str | None], names: Sequence[str]
    ) -> tuple[Expr, list[str]]:
        refs: list[str] = []

        def walk(node: Expr) -> Expr:
            if isinstance(node, Leaf):
                model = resolve(node.name)
                if model is None:
                    raise RoutingError(f"sets.{set_name}: unknown var or model {node.name!r}")
                return Leaf(model)
            if isinstance(node, Ref):
                if node.name not in names:
                    raise RoutingError(f"sets.{set_name}: references undefined set {node.name!r}")
                if node.name not in refs:
                    refs.append(node.name)
                return node
            return type(node)(tuple(walk(child) for child in node.children))

        return walk(expr), refs

    def _combinations(self, expr: Expr, relevant: frozenset[str]) -> list[frozenset[str]]:
        """The expression's combinations, seen only through the ``relevant`` models."""
        if isinstance(expr, Leaf):
            return [frozenset({expr.name}) & relevant]
        if isinstance(expr, Ref):
            return self._combinations(dict(self.sets)[expr.name], relevant)
        states: list[frozenset[str]] = []
        if isinstance(expr, AnyOf):
            for child in expr.children:
                for state in self._combinations(child, relevant):
                    _add_to_frontier(states, state)
            return states
        states = [frozenset()]
        for child in expr.children:
            combined: list[frozenset[str]] = []
            for left in states:
                for right in self._combinations(child, relevant):
                    _add_to_frontier(combined, left | right)
            states = combined
        return states

    def eviction_for(self, target: str, running: Sequence[str]) -> list[str]:
        if target in running:
            return []
        relevant = frozenset({target, *running})
        best: tuple[int, frozenset[str]] | None = None
        for _, expr in self.sets:
            for state in self._combinations(expr, relevant):
                if target not in state:
                    continue
                cost = sum(
                    self.evict_costs.get(m, DEFAULT_EVICT_COST) for m in running if m not in state
                )
                if best is None or cost < best[0]:
                    best = (cost, state)
        if best is None:
            return list(running)
        return [model for model in running if model not in best[1]]


def _program_order(names: Sequence[str], deps: Mapping[str, list[str]]) -> list[str]:
    """Sets in definition order, each after the sets it references; a cycle is an error."""
    state: dict[str, int] = {}
    order: list[str] = []

    def visit(name: str) -> None:
        if state.get(name) == 1:
            raise RoutingError(f"sets.{name}: circular reference detected involving set {name!r}")
        if state.get(name) == 2:
            return
        state[name] = 1
        for dep in deps[name]:
            visit(dep)
        state[name] = 2
        order.append(name)

    for name in names:
        visit(name)
    return order
