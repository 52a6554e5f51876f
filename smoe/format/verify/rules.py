"""The checkers, registered by the rules of the spec's registry (``smoe_gen.layout.Rule``).

Every rule has exactly one checker: a small function that makes that rule's findings. Most
belong to a :class:`Section`, an ordered list run over one part of the file; a few are
called on their own (:func:`rule`). A checker checks several rules only where their
findings must interleave (the reason sits beside it). Registering a second checker for a
rule, or one for a code the registry does not hold, is refused, so :func:`checkers` says
which rules the verifier checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from smoe_gen.layout import RULES, Rule

__all__ = ["Checker", "Section", "checkers", "rule"]

F = TypeVar("F")  # the facts a section's checks read
C = TypeVar("C", bound=Callable[..., Any])
Check = Callable[[F], bool | None]  # a gate returns whether it passed; other checks None


@dataclass(frozen=True)
class Checker:
    """One registered check: the rules whose findings it makes, its section, its function
    and whether it is a gate (when it fails, the later checks of its section do not run:
    they read what it guards).

    >>> c = checkers()["header.magic"]
    >>> c.section, c.gate, [r.code for r in c.rules]
    ('header', True, ['header.magic'])
    """

    rules: tuple[Rule, ...]
    section: str
    check: Callable[..., Any]
    gate: bool = False


_BY_CODE: dict[str, Checker] = {}


def _register(checker: Checker) -> None:
    """Refuse a code outside the registry, or a rule that already has its checker."""
    for r in checker.rules:
        if not isinstance(r, Rule) or RULES.get(r.code) is not r:
            raise ValueError(f"{r!r}: not a rule of the spec's registry (smoe_gen.layout.Rule)")
        if r.code in _BY_CODE:
            raise ValueError(f"{r.code}: already checked by {_BY_CODE[r.code].check.__qualname__}")
    if not checker.rules:
        raise ValueError(f"{checker.check.__qualname__}: a checker checks at least one rule")
    for r in checker.rules:
        _BY_CODE[r.code] = checker


def checkers() -> dict[str, Checker]:
    """Every checked rule's code -> its one checker, in the order they were registered.

    >>> found = checkers()
    >>> found["table.order"].section, found["blob.scales"] is found["blob.padding"]
    ('table', True)
    """
    return dict(_BY_CODE)


def rule(*rules: Rule, section: str) -> Callable[[C], C]:
    """Register the decorated function as the checker of ``rules``, called on its own.

    >>> @rule(Rule.HEADER_MAGIC, section="elsewhere")  # header.magic has its checker
    ... def again() -> None: ...
    Traceback (most recent call last):
    ...
    ValueError: header.magic: already checked by _magic
    """

    def register(check: C) -> C:
        _register(Checker(tuple(rules), section, check))
        return check

    return register


class Section(Generic[F]):
    """An ordered list of checks over one part of the file; each reads the section's facts
    ``F`` and adds its findings to the report they hold.

    >>> demo: Section[list[str]] = Section("demo")
    >>> demo.name, demo.run([])  # no checks: nothing stops it
    ('demo', True)
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._checks: list[Checker] = []

    def rule(self, *rules: Rule, gate: bool = False) -> Callable[[Check[F]], Check[F]]:
        """Register the decorated function as the checker of ``rules``, run after the
        section's earlier ones (a ``gate`` returns whether it passed).

        >>> demo: Section[int] = Section("demo")
        >>> code = "header.nonsense"  # a code, not a rule of the registry
        >>> demo.rule(code)(lambda facts: None)
        Traceback (most recent call last):
        ...
        ValueError: 'header.nonsense': not a rule of the spec's registry (smoe_gen.layout.Rule)
        """

        def register(check: Check[F]) -> Check[F]:
            checker = Checker(tuple(rules), self.name, check, gate)
            _register(checker)
            self._checks.append(checker)
            return check

        return register

    def run(self, facts: F) -> bool:
        """Run the checks in order; False when a gate failed (the later ones did not run).

        >>> from smoe.format.verify.header import HEADER
        >>> [c.rules[0].code for c in HEADER.checks[:3]]
        ['header.size', 'header.magic', 'header.version']
        """
        for checker in self._checks:
            passed = checker.check(facts)
            if checker.gate and not passed:
                return False
        return True

    @property
    def checks(self) -> list[Checker]:
        """The section's checkers, in the order they run.

        >>> from smoe.format.verify.arch import ARCH
        >>> ARCH.checks[0].rules[0].code, ARCH.checks[0].gate
        ('arch.magic', True)
        """
        return list(self._checks)
