"""preclint.check gives back the process state a model's code changes, one class of state at a time,
each changed as a model does it (in its forward, or at the import of its file), and honours its time
limit from any thread."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import preclint
from preclint.capture import fp32_precision, global_state
from preclint.core.errors import UserError
from tests.paths import ROOT


class Changes(nn.Module):
    """A model whose forward calls ``change`` (after computing its output, so the check goes on)."""

    def __init__(self, change):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.change = change

    def forward(self, x):
        y = self.fc(x)
        self.change()
        return y


def check(change):
    """preclint.check on a model that calls ``change`` in its forward; a check the change breaks
    must give the state back all the same."""
    try:
        preclint.check(Changes(change), torch.randn(2, 8), precisions=("tf32",))
    except UserError:
        pass


@pytest.fixture
def tf32_as_torch_starts():
    saved = fp32_precision.read()
    yield
    fp32_precision.write(saved)


# ----------------------------------------------------------------------------- TF32, both APIs


@pytest.mark.parametrize("change", [
    lambda: torch.set_float32_matmul_precision("high"),
    lambda: torch.set_float32_matmul_precision("medium"),
    lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
    lambda: setattr(torch.backends.cudnn, "allow_tf32", False),
    lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),  # (a no-op before torch 2.9)
    lambda: setattr(torch.backends, "fp32_precision", "ieee"),
], ids=["matmul-precision-high", "matmul-precision-medium", "legacy-cublas", "legacy-cudnn", "new-cuda-matmul",
        "new-generic"])
def test_tf32_set_through_either_api_reads_as_before_and_does_not_raise(change, tf32_as_torch_starts):
    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32)
    readings = fp32_precision.read()  # (and every fp32_precision of torch >= 2.9)
    check(change)
    # what a user reads after the call, through the legacy getters that raise on a half-restored state
    assert (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32) == before
    assert fp32_precision.read() == readings


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch >= 2.9 only")
def test_a_caller_s_own_mix_of_the_apis_is_given_back_as_it_was(tf32_as_torch_starts):
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # the caller's: the legacy getter now raises
    before = fp32_precision.read()
    assert before["torch.get_float32_matmul_precision()"] == fp32_precision.RAISES
    check(lambda: torch.set_float32_matmul_precision("highest"))
    assert fp32_precision.read() == before
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"


# ---------------------------------------------------------- working directory, sys.path, environment

MEDDLING_FILE = """
import os, sys
import torch
from torch import nn

os.chdir({elsewhere!r})
sys.path.insert(0, {elsewhere!r})
sys.path.append("/nonexistent/preclint-test")
os.environ["PRECLINT_TEST_SET_AT_IMPORT"] = "1"
os.environ.pop("PRECLINT_TEST_CALLER", None)
sys.setrecursionlimit(50000)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        os.environ["PRECLINT_TEST_CALLER"] = "changed in forward"
        os.environ["PRECLINT_TEST_SET_IN_FORWARD"] = "1"
        sys.path.remove({elsewhere!r}) if {elsewhere!r} in sys.path else None
        return self.fc(x)


def example_inputs():
    return (torch.randn(2, 8),)
