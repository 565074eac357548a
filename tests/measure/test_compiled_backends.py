"""A compiled backend is one module of preclint/measure/compilers/, found by its name: the command
line lists the folder without importing torch, and every module found is a backend by that name."""
from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys

import pytest

from preclint.core.choices import COMPILERS, PROBE_BACKEND_CHOICES, compiled_backend_names
from preclint.measure import compilers
from preclint.measure.compiled import CompiledBackend
from preclint.measure.compilers import DECLARED, backend_named
from tests.paths import ROOT

MODULES = [info.name for info in pkgutil.iter_modules(compilers.__path__) if not info.name.startswith("_")]


def test_the_command_line_lists_the_packages_own_modules():
    # core/choices.py finds the folder by path: were the package moved, the listing would come out empty
    assert [os.path.realpath(path) for path in compilers.__path__] == [os.path.realpath(COMPILERS)]
    assert compiled_backend_names() == tuple(sorted(MODULES)) and "inductor" in MODULES
    assert PROBE_BACKEND_CHOICES == ("eager", *sorted(MODULES))


@pytest.mark.parametrize("name", MODULES)
def test_every_backend_module_defines_the_declared_names(name):
    module = importlib.import_module(f"preclint.measure.compilers.{name}")
    assert [declared for declared in DECLARED if not hasattr(module, declared)] == []
    assert issubclass(module.BACKEND, CompiledBackend) and module.BACKEND.name == name
    backend = backend_named(name)
    assert isinstance(backend, module.BACKEND) and backend is not backend_named(name)  # a fresh one each time


def test_an_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="unknown backend 'onnxruntime' .choose from eager, inductor"):
        backend_named("onnxruntime")


@pytest.mark.subprocess
def test_listing_the_backends_imports_neither_torch_nor_a_backend():
    code = ("import sys\nfrom preclint.core.choices import PROBE_BACKEND_CHOICES\n"
            "print(PROBE_BACKEND_CHOICES, sorted(m for m in sys.modules if m == 'torch' or m.startswith('preclint.measure')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "('eager', 'inductor') []"
