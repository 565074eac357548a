"""preclint imports and watches without PyTorch Lightning: only preclint.watch.LightningCallback needs it,
and without it says so."""
import sys

import pytest

import preclint
from preclint.training import watch_lightning


def test_the_callback_without_lightning_says_so(monkeypatch):
    watch_lightning.lightning_callback.cache_clear()
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    try:
        with pytest.raises(ImportError, match="needs PyTorch Lightning"):
            preclint.watch.LightningCallback
    finally:
        watch_lightning.lightning_callback.cache_clear()


@pytest.mark.slow  # a fresh interpreter imports torch
def test_importing_preclint_s_watch_imports_no_lightning():
    import subprocess

    code = ("import sys, preclint; preclint.watch; import preclint.training.watch_lightning; "
            "import preclint.load.training; print(any(m.split('.')[0] in ('lightning', 'pytorch_lightning') "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
