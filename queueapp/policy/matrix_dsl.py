"""llama-swap's matrix set expressions, parsed and expanded.

A matrix set is written as an expression (llama-swap internal/matrix/dsl.go):
a model id or var is a leaf, `&` takes one choice from each side and runs
them together, `|` picks one of its sides, `( )` groups and `+name` stands for
another set's expression. `&` binds tighter than `|`, so `a | b & c` is
`a | (b & c)`. An identifier is letters, digits, `_`, `-` and `.`
(Go's unicode.IsLetter and unicode.IsDigit).

`combinations` expands an expression the way llama-swap's evaluator does
(internal/matrix/program.go, `evaluate` and `addToFrontier`): every
combination is cut down to the models a query cares about (the requested and
the running ones), and one inside another is dropped, since with costs of at
least 1 it can never be the cheaper choice. That keeps a product of many
alternatives small, and the combinations left come in llama-swap's order,
which is the order its ties are broken in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Leaf:
    model: str


@dataclass(frozen=True)
class SetRef:
    set_name: str


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Expression, ...]


@dataclass(frozen=True)
class AnyOf:
    choices: tuple[Expression, ...]


Expression = Leaf | SetRef | AllOf | AnyOf


class ExpressionSyntaxError(ValueError):
    """The reason an expression does not parse, in llama-swap's own words."""


@dataclass(frozen=True)
class _Token:
    kind: str  # one of the operator characters, "ident", "ref" or "end"
    text: str
    position: int


_OPERATORS = "&|()"
# Python's isspace also counts the ASCII separators 0x1c-0x1f; Go does not.
_NOT_GO_SPACE = "\x1c\x1d\x1e\x1f"


def _is_space(ch: str) -> bool:
    return ch.isspace() and ch not in _NOT_GO_SPACE


def _is_ident_char(ch: str) -> bool:
    return ch.isalpha() or ch.isdecimal() or ch in "_-."


def _ident_end(text: str, start: int) -> int:
    end = start
    while end < len(text) and _is_ident_char(text[end]):
        end += 1
    return end


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if _is_space(ch):
            i += 1
        elif ch in _OPERATORS:
            tokens.append(_Token(ch, ch, i))
            i += 1
        elif ch == "+":
            end = _ident_end(text, i + 1)
            if end == i + 1:
                raise ExpressionSyntaxError(f"expected set name after '+' at position {i + 1}")
            tokens.append(_Token("ref", text[i + 1 : end], i))
            i = end
        elif _is_ident_char(ch):
            end = _ident_end(text, i)
            tokens.append(_Token("ident", text[i:end], i))
            i = end
        else:
            raise ExpressionSyntaxError(f"unexpected character {ch!r} at position {i}")
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    """Recursive descent: or-expression := and-expression ('|' and-expression)*."""

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens
        self._at = 0

    def _peek(self) -> _Token:
        return self._tokens[self._at]

    def _take(self) -> _Token:
        token = self._tokens[self._at]
        if token.kind != "end":
            self._at += 1
        return token

    def any_of(self) -> Expression:
        choices = [self.all_of()]
        while self._peek().kind == "|":
            self._take()
            choices.append(self.all_of())
        return choices[0] if len(choices) == 1 else AnyOf(tuple(choices))

    def all_of(self) -> Expression:
        parts = [self.atom()]
        while self._peek().kind == "&":
            self._take()
            parts.append(self.atom())
        return parts[0] if len(parts) == 1 else AllOf(tuple(parts))

    def atom(self) -> Expression:
        token = self._take()
        if token.kind == "ident":
            return Leaf(token.text)
        if token.kind == "ref":
            return SetRef(token.text)
        if token.kind == "(":
            inner = self.any_of()
            if self._take().kind != ")":
                raise ExpressionSyntaxError("missing closing parenthesis")
            return inner
        raise ExpressionSyntaxError(f"unexpected token {token.text!r}")

    def whole(self) -> Expression:
        expression = self.any_of()
        if self._peek().kind != "end":
            raise ExpressionSyntaxError(f"unexpected token {self._peek().text!r} after expression")
        return expression


def parse_expression(text: str) -> Expression:
    """The expression's tree, its identifiers not yet resolved to models."""
    if not text.strip():
        raise ExpressionSyntaxError("empty DSL expression")
    return _Parser(_tokens(text)).whole()


def identifiers(expression: Expression) -> list[Leaf | SetRef]:
    """Leaves and references in llama-swap's walk order (node, then children)."""
    if isinstance(expression, Leaf | SetRef):
        return [expression]
    children = expression.parts if isinstance(expression, AllOf) else expression.choices
    return [found for child in children for found in identifiers(child)]


def map_leaves(expression: Expression, to_model: Callable[[str], str]) -> Expression:
    """The same tree with each leaf's name replaced by `to_model(name)`."""
    if isinstance(expression, Leaf):
        return Leaf(to_model(expression.model))
    if isinstance(expression, SetRef):
        return expression
    if isinstance(expression, AllOf):
        return AllOf(tuple(map_leaves(part, to_model) for part in expression.parts))
    return AnyOf(tuple(map_leaves(choice, to_model) for choice in expression.choices))


Combinations = list[frozenset[str]]


def _add_keeping_maximal(found: Combinations, candidate: frozenset[str]) -> Combinations:
    # A combination inside another can never be the better choice: every
    # model it lacks is either the requested one or costs at least 1 to evict.
    if any(candidate <= kept for kept in found):
        return found
    return [kept for kept in found if not kept <= candidate] + [candidate]


def combinations(
    expression: Expression,
    *,
    relevant: frozenset[str],
    expression_of: Mapping[str, Expression],
) -> Combinations:
    """The combinations `expression` allows, each cut down to `relevant`."""
    if isinstance(expression, Leaf):
        return [frozenset({expression.model}) & relevant]
    if isinstance(expression, SetRef):
        referenced = expression_of[expression.set_name]
        return combinations(referenced, relevant=relevant, expression_of=expression_of)
    if isinstance(expression, AnyOf):
        found: Combinations = []
        for choice in expression.choices:
            for each in combinations(choice, relevant=relevant, expression_of=expression_of):
                found = _add_keeping_maximal(found, each)
        return found
    joined: Combinations = [frozenset()]
    for part in expression.parts:
        part_combinations = combinations(part, relevant=relevant, expression_of=expression_of)
        widened: Combinations = []
        for left in joined:
            for right in part_combinations:
                widened = _add_keeping_maximal(widened, left | right)
        joined = widened
    return joined
