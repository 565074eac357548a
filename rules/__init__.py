"""The rule pack. Each module holds one rule (or a small family) with its docs and examples.

Importing this package imports no torch; graph rules are listed by ``graph_rules()`` and source rules
by ``source_rules()``.
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Type

GRAPH_RULE_MODULES = (
    "output_tolerance",
    "fp16_overflow",
    "fp16_underflow",
    "batchnorm_scale",
    "backend_kernel",
    "decision_flip",
    "unflagged_hotspot",
    "constants",
    "integer_precision",
    "statistics",
    "reductions",
    "cancellation",
    "amplification",
)
SOURCE_RULE_MODULES = (
    "unused_suppression",
    "tolerance_resolution",
    "deprecated_amp",
    "deprecated_assert_allclose",
    "tf32_flags",
    "fp16_epsilon",
    "unparsable_file",
)


def _collect(modules, base_name: str) -> List[type]:
    from preclint import rulebase

    base = getattr(rulebase, base_name)
    found = []
    for name in modules:
        module = importlib.import_module(f"{__name__}.{name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, base) and value is not base and getattr(value, "code", None):
                if value.__module__ == module.__name__:
                    found.append(value)
    return sorted(found, key=lambda rule: rule.code)


def graph_rules() -> List[Type]:
    return _collect(GRAPH_RULE_MODULES, "Rule")


def source_rules() -> List[Type]:
    return _collect(SOURCE_RULE_MODULES, "SourceRule")


def all_rules() -> Dict[str, Type]:
    return {rule.code: rule for rule in graph_rules() + source_rules()}
