"""What depends on where preclint's files lie: its own frames are never the user's code, and the
source cache notices a change in any of its modules, whichever stage package holds it."""
from __future__ import annotations

import os
import pathlib

import preclint
from preclint.capture.frames import is_internal_file
from preclint.capture.usercode import _is_user_file
from preclint.source.cache import settings_key

PACKAGE = pathlib.Path(preclint.__file__).resolve().parent
STAGES = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def test_every_module_of_every_stage_is_preclint_s_own_code():
    assert len({p.parent for p in STAGES}) >= 10
    for path in STAGES + [PACKAGE / "cli.py"]:
        assert is_internal_file(str(path)), path
        assert not _is_user_file(str(path)), path


def test_a_change_to_a_rule_or_the_text_layer_changes_the_cache_key(tmp_path):
    codes = ["PCL501", "PCL502"]
    before = settings_key(codes)
    for module in (PACKAGE / "rules" / "source" / "tf32_flags.py", PACKAGE / "text" / "index.py"):
        stat = module.stat()
        try:
            os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
            assert settings_key(codes) != before, module
        finally:
            os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert settings_key(codes) == before