"""


def test_the_working_directory_sys_path_and_environment_come_back(tmp_path, monkeypatch):
    monkeypatch.setenv("PRECLINT_TEST_CALLER", "the caller's")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model = tmp_path / "model.py"
    model.write_text(MEDDLING_FILE.format(elsewhere=str(elsewhere)))
    cwd, path, environ, limit = os.getcwd(), list(sys.path), dict(os.environ), sys.getrecursionlimit()
    path_object = sys.path
    preclint.check(str(model), precisions=("tf32",))
    assert os.getcwd() == cwd
    assert sys.path == path and sys.path is path_object
    assert dict(os.environ) == environ and os.environ["PRECLINT_TEST_CALLER"] == "the caller's"
    assert sys.getrecursionlimit() == limit


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_failed_check_leaves_the_environment_as_it_was(tmp_path):
    # Giving back the deterministic-algorithms flag called torch.use_deterministic_algorithms(), whose
    # first call imports torch._inductor.config, which sets TORCHINDUCTOR_CACHE_DIR: in a check that
    # ended before anything had imported it (a model file that fails at import), after the
    # environment had been given back. Settings that did not change are not written now, and the
    # environment is given back last.
    (tmp_path / "m.py").write_text('raise RuntimeError("broken at import")\n')
    code = textwrap.dedent(f"""
        import os, preclint
        environ = dict(os.environ)
        try:
            preclint.check({str(tmp_path / "m.py")!r}, precisions=("tf32",))
        except preclint.UserError:
            pass
        print(sorted(set(os.environ.items()) ^ set(environ.items())))
    """)
    env = {name: value for name, value in os.environ.items() if name != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# ------------------------------------------------------------------------------- torch's registries


class Passing(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class PassingDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def function_modes():
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def dispatch_modes():
    return [torch._C._get_dispatch_stack_at(i) for i in range(torch._C._len_torch_dispatch_stack())]


def test_function_and_dispatch_modes_left_open_are_closed():
    check(lambda: (Passing().__enter__(), PassingDispatch().__enter__()))
    assert function_modes() == [] and dispatch_modes() == []
    assert torch.ones(1).device.type == "cpu"


def test_a_default_device_set_by_the_model_and_the_caller_s_own_modes():
    mode = Passing()
    with mode:  # the caller's own mode stays, and is the one on top when the call returns
        check(lambda: torch.set_default_device("meta"))
        assert function_modes() == [mode] and torch.get_default_device() == torch.device("cpu")
        assert torch.zeros(1).device.type == "cpu"
    assert function_modes() == []
    torch.set_default_device("cpu")  # and torch's own bookkeeping of the default device still works
    torch.set_default_device(None)
    assert function_modes() == []


def test_global_module_hooks_registered_by_the_model_are_removed():
    from torch.nn.modules import module

    def add_hooks():
        nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
        nn.modules.module.register_module_forward_pre_hook(lambda m, i: None)
        nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None)
        nn.modules.module.register_module_buffer_registration_hook(lambda m, n, b: None)

    before = {name: dict(value) if isinstance(value, dict) else value
              for name, value in vars(module).items() if name.startswith("_global_")}
    check(add_hooks)
    after = {name: dict(value) if isinstance(value, dict) else value
             for name, value in vars(module).items() if name.startswith("_global_")}
    assert after == before


def test_compiler_settings_the_model_changes_come_back():
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    limit, autotune = dynamo.cache_size_limit, inductor.max_autotune
    check(lambda: (setattr(dynamo, "cache_size_limit", limit + 7), setattr(inductor, "max_autotune", not autotune)))
    assert (dynamo.cache_size_limit, inductor.max_autotune) == (limit, autotune)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_compiler_config_first_imported_by_the_model_is_left_at_its_defaults(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch
        import torch._dynamo.config
        from torch import nn
        torch._dynamo.config.recompile_limit = 1
        torch._dynamo.config.suppress_errors = True

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x):
                return self.fc(x)

        def example_inputs():
            return (torch.randn(2, 8),)
    """))
    code = textwrap.dedent(f"""
        import sys, preclint
        assert "torch._dynamo.config" not in sys.modules
        preclint.check({str(tmp_path / "model.py")!r}, precisions=("tf32",))
        import torch._dynamo.config as config
        print(config.recompile_limit == config._config["recompile_limit"].default, config.suppress_errors)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["True", "False"], done.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_inter_op_thread_count_the_model_sets_is_named_in_a_warning():
    # torch takes the inter-op thread count once per process, so it cannot be given back: said, not hidden
    code = textwrap.dedent("""
        import warnings, torch, preclint
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)
            def forward(self, x):
                torch.set_num_interop_threads(1)
                return self.fc(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            preclint.check(Net(), torch.randn(2, 8), precisions=("tf32",))
        print([str(w.message) for w in caught if "could not give back" in str(w.message)])
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert "torch.get_num_interop_threads()" in done.stdout, done.stdout + done.stderr


def test_a_restore_that_fails_warns_and_the_others_still_come_back():
    def cannot(value):
        raise RuntimeError("read-only here")

    settings = global_state.settings
    try:
        reads = iter(range(100))  # a setting that reads otherwise after the body, and cannot be set back
        global_state.settings = lambda: [("a setting", lambda: next(reads), cannot)] + settings()
        with pytest.warns(RuntimeWarning, match="a setting .read-only here."):
            with global_state.preserved():
                torch.set_default_dtype(torch.float64)
    finally:
        global_state.settings = settings
    assert torch.get_default_dtype() == torch.float32


# ------------------------------------------------------------------------- the time limit, any thread


class Hangs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        while True:
            time.sleep(0.01)


def test_the_time_limit_holds_when_called_from_another_thread():
    ended = []

    def call():
        start = time.monotonic()
        try:
            preclint.check(Hangs(), torch.randn(2, 8), precisions=("tf32",), timeout=0.5)
        except UserError as exc:
            ended.append((str(exc), time.monotonic() - start))

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the time limit was ignored off the main thread"
    (message, _), = ended
    assert message.startswith("Hangs: gave up after 0.5 s, at ") and "test_state.py:" in message, message


def test_a_thread_s_time_limit_leaves_nothing_armed():
    from preclint.capture.usercode import guard

    raised = []

    def quick():
        try:
            with guard("model.py", 0.3):
                pass
            time.sleep(1.5)  # a time limit left armed would raise here
        except BaseException as exc:  # noqa: BLE001 - the test's own record of it
            raised.append(exc)

    worker = threading.Thread(target=quick)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and raised == []


# ------------------------------------------------------------------------- inputs handed over by the API


@pytest.mark.parametrize("build", ["holds-itself", "deep", "expanded"])
def test_inputs_handed_over_are_bounded_as_a_file_s_are(build):
    if build == "holds-itself":
        inputs = []
        inputs.append(inputs)
        inputs = [inputs]
    elif build == "deep":
        inputs = cur = []
        for _ in range(100_000):
            cur.append([])
            cur = cur[0]
        inputs = (inputs,)
    else:
        inputs = (torch.zeros(1).expand(10 ** 12),)
    with pytest.raises(UserError, match="Linear's inputs"):
        preclint.check(nn.Linear(4, 4), inputs, precisions=("tf32",))
