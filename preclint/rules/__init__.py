"""The rule pack: graph rules in ``model/``, source rules in ``source/``, and the contract they
implement in ``base``. Each public module holds one rule, is named after it (``fp16-overflow`` lives in
``model/fp16_overflow.py``) and carries its docs and examples; modules whose names start with ``_``
hold helpers the rules share.

Rules are found by walking the two packages: a new rule is one new module, with nothing to register.
Importing the pack imports no torch (rule modules import it inside their example builders only).
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Dict, Iterator, List, Tuple, Type


KINDS = ("model", "source")  # the subpackages that hold rules


def rule_modules(kinds: Tuple[str, ...] = KINDS) -> List[str]:
    """The pack's rule modules, as ``kind.name`` (every module of a kind in ``kinds`` not starting with ``_``)."""
    found = []
    for kind in kinds:
        package = importlib.import_module(f"{__name__}.{kind}")
        found += [f"{kind}.{info.name}" for info in pkgutil.iter_modules(package.__path__)
                  if not info.name.startswith("_")]
    return sorted(found)


def rules_of(module) -> List[type]:
    """The rule classes a module defines (not those it imports)."""
    from preclint.rules.base import Rule, SourceRule

    return [
        value for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, (Rule, SourceRule)) and value not in (Rule, SourceRule)
        and value.__module__ == module.__name__ and getattr(value, "code", None)
    ]


def _discover() -> Tuple[type, ...]:
    return tuple(sorted(_discover_kind("model") + _discover_kind("source"), key=lambda rule: rule.code))


@functools.lru_cache(maxsize=None)
def _discover_kind(kind: str) -> Tuple[type, ...]:
    # one kind at a time: a model's check imports no source rule (they import libcst, a third of a
    # second) until a suppression comment asks what the source rules are
    found = []
    for name in rule_modules((kind,)):
        found += rules_of(importlib.import_module(f"{__name__}.{name}"))
    return tuple(sorted(found, key=lambda rule: rule.code))


def rediscover() -> None:
    """Forget the rules found, so that the next look walks the pack again (after a module is added)."""
    importlib.invalidate_caches()
    _discover_kind.cache_clear()


def graph_rules() -> List[Type]:
    from preclint.rules.base import Rule

    return [rule for rule in _discover_kind("model") if issubclass(rule, Rule)]


def source_rules() -> List[Type]:
    from preclint.rules.base import SourceRule

    return [rule for rule in _discover_kind("source") if issubclass(rule, SourceRule)]


def all_rules() -> Dict[str, Type]:
    return {rule.code: rule for rule in _discover()}


def selected_rules(modes, config=None) -> List[Type]:
    """The graph rules the configuration selects (every one without a configuration) that concern
    one of the checked ``modes``."""
    return [rule for rule in graph_rules()
            if (config is None or config.is_selected(rule.code))
            and (not rule.precisions or any(mode in rule.precisions for mode in modes))]


def rules_to_run(ctx, config=None) -> Iterator[tuple]:
    """(rule, the context it sees) for each of ``selected_rules`` on the modes of ``ctx`` (a
    RuleContext): it sees only the modes among its ``precisions``."""
    for rule_cls in selected_rules(ctx.modes, config):
        yield rule_cls(), ctx.for_rule(rule_cls)


def rule_named(name: str) -> Type:
    """The built-in rule called ``name`` (kebab-case), from the one module named after it: what a
    caller outside the pack asks for by name, without importing the pack's modules itself or walking it."""
    for kind in KINDS:
        module_name = f"{__name__}.{kind}.{name.replace('-', '_')}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        for rule in rules_of(module):
            if rule.name == name:
                return rule
    raise LookupError(f"no built-in rule is called {name!r}")


def unreadable_file_rule() -> Type:
    """The source rule that reports the files no rule could check (``reports_unreadable_files``)."""
    return _the_one(rule for rule in source_rules() if rule.reports_unreadable_files)


def unused_suppression_rule() -> Type:
    """The source rule that reports suppression comments that silence nothing."""
    return _the_one(rule for rule in source_rules() if rule.reports_unused_suppressions)


def _the_one(rules) -> Type:
    (rule,) = rules
    return rule
