"""Compiled backends use caches private to the run: Python planted in the shared Inductor cache
(``$TMPDIR/torchinductor_$USER`` or ``TORCHINDUCTOR_CACHE_DIR``: another user of the machine, a
restored CI cache) is never imported."""
from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch
from torch import nn

from preclint.measure import compile_caches
from preclint.measure.compilers.inductor import InductorBackend


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


def _compile_and_run(module, x):
    compiled = InductorBackend().compile(module)
    out = compiled(x)
    assert compiled.compilation.error is None
    return compiled, out


@pytest.mark.slow
def test_python_planted_in_the_shared_inductor_cache_is_not_imported(tmp_path, monkeypatch):
    shared = tmp_path / "torchinductor_user"
    shared.mkdir()
    marker = tmp_path / "planted_code_ran"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    module, x = Tiny().eval(), torch.randn(2, 8)
    with torch.no_grad():
        compiled, expected = _compile_and_run(module, x)
        private = compile_caches.run_directory()
        assert os.path.dirname(private) == os.path.realpath(os.path.dirname(private))  # a directory, not shared
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700 and os.stat(private).st_uid == os.getuid()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(shared)  # given back after the run
        assert list(shared.iterdir()) == []  # nothing written where others can write
        assert compiled.compilation.settings["caches"] == compile_caches.CACHES
        # what an attacker plants: the files Inductor generates for this model, with a line of their own
        generated = [os.path.join(d, f) for d, _, files in os.walk(private) for f in files if f.endswith(".py")]
        assert generated
        for path in generated:
            target = shared / os.path.relpath(path, private)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
            with open(target, "a") as planted:
                planted.write(f"\nopen({str(marker)!r}, 'w').write('ran')\n")
        compile_caches.remove_run_directory()
        assert not os.path.exists(private)
        again, out = _compile_and_run(module, x)
    assert not marker.exists(), "code planted in the shared cache was imported"
    assert torch.equal(out, expected)
    assert compile_caches.run_directory() != private  # a new directory for the new run
    compile_caches.remove_run_directory()
