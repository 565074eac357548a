"""The model's class line, read from the file's tree parsed once, is the one inspect gives."""
import importlib.util
import inspect
import sys
import textwrap

from preclint.locations.attach import _class_line


def test_class_lines_are_inspects(tmp_path):
    path = tmp_path / "models_file.py"
    path.write_text(textwrap.dedent('''
        import functools
        import torch

        Plain = None  # a name bound before its class: the class's own line counts


        class Plain(torch.nn.Module):
            pass


        def keep(cls):
            return cls


        @keep
        @functools.total_ordering
        class Decorated(torch.nn.Module):
            def __lt__(self, other):
                return False


        def build():
            class Inner(torch.nn.Module):
                pass
            return Inner
    '''))
    spec = importlib.util.spec_from_file_location("models_file", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["models_file"] = module  # (inspect finds a class's file through its module)
    try:
        spec.loader.exec_module(module)
        _compare(path, module)
    finally:
        del sys.modules["models_file"]


def _compare(path, module):
    for cls in (module.Plain, module.Decorated):
        assert _class_line(str(path), cls) == inspect.getsourcelines(cls)[1]
    assert _class_line(str(path), module.build()) is None  # not module-level: inspect decides
