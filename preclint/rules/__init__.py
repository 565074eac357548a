"""The rule pack: graph rules in ``model/``, source rules in ``source/``, and the contract they
implement in ``base``. Each public module holds one rule, is named after it (``fp16-overflow`` lives in
``model/fp16_overflow.py``) and carries its docs and examples; modules whose names start with ``_``
hold helpers the rules share.

Rules are found by walking the two packages: a new rule is one new module, with nothing to register.
Importing the pack imports no torch (rule modules import it inside their example builders only).

Other packs are installed distributions with an entry point in the group ``preclint.rules`` (ENTRY_POINTS),
each naming a module (its rules: the classes it defines, and those of its public submodules when it is
a package) or a list of rule classes; their codes carry a prefix of their own, never PCL (docs/rule-packs.md).
They run, are selected, ignored and suppressed as the built-in rules are. A pack that cannot be loaded,
or whose codes or names clash with another's, is a UserError naming its distribution.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
import re
from types import ModuleType
from typing import Dict, Iterator, List, Tuple, Type

from preclint.core.errors import UserError, one_line
from preclint.rules.base import Rule, SourceRule

KINDS = ("model", "source")  # the subpackages that hold rules
ENTRY_POINTS = "preclint.rules"  # the entry-point group of installed rule packs
BUILTIN_PREFIX = "PCL"  # the built-in rules' codes; a pack's codes carry a prefix of their own
PACK_CODE = re.compile(r"^[A-Z]+[0-9]+$")  # ACME001: letters then digits, as config selectors and noqa read them


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

    return [
        value for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, (Rule, SourceRule)) and value not in (Rule, SourceRule)
        and value.__module__ == module.__name__ and getattr(value, "code", None)
    ]


def _discover() -> Tuple[type, ...]:
    return tuple(sorted(_discover_kind("model") + _discover_kind("source") + installed_pack_rules(),
                        key=lambda rule: rule.code))


@functools.lru_cache(maxsize=None)
def installed_pack_rules() -> Tuple[type, ...]:
    """The rules of every installed pack (entry points of the group ENTRY_POINTS), checked: each a
    Rule or SourceRule with a code of its own prefix and a name no other rule has."""
    found: List[type] = []
    # the built-in rules' names, from their modules' names (importing the source rules would import libcst);
    # their codes all start with PCL, which no pack's may
    taken = {module.split(".", 1)[1].replace("_", "-"): "preclint" for module in rule_modules()}
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: (e.value, e.name)):
        pack = _pack_name(entry)
        for rule in _rules_of_entry(entry, pack):
            for key in (rule.code, rule.name):
                if key in taken:
                    raise UserError(f"rule pack {pack}: {rule.__name__} is {key!r}, which {taken[key]} already uses")
                taken[key] = pack
            found.append(rule)
    return tuple(found)


def _pack_name(entry) -> str:
    dist = getattr(entry, "dist", None)
    name = dist.metadata["Name"] if dist is not None else None
    return f"{name or 'an unnamed distribution'} (entry point {entry.name} = {entry.value})"


def _rules_of_entry(entry, pack: str) -> List[type]:
    try:
        loaded = entry.load()
    except Exception as exc:  # a pack's own import error, whatever it is: one line that names the pack
        raise UserError(f"rule pack {pack} cannot be loaded: {one_line(exc)}") from None
    if isinstance(loaded, ModuleType):
        rules = rules_of(loaded) + [rule for name in _public_submodules(loaded, pack)
                                    for rule in rules_of(importlib.import_module(name))]
    elif isinstance(loaded, (list, tuple)):
        rules = list(loaded)
    else:
        raise UserError(f"rule pack {pack} names {type(loaded).__name__} {loaded!r}, not a module or a list of rules")
    if not rules:
        raise UserError(f"rule pack {pack} holds no rule")
    for rule in rules:
        if not (isinstance(rule, type) and issubclass(rule, (Rule, SourceRule)) and rule not in (Rule, SourceRule)):
            raise UserError(f"rule pack {pack} holds {rule!r}, not a subclass of preclint.rules.base.Rule or SourceRule")
        code, name = getattr(rule, "code", None), getattr(rule, "name", None)
        if not isinstance(code, str) or not PACK_CODE.match(code) or code.startswith(BUILTIN_PREFIX):
            raise UserError(f"rule pack {pack}: {rule.__name__}'s code {code!r} is not letters then digits with a "
                            f"prefix other than {BUILTIN_PREFIX} (which is preclint's own)")
        if not isinstance(name, str) or not name:
            raise UserError(f"rule pack {pack}: {rule.__name__} has no name")
    return rules


def _public_submodules(package: ModuleType, pack: str) -> List[str]:
    if not hasattr(package, "__path__"):
        return []
    names = sorted(f"{package.__name__}.{info.name}" for info in pkgutil.iter_modules(package.__path__)
                   if not info.name.startswith("_"))
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # as above: the pack's error, in one line
            raise UserError(f"rule pack {pack} cannot be loaded: {name}: {one_line(exc)}") from None
    return names


@functools.lru_cache(maxsize=None)
def _discover_kind(kind: str) -> Tuple[type, ...]:
    # one kind at a time: a model's check imports no source rule (they import libcst, a third of a
    # second) until a suppression comment asks what the source rules are
    found = []
    for name in rule_modules((kind,)):
        found += rules_of(importlib.import_module(f"{__name__}.{name}"))
    return tuple(sorted(found, key=lambda rule: rule.code))


def rediscover() -> None:
    """Forget the rules found, so that the next look walks the pack again (after a module is added),
    and the installed packs (after one is installed)."""
    importlib.invalidate_caches()
    _discover_kind.cache_clear()
    installed_pack_rules.cache_clear()


def graph_rules() -> List[Type]:
    return [rule for rule in _discover_kind("model") + installed_pack_rules() if issubclass(rule, Rule)]


def source_rules() -> List[Type]:
    return [rule for rule in _discover_kind("source") + installed_pack_rules() if issubclass(rule, SourceRule)]


def all_rules() -> Dict[str, Type]:
    """Every rule by its code: the built-in pack's and the installed packs'."""
    return {rule.code: rule for rule in _discover()}


def builtin_rules() -> Dict[str, Type]:
    """The built-in pack's rules by their code (what preclint's own docs list)."""
    return {rule.code: rule for rule in sorted(_discover_kind("model") + _discover_kind("source"),
                                               key=lambda rule: rule.code)}


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
