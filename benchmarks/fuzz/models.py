"""Random model files for ``preclint check``, each with the command line that checks it.

A model is grown one statement at a time. Every candidate statement is executed at once on real
(small) tensors, in the namespace the statements before it built, and kept only if it runs: the
generated models therefore run eagerly on their example inputs (unless a case injects a fault on
purpose), and each statement knows the shapes and dtypes it works on without a shape calculus of
its own. Control flow keeps shapes and dtypes on every branch, so that values (which differ between
this process and the checked one) never decide whether a model runs.

Everything is drawn from ``random.Random(seed)`` and ``torch.manual_seed(seed)``: the same seed gives
the same files and command line on the same torch.
"""
from __future__ import annotations

import contextlib
import math
import random
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

FORMATS = ("full", "concise", "json", "sarif", "github", "rdjson")
PRECISIONS = ("tf32", "fp16", "bf16", "fp16-full", "bf16-full")

HEADER = (
    "import collections\nimport dataclasses\nimport math\nimport typing\n\n"
    "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"
)

# constants users write, and the ones that break reduced precision: float16's max and beyond,
# tiny epsilons that flush to zero, masks, zero
CONSTANTS = ("0.0", "1e-30", "1e-12", "1e-8", "1e-5", "0.5", "2.0", "3.0", "255.0", "1e4", "65504.0", "65520.0",
             "1e5", "1e38", "-1e9", "-65504.0", "float('inf')", "float('nan')")
EPSILONS = ("0.0", "1e-12", "1e-8", "1e-6", "1e-5", "1e-3")
EXPONENTS = ("0.5", "2", "3", "-1", "10", "0.3333", "-0.5", "2.5")
FILLS = ("-1e9", "float('-inf')", "-65504.0", "0.0", "-1e4", "1e30")
DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16", "torch.float64", "torch.int64", "torch.int32",
          "torch.bool", "torch.uint8", "torch.int8")


@dataclass
class Case:
    """One run of the command line: the files it needs and its arguments (after ``preclint``)."""

    name: str
    files: Dict[str, str]
    argv: List[str]
    tags: List[str] = field(default_factory=list)
    valid: bool = True  # every model runs eagerly on its inputs and every flag is well formed
    process: bool = False  # run in a child process (for signals, exit statuses, file descriptor 1)
    interrupt: Optional[float] = None  # send SIGINT after this many seconds (with process)
    binary: Dict[str, bytes] = field(default_factory=dict)  # files written as bytes (sources)


@dataclass
class Stmt:
    fwd: List[str]  # lines of forward(), indented as a block of their own
    init: List[str] = field(default_factory=list)  # lines of __init__
    top: List[str] = field(default_factory=list)  # module-level definitions
    tag: str = ""


def _f(x: float) -> str:
    return repr(float(x))


class _Builder:
    """One model: its inputs, the statements of __init__ and forward(), and the live values."""

    def __init__(self, rng: random.Random, seed: int, label: str):
        self.rng = rng
        self.seed = seed
        self.label = label
        self.counter = 0
        self.accepted: List[Stmt] = []
        self.tags: List[str] = []
        self.inputs: List[Tuple[str, str, str]] = []  # (name, expression that makes it, kind)
        self.reset()

    # ---------------------------------------------------------------------------- execution

    def reset(self) -> None:
        torch.manual_seed(self.seed)
        self.mod = nn.Module()
        self.ns: Dict[str, object] = {"torch": torch, "nn": nn, "F": F, "math": math, "self": self.mod,
                                      "collections": __import__("collections"),
                                      "dataclasses": __import__("dataclasses"), "typing": __import__("typing")}
        self.vars: List[str] = []
        for name, expr, kind in self.inputs:
            self.ns[name] = eval(expr, self.ns)
            if isinstance(self.ns[name], torch.Tensor):
                self.vars.append(name)

    def _run(self, stmt: Stmt) -> None:
        for line in stmt.top:
            exec(line, self.ns)
        for line in stmt.init:
            exec(line, self.ns)
        self.mod.eval()
        before = set(self.ns)
        exec("\n".join(stmt.fwd), self.ns)
        for name in self.ns:
            if name not in before and isinstance(self.ns[name], torch.Tensor) and name not in self.vars:
                self.vars.append(name)

    def try_stmt(self, stmt: Optional[Stmt]) -> bool:
        if stmt is None:
            return False
        try:
            with _quiet():
                self._run(stmt)
        except Exception:
            self.reset()
            with _quiet():
                for done in self.accepted:
                    self._run(done)
            return False
        self.accepted.append(stmt)
        if stmt.tag:
            self.tags.append(stmt.tag)
        return True

    def fresh(self, prefix: str = "h") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def value(self, name: str) -> torch.Tensor:
        return self.ns[name]  # type: ignore[return-value]

    def pick(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, avoid_inputs: bool = False) -> Optional[str]:
        """A variable whose value satisfies ``pred``, the recent ones more likely."""
        names = [n for n in self.vars if isinstance(self.ns.get(n), torch.Tensor) and pred(self.ns[n])]
        if avoid_inputs:
            names = [n for n in names if n not in {i[0] for i in self.inputs}] or names
        if not names:
            return None
        weights = [1.0 + i for i in range(len(names))]
        return self.rng.choices(names, weights)[0]


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -------------------------------------------------------------------------------- predicates

def _float(t: torch.Tensor) -> bool:
    return t.is_floating_point()


def _nd(n: int, op=lambda a, b: a >= b):
    return lambda t: op(t.dim(), n)


def _fnd(n: int):
    return lambda t: t.is_floating_point() and t.dim() >= n


def _int(t: torch.Tensor) -> bool:
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


# -------------------------------------------------------------------------------- the ops

# Templates over one operand {a}: (tag, requirement, expressions). Fields: {b} another variable of
# the same shape and dtype (else {a}), {d} a dim of {a}, {k} a size along {d}, {c} a constant,
# {eps}, {p} an exponent, {fill} a mask value, {dtype}, {perm} a permutation of the dims.
TEMPLATES: List[Tuple[str, Callable[[torch.Tensor], bool], Tuple[str, ...]]] = [
    ("elementwise", _float, (
        "torch.exp({a})", "torch.log({a})", "torch.log({a}.abs() + {eps})", "torch.sqrt({a})", "{a}.abs().sqrt()",
        "torch.rsqrt({a}.abs() + {eps})", "1.0 / {a}", "{a} / {c}", "{a} * {c}", "{a} + {c}", "{a} - {c}",
        "{a} ** {p}", "torch.pow({a}, {p})", "torch.sigmoid({a})", "torch.tanh({a})", "F.gelu({a})", "F.silu({a})",
        "F.relu({a})", "torch.clamp({a}, min={eps})", "torch.clamp({a}, -{c}, {c})", "torch.erf({a})",
        "torch.sin({a})", "{a}.neg()", "torch.expm1({a})", "torch.log1p({a}.abs())", "torch.nan_to_num({a})",
        "{a}.reciprocal()", "torch.exp({a} * {c})", "F.softplus({a}, beta={p})", "torch.atan2({a}, {a} + 1)",
        "torch.round({a} * 100) / 100", "torch.floor({a})", "{a}.sign()", "{a} + {b}", "{a} * {b}",
        "{a} / ({b} + {eps})", "{a} - {b}", "torch.maximum({a}, {b})", "{a}.pow(2).mean(-1, keepdim=True) + {eps}",
        "{a} * torch.rsqrt({a}.pow(2).mean(-1, keepdim=True) + {eps})", "({a} - {a}.mean()) / ({a}.std() + {eps})",
        "torch.exp({a} - {a}.amax(-1, keepdim=True))", "{a} * {a}.shape[-1] ** -0.5", "{a} / math.sqrt({a}.shape[-1])",
        "{a} * float({a}.mean())", "F.hardtanh({a})", "torch.lerp({a}, {b}, 0.5)", "torch.addcmul({a}, {a}, {b}, value={c})",
    )),
    ("softmax", _fnd(1), (
        "torch.softmax({a}, dim={d})", "F.log_softmax({a}, dim={d})", "F.softmax({a} / {eps}, dim=-1)",
        "torch.softmax({a}, dim={d}, dtype=torch.float32)", "{a}.softmax(-1)", "F.softmin({a}, dim={d})",
        "torch.logsumexp({a}, dim={d})", "F.gumbel_softmax({a}, tau=1.0)",
    )),
    ("reduction", lambda t: t.dim() >= 1 and not t.is_complex(), (
        "{a}.sum()", "{a}.sum(dim={d})", "{a}.sum(dim={d}, keepdim=True)", "{a}.sum(dtype=torch.float64)",
        "{a}.sum(dim={d}, dtype=torch.float16)", "{a}.float().mean(dim={d})", "{a}.float().mean()", "{a}.prod(dim={d})",
        "{a}.amax(dim={d})", "{a}.amin()", "{a}.float().std(dim={d})", "{a}.float().var()", "torch.norm({a}.float())",
        "{a}.float().norm(dim={d})", "torch.max({a}, dim={d}).values", "{a}.max()", "{a}.float().mean(({d},), keepdim=True)",
        "torch.linalg.vector_norm({a}.float(), dim={d})", "{a}.count_nonzero()", "{a}.float().nanmean()",
    )),
    ("cumsum", lambda t: t.dim() >= 1 and not t.is_complex(), (
        "torch.cumsum({a}, dim={d})", "{a}.cumsum({d}, dtype=torch.float16)", "torch.cumprod({a}, dim={d})",
        "torch.logcumsumexp({a}.float(), dim={d})", "{a}.cumsum(-1) / {a}.shape[-1]", "torch.cummax({a}, dim={d}).values",
    )),
    ("compare", lambda t: not t.is_complex(), (
        "torch.where({a} > {c}, {a}, {b})", "torch.where({a} > 0, {a}, torch.zeros_like({a}))",
        "{a}.masked_fill({a} < 0, {fill})", "{a}.float().masked_fill({a} == 0, {fill})", "({a} > {b})",
        "{a}.eq(0)", "torch.isnan({a}.float())", "({a} > 0).float()", "({a} > 0).any()", "{a} >= {a}.mean(dtype=torch.float32)",
        "torch.logical_and({a} > 0, {b} < 1)", "torch.isclose({a}, {b})", "torch.where({a}.isfinite(), {a}, {c})",
        "{a}.masked_fill(torch.ones_like({a}, dtype=torch.bool).triu(1), {fill})",
    )),
    ("discrete", lambda t: t.dim() >= 1 and t.numel() > 0 and not t.is_complex(), (
        "{a}.argmax(dim={d})", "torch.topk({a}, k={k}, dim={d}).values", "torch.topk({a}.float(), k={k}, dim={d}).indices",
        "{a}.sort(dim={d}).values", "{a}.sort(dim={d}, descending=True).indices", "torch.max({a}, dim={d})[0]",
        "{a}.argsort(dim={d})", "torch.argmin({a})", "torch.unique({a}).sum()", "{a}.argmax(-1, keepdim=True)",
        "torch.gather({a}, {d}, {a}.argsort(dim={d}))", "torch.searchsorted({a}.flatten().sort().values, {a}.flatten())",
        "torch.kthvalue({a}.float(), 1, dim={d}).values", "torch.mode({a}, dim={d}).values",
    )),
    ("cast", lambda t: not t.is_complex(), (
        "{a}.half()", "{a}.float()", "{a}.to(torch.int64)", "{a}.bfloat16()", "{a}.double()", "{a}.bool()",
        "{a}.to(torch.float16)", "{a}.long()", "{a}.int()", "{a}.to(torch.uint8)", "{a}.type(torch.float16)",
        "{a}.to({dtype})", "{a}.to(dtype={dtype}, copy=True)", "{a}.type_as({b})", "{a}.float().half().float()",
    )),
    ("integer", _int, (
        "{a} // 3", "{a} % 7", "{a} & 1", "{a} * 2 + 1", "torch.div({a}, 2, rounding_mode='floor')", "{a}.float() / 3",
        "{a} >> 1", "{a} ^ {b}", "{a}.sum()", "torch.bincount({a}.flatten().clamp(min=0)).sum()", "{a}.abs() % 1000",
        "F.one_hot({a}.clamp(0, 9).long(), 10)", "{a} * 1000003", "{a}.cumsum(0)", "({a} * 65537).float()",
        "{a}.double() * 2 ** 60", "torch.div({a}, 3)",
    )),
    ("view", lambda t: t.dim() >= 1, (
        "{a}.reshape(-1)", "{a}.flatten(1) if {a}.dim() > 1 else {a}", "{a}.permute({perm})", "{a}.transpose(0, -1)",
        "{a}.unsqueeze(0)", "{a}.squeeze()", "{a}.contiguous()", "torch.cat([{a}, {a}], dim={d})",
        "torch.stack([{a}, {b}], dim=0)", "{a}[..., :{k}]", "{a}[:, None]", "{a}[0]", "{a}.chunk(2, dim={d})[0]",
        "{a}.split(1, dim={d})[-1]", "{a}.flip(0)", "{a}.roll(1, 0)", "torch.repeat_interleave({a}, 2, dim=0)",
        "{a}.narrow({d}, 0, {k})", "{a}.expand(2, *{a}.shape)", "{a}.view(-1)", "{a}[{a} > 0].sum()", "{a}.mT",
        "{a}.unflatten(-1, ({a}.shape[-1], 1))", "{a}.reshape({a}.shape[0], -1)", "{a}[::2]", "{a}[-1:]",
        "{a}.movedim(0, -1)", "torch.tensor({a}.flatten()[:4].tolist())", "{a}.detach()", "{a}.clone()",
        "{a}.new_zeros({a}.shape)", "torch.zeros_like({a})", "{a}.masked_select({a} > 0).sum()",
    )),
    ("random", _float, (
        "torch.randn_like({a})", "{a} + torch.rand_like({a}) * 1e-3", "F.dropout({a}, 0.1, training=True)",
        "torch.bernoulli(torch.full_like({a}, 0.5))", "F.dropout({a}, p=0.5, training=self.training)",
    )),
    ("complex", lambda t: t.is_floating_point() and t.dim() >= 1 and t.dtype in (torch.float32, torch.float64), (
        "torch.fft.rfft({a}).abs()", "torch.fft.fft({a})", "torch.view_as_real(torch.fft.rfft({a}))",
        "torch.polar({a}.abs(), {a})", "torch.fft.irfft(torch.fft.rfft({a}), n={a}.shape[-1])",
    )),
    ("pool", _fnd(3), (
        "F.max_pool1d({a}.flatten(2), 2)", "F.avg_pool1d({a}.flatten(2), 2)", "F.adaptive_avg_pool1d({a}.flatten(2), 1)",
        "F.interpolate({a}.flatten(2), scale_factor=2, mode='nearest')", "F.pad({a}, (1, 1))",
        "F.max_pool2d({a}, 2)", "F.adaptive_avg_pool2d({a}, 1)", "F.interpolate({a}, scale_factor=2, mode='bilinear')",
        "F.avg_pool2d({a}, 2, ceil_mode=True)", "F.pixel_shuffle({a}, 1)", "F.unfold({a}, 2)",
    )),
]

# (ops whose result's shape depends on values, unique, boolean indexing, masked_select, bincount, are
# summed: the checked run draws other values than this process, and a shape must not follow them)

# In-place statements: no new variable; the operand changes.
INPLACE = (
    "{a}.relu_()", "{a}.add_(1.0)", "{a}.mul_({c})", "{a}[:, 0] = 0", "{a}[..., 0] = {c}", "{a} += 1",
    "{a}.clamp_(-1, 1)", "F.relu({a}, inplace=True)", "{a}.copy_({b})", "{a}.zero_()", "{a}.fill_({c})",
    "{a}.masked_fill_({a} < 0, {fill})", "{a}.sigmoid_()", "{a}.exp_()", "{a}.div_(0)", "{a} *= {b}",
    "{a}.index_fill_(0, torch.tensor([0]), {c})", "{a}.sub_({b}).abs_()", "{a}[{a} != {a}] = 0",
)

AUTOCAST = (
    'torch.autocast("cpu", dtype=torch.bfloat16)', 'torch.autocast("cpu", enabled=False)',
    'torch.autocast(device_type="cpu", dtype=torch.float16)', 'torch.autocast("cuda", dtype=torch.float16)',
    "torch.no_grad()", "torch.enable_grad()", 'torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)',
    "torch.inference_mode()", 'torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)',
)

FUNCTIONS = {
    "clamp": """
        class {name}(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.clamp(min=0)

            @staticmethod
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return grad * (x > 0).to(grad.dtype)
    """,
    "scale": """
        class {name}(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, factor):
                ctx.factor = factor
                return x * factor

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.factor, None
    """,
    "nograd": """
        class {name}(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.round()

            @staticmethod
            def backward(ctx, grad):
                return None
    """,
    "dirty": """
        class {name}(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x.clone()
                y.mul_(2)
                ctx.mark_non_differentiable(y)
                return y

            @staticmethod
            def backward(ctx, grad):
                return grad
    """,
    "setup": """
        class {name}(torch.autograd.Function):
            @staticmethod
            def forward(x):
                return torch.exp(x)

            @staticmethod
            def setup_context(ctx, inputs, output):
                ctx.save_for_backward(output)

            @staticmethod
            def backward(ctx, grad):
                (y,) = ctx.saved_tensors
                return grad * y
    """,
}


class ModelGenerator:
    """Draws one model file: inputs, statements, output, example inputs (or flags for them)."""

    def __init__(self, rng: random.Random, seed: int, label: str = "Net", alone: bool = True):
        self.rng = rng
        self.b = _Builder(rng, seed, label)
        self.label = label
        self.alone = alone  # the only model of its run: its inputs may come from --input flags
        self.model_flag: Optional[str] = None  # the name of the model in the file, when it must be given
        self.params: List[str] = []  # forward's parameter list (after self)
        self.flags: List[str] = []  # --input flags when the inputs come from the command line

    # ---------------------------------------------------------------------------- inputs

    def _input_expr(self) -> Tuple[str, str]:
        r = self.rng
        kind = r.choices(["float", "image", "seq", "ids", "mask", "scalar", "empty", "half", "bf16", "double",
                          "big", "tiny", "int", "nan"], [8, 5, 5, 3, 2, 1, 1, 1, 1, 1, 2, 1, 1, 1])[0]
        b = r.choice([1, 2, 3, 4])
        d = r.choice([1, 3, 4, 8, 16, 17])
        if kind == "float":
            return f"torch.randn({b}, {d})", kind
        if kind == "image":
            return f"torch.randn({b}, {r.choice([1, 3, 4])}, {r.choice([4, 5, 8])}, {r.choice([4, 6, 8])})", kind
        if kind == "seq":
            return f"torch.randn({b}, {r.choice([1, 5, 7])}, {d})", kind
        if kind == "ids":
            return f"torch.randint(0, {r.choice([10, 50, 1000])}, ({b}, {r.choice([3, 7])}))", kind
        if kind == "mask":
            return f"torch.rand({b}, {d}) > 0.5", kind
        if kind == "scalar":
            return r.choice(["torch.tensor(3.0)", "torch.tensor(-1e4)", "torch.randn(())"]), kind
        if kind == "empty":
            return r.choice([f"torch.zeros(0, {d})", f"torch.randn({b}, 0)", f"torch.randn({b}, 0, {d})"]), kind
        if kind == "half":
            return f"torch.randn({b}, {d}).half()", kind
        if kind == "bf16":
            return f"torch.randn({b}, {d}, dtype=torch.bfloat16)", kind
        if kind == "double":
            return f"torch.randn({b}, {d}, dtype=torch.float64)", kind
        if kind == "big":
            return r.choice([f"torch.randn({b}, {d}) * 1e5", f"torch.full(({b}, {d}), 70000.0)",
                             f"torch.randn({b}, {d}) * 3e38"]), kind
        if kind == "tiny":
            return f"torch.randn({b}, {d}) * 1e-7", kind
        if kind == "int":
            return f"torch.arange({b * d}).reshape({b}, {d}) * 1000003", kind
        return f"torch.tensor([[1.0, float('nan'), float('inf'), -2.0]]).repeat({b}, 1)", kind

    def make_inputs(self) -> None:
        n = self.rng.choices([0, 1, 2, 3], [1, 10, 5, 2])[0]
        for i in range(n):
            expr, kind = self._input_expr()
            name = ["x", "y", "z"][i]
            self.b.inputs.append((name, expr, kind))
            self.b.tags.append(f"input:{kind}")
        # non-tensor inputs now and then: a number, None, a list of tensors
        if n and self.rng.random() < 0.15:
            extra = self.rng.choice([("scale", "2.0", "number"), ("aux", "None", "none"),
                                     ("extra", "[torch.randn(2, 3), torch.randn(3)]", "list"), ("flag", "True", "bool")])
            self.b.inputs.append(extra)
            self.b.tags.append(f"input:{extra[2]}")
        self.b.reset()

    # ---------------------------------------------------------------------------- statements

    def _fields(self, a: str) -> Dict[str, str]:
        r = self.rng
        t = self.b.value(a)
        same = [n for n in self.b.vars if n != a and isinstance(self.b.ns.get(n), torch.Tensor)
                and self.b.ns[n].shape == t.shape and self.b.ns[n].dtype == t.dtype]
        nd = max(t.dim(), 1)
        d = r.randrange(-nd, nd) if t.dim() else 0
        size = t.shape[d] if t.dim() else 1
        perm = list(range(t.dim()))
        r.shuffle(perm)
        return {
            "a": a, "b": r.choice(same) if same else a, "d": str(d), "k": str(r.randint(1, max(1, size))),
            "c": r.choice(CONSTANTS), "eps": r.choice(EPSILONS), "p": r.choice(EXPONENTS),
            "fill": r.choice(FILLS), "dtype": r.choice(DTYPES), "perm": str(tuple(perm)),
        }

    def template(self) -> Optional[Stmt]:
        tag, pred, exprs = self.rng.choice(TEMPLATES)
        a = self.b.pick(pred)
        if a is None:
            return None
        expr = self.rng.choice(exprs).format(**self._fields(a))
        return Stmt([f"{self.b.fresh()} = {expr}"], tag=tag)

    def inplace(self) -> Optional[Stmt]:
        a = self.b.pick(lambda t: t.dim() >= 1, avoid_inputs=self.rng.random() < 0.8)
        if a is None:
            return None
        return Stmt([self.rng.choice(INPLACE).format(**self._fields(a))], tag="inplace")

    def linear(self) -> Optional[Stmt]:
        a = self.b.pick(_fnd(1))
        if a is None:
            return None
        t = self.b.value(a)
        name = f"lin{self.b.fresh('')}"
        k = self.rng.choice([1, 4, 8, 16, 32])
        init = [f"self.{name} = nn.Linear({t.shape[-1]}, {k}, bias={self.rng.random() < 0.8})"]
        init += self._extreme_init(name)
        operand = a
        if t.dtype != torch.float32:
            if self.rng.random() < 0.5:
                operand = f"{a}.float()"
            else:
                init.append(f"self.{name}.to({t.dtype})")
        out = self.b.fresh()
        form = self.rng.choice([f"self.{name}({operand})", f"F.linear({operand}, self.{name}.weight)",
                                f"self.{name}({operand}).relu()"])
        return Stmt([f"{out} = {form}"], init=init, tag="linear")

    def _extreme_init(self, name: str) -> List[str]:
        r = self.rng.random()
        if r < 0.08:
            return [f"nn.init.constant_(self.{name}.weight, {self.rng.choice(['1e3', '1e-6', '300.0', '0.0'])})"]
        if r < 0.14:
            return [f"self.{name}.weight.data.mul_({self.rng.choice(['1e4', '1e-4', '-50.0'])})"]
        return []

    def conv(self) -> Optional[Stmt]:
        a = self.b.pick(lambda t: t.is_floating_point() and t.dim() in (3, 4) and t.shape[1] > 0)
        if a is None:
            return None
        t = self.b.value(a)
        r = self.rng
        c = t.shape[1]
        k = r.choice([1, 2, 4, 8, c])
        groups = r.choice([g for g in (1, 2, c) if c % g == 0 and k % g == 0] or [1])
        kernel = r.choice([1, 2, 3])
        kind = "Conv1d" if t.dim() == 3 else "Conv2d"
        padding = r.choice(["0", "1", "'same'"])
        name = f"conv{self.b.fresh('')}"
        init = [f"self.{name} = nn.{kind}({c}, {k}, {kernel}, padding={padding}, groups={groups}, "
                f"bias={r.random() < 0.7})"] + self._extreme_init(name)
        operand = a if t.dtype == torch.float32 else f"{a}.float()"
        return Stmt([f"{self.b.fresh()} = self.{name}({operand})"], init=init, tag="conv")

    def matmul(self) -> Optional[Stmt]:
        a = self.b.pick(_fnd(1))
        if a is None:
            return None
        t = self.b.value(a)
        r = self.rng
        out = self.b.fresh()
        d = t.shape[-1]
        choice = r.randrange(6)
        if choice == 0:
            name = f"w{self.b.fresh('')}"
            scale = r.choice(["1.0", "0.02", "1e3", "1e-4"])
            return Stmt([f"{out} = {a} @ self.{name}.to({a}.dtype)"],
                        init=[f"self.{name} = nn.Parameter(torch.randn({d}, {r.choice([2, 8, 16])}) * {scale})"],
                        tag="matmul")
        if choice == 1 and t.dim() >= 2:
            return Stmt([f"{out} = torch.matmul({a}, {a}.transpose(-1, -2))"], tag="matmul")
        if choice == 2:
            spec = {1: "i,i->", 2: "ij,kj->ik", 3: "bij,bkj->bik", 4: "bhij,bhkj->bhik"}.get(t.dim())
            if spec is None:
                return None
            operands = ", ".join([a] * 2)
            return Stmt([f"{out} = torch.einsum('{spec}', {operands})"], tag="einsum")
        if choice == 3 and t.dim() == 3:
            return Stmt([f"{out} = torch.bmm({a}, {a}.transpose(1, 2))"], tag="bmm")
        if choice == 4 and t.dim() in (3, 4):
            causal = r.random() < 0.5
            return Stmt([f"{out} = F.scaled_dot_product_attention({a}, {a}, {a}, is_causal={causal})"], tag="attention")
        if choice == 5 and t.dim() == 3 and d > 0:
            heads = r.choice([h for h in (1, 2, 4) if d % h == 0])
            name = f"mha{self.b.fresh('')}"
            return Stmt([f"{out}, _ = self.{name}({a}, {a}, {a}, need_weights={r.random() < 0.5})"],
                        init=[f"self.{name} = nn.MultiheadAttention({d}, {heads}, batch_first=True)"], tag="attention")
        return None

    def norm(self) -> Optional[Stmt]:
        a = self.b.pick(_fnd(2))
        if a is None:
            return None
        t = self.b.value(a)
        r = self.rng
        name = f"norm{self.b.fresh('')}"
        out = self.b.fresh()
        eps = r.choice(["1e-5", "1e-12", "0.0", "1e-3", "1e-8"])
        operand = a if t.dtype == torch.float32 else f"{a}.float()"
        choice = r.randrange(6)
        if choice == 0:
            init = [f"self.{name} = nn.LayerNorm({t.shape[-1]}, eps={eps}, elementwise_affine={r.random() < 0.7})"]
        elif choice == 1 and t.dim() in (2, 3, 4):
            kind = "BatchNorm2d" if t.dim() == 4 else "BatchNorm1d"
            init = [f"self.{name} = nn.{kind}({t.shape[1]}, eps={eps})"]
            if r.random() < 0.5:
                init.append(f"self.{name}.running_var.fill_({r.choice(['1e-8', '1e5', '0.0', '1e-30'])})")
            if r.random() < 0.3:
                init.append(f"self.{name}.running_mean.fill_({r.choice(['1e4', '-3.0'])})")
        elif choice == 2 and t.dim() >= 3 and t.shape[1] > 0:
            c = t.shape[1]
            groups = r.choice([g for g in (1, 2, c) if c % g == 0])
            init = [f"self.{name} = nn.GroupNorm({groups}, {c}, eps={eps})"]
        elif choice == 3:
            return Stmt([f"{out} = F.normalize({operand}, dim=-1, eps={eps})"], tag="norm")
        elif choice == 4 and hasattr(nn, "RMSNorm"):
            init = [f"self.{name} = nn.RMSNorm({t.shape[-1]}, eps={eps})"]
        else:
            return Stmt([f"{out} = F.layer_norm({operand}, ({t.shape[-1]},), eps={eps})"], tag="norm")
        return Stmt([f"{out} = self.{name}({operand})"], init=init, tag="norm")

    def embedding(self) -> Optional[Stmt]:
        a = self.b.pick(_int)
        if a is None:
            return None
        rows = self.rng.choice([10, 50, 1000])
        name = f"emb{self.b.fresh('')}"
        return Stmt([f"{self.b.fresh()} = self.{name}({a}.long().clamp(0, {rows - 1}))"],
                    init=[f"self.{name} = nn.Embedding({rows}, {self.rng.choice([4, 8])})"], tag="embedding")

    def container(self) -> Optional[Stmt]:
        a = self.b.pick(_fnd(1))
        if a is None:
            return None
        t = self.b.value(a)
        d = t.shape[-1]
        name = f"seq{self.b.fresh('')}"
        operand = a if t.dtype == torch.float32 else f"{a}.float()"
        out = self.b.fresh()
        if self.rng.random() < 0.5:
            init = [f"self.{name} = nn.Sequential(nn.Linear({d}, 8), nn.ReLU(inplace=True), nn.Linear(8, {d}), "
                    f"nn.Tanh())"]
            return Stmt([f"{out} = self.{name}({operand})"], init=init, tag="container")
        init = [f"self.{name} = nn.ModuleList([nn.Linear({d}, {d}) for _ in range({self.rng.choice([1, 2, 3])})])"]
        fwd = [f"{out} = {operand}", f"for layer in self.{name}:", f"    {out} = layer({out}) + {out}"]
        return Stmt(fwd, init=init, tag="loop")

    def control(self) -> Optional[Stmt]:
        """Data-dependent branches and loops that keep shape and dtype on every path."""
        a = self.b.pick(lambda t: t.is_floating_point() and t.numel() > 0)
        if a is None:
            return None
        r = self.rng
        out = self.b.fresh()
        unary = ["{a} * 2", "{a} - 1", "torch.tanh({a})", "{a}.exp()", "-{a}", "{a} / 65504.0", "{a} * 1e4",
                 "{a}.relu()", "{a}.clone()"]
        e1, e2 = (u.format(a=a) for u in r.sample(unary, 2))
        choice = r.randrange(6)
        if choice == 0:
            cond = r.choice([f"{a}.sum() > 0", f"{a}.abs().max() > 1", f"{a}.shape[0] > 1", f"bool({a}.mean() < 0.5)",
                             f"torch.isfinite({a}).all()", "self.training", f"{a}.numel() % 2 == 0",
                             f"{a}.max().item() > 0.5"])
            fwd = [f"if {cond}:", f"    {out} = {e1}", "else:", f"    {out} = {e2}"]
            tag = "control:if"
        elif choice == 1:
            fwd = [f"{out} = {a}", f"for _ in range({r.choice([1, 3, 8])}):",
                   f"    {out} = {r.choice(unary).format(a=out)}"]
            tag = "control:for"
        elif choice == 2:
            fwd = [f"{out} = {a}", "for _ in range(50):", f"    if {out}.abs().max() <= 1:", "        break",
                   f"    {out} = {out} / 2"]
            tag = "control:while"
        elif choice == 3:
            fwd = [f"{out} = {a}", f"for i in range({a}.shape[0]):", f"    {out} = {out} + {a}[i].sum() * 0.1"]
            tag = "control:for"
        elif choice == 4:
            fwd = ["try:", f"    {out} = torch.linalg.inv({a})", "except RuntimeError:", f"    {out} = {e2}"]
            tag = "control:try"
        else:
            fwd = [f"{out} = {e1} if {a}.sum() > 0 else {e2}"]
            tag = "control:if"
        # both branches must run, whatever the values
        try:
            with _quiet():
                x1 = eval(e1, self.b.ns)
                x2 = eval(e2, self.b.ns)
            if x1.shape != x2.shape or x1.dtype != x2.dtype or x1.shape != self.b.value(a).shape:
                return None
        except Exception:
            return None
        return Stmt(fwd, tag=tag)

    def autocast(self) -> Optional[Stmt]:
        """An op (or two) inside an autocast region, or one of the grad modes."""
        inner = self._op()
        if inner is None:
            return None
        region = self.rng.choice(AUTOCAST)
        fwd = [f"with {region}:"] + ["    " + line for line in inner.fwd]
        if self.rng.random() < 0.3 and "enabled=False" not in region:
            nested = 'torch.autocast("cpu", enabled=False)'
            fwd = [f"with {region}:", f"    with {nested}:"] + ["        " + line for line in inner.fwd]
        return Stmt(fwd, init=inner.init, top=inner.top, tag="autocast")

    def function(self) -> Optional[Stmt]:
        a = self.b.pick(_float)
        if a is None:
            return None
        kind = self.rng.choice(sorted(FUNCTIONS))
        name = f"_{kind.title()}Fn{self.b.fresh('')}"
        top = [textwrap.dedent(FUNCTIONS[kind]).strip().format(name=name)]
        args = f"{a}, {self.rng.choice(CONSTANTS[:12])}" if kind == "scale" else a
        return Stmt([f"{self.b.fresh()} = {name}.apply({args})"], top=top, tag="autograd-function")

    def submodule(self) -> Optional[Stmt]:
        """A block defined at module level, used once or twice (module paths, repeated calls)."""
        a = self.b.pick(_fnd(1))
        if a is None:
            return None
        t = self.b.value(a)
        d = t.shape[-1]
        cls = f"Block{self.b.fresh('')}"
        eps = self.rng.choice(EPSILONS)
        top = [textwrap.dedent(f"""
            class {cls}(nn.Module):
                def __init__(self, d):
                    super().__init__()
                    self.proj = nn.Linear(d, d)
                    self.scale = nn.Parameter(torch.ones(d))
                    self.register_buffer("offset", torch.full((d,), {self.rng.choice(CONSTANTS[:14])}))

                def forward(self, x):
                    h = self.proj(x) * self.scale
                    return h / (h.norm(dim=-1, keepdim=True) + {eps}) + self.offset
        """).strip()]
        name = f"block{self.b.fresh('')}"
        operand = a if t.dtype == torch.float32 else f"{a}.float()"
        out = self.b.fresh()
        fwd = [f"{out} = self.{name}({operand})"]
        if self.rng.random() < 0.4:
            fwd.append(f"{out} = self.{name}({out})")  # the same module called twice
        return Stmt(fwd, init=[f"self.{name} = {cls}({d})"], top=top, tag="submodule")

    def checkpointed(self) -> Optional[Stmt]:
        a = self.b.pick(_fnd(1))
        if a is None:
            return None
        t = self.b.value(a)
        name = f"ck{self.b.fresh('')}"
        operand = a if t.dtype == torch.float32 else f"{a}.float()"
        return Stmt([f"{self.b.fresh()} = torch.utils.checkpoint.checkpoint(self.{name}, {operand}, use_reentrant=False)"],
                    init=[f"self.{name} = nn.Linear({t.shape[-1]}, {t.shape[-1]})"], tag="checkpoint")

    def _op(self) -> Optional[Stmt]:
        ops = [(self.template, 30), (self.linear, 8), (self.conv, 4), (self.matmul, 6), (self.norm, 5),
               (self.embedding, 2), (self.inplace, 5), (self.container, 2), (self.submodule, 2),
               (self.function, 2), (self.checkpointed, 1)]
        fn = self.rng.choices([f for f, _ in ops], [w for _, w in ops])[0]
        return fn()

    def step(self) -> None:
        for _ in range(12):
            r = self.rng.random()
            stmt = self.control() if r < 0.08 else self.autocast() if r < 0.16 else self._op()
            if self.b.try_stmt(stmt):
                return

    # ---------------------------------------------------------------------------- output

    def output(self) -> Tuple[str, List[str], str]:
        """(the return expression, module-level lines it needs, its tag)."""
        r = self.rng
        tensors = [n for n in self.b.vars if isinstance(self.b.ns.get(n), torch.Tensor)]
        if not tensors:
            return r.choice(["None", "3", "'done'", "torch.tensor(1.0)"]), [], "output:no-tensor"
        h = tensors[-1]
        g = r.choice(tensors)
        forms = [
            (f"{h}", [], "tensor"), (f"({h}, {g})", [], "tuple"), (f'{{"out": {h}, "aux": {g}}}', [], "dict"),
            (f"Output({h}, {g})", ["@dataclasses.dataclass\nclass Output:\n    logits: torch.Tensor\n"
                                   "    aux: typing.Any = None"], "dataclass"),
            (f'[{{"a": {h}}}, {{"b": {g}, "n": 3}}]', [], "list-of-dicts"), ("None", [], "none"),
            (f"{h}.sum().item()", [], "python-number"), (f"({h}, None)", [], "tuple-none"),
            (f"{h} * float('nan')", [], "nan"), (f"{h} * 0", [], "zeros"),
            (f"torch.full_like({h}.float(), float('inf'))", [], "inf"),
            (f"Pair({h}, {g})", ["Pair = collections.namedtuple('Pair', ['first', 'second'])"], "namedtuple"),
            (f"{h}.detach().float().numpy()", [], "numpy"), (f"[{h}] * 3", [], "repeated"),
            (f'{{"nested": ({h}, [{g}, "text"])}}', [], "nested"), ("'done'", [], "string"),
            (f"{h}.argmax(-1) if {h}.dim() else {h}", [], "indices"), (f"{h}.bool()", [], "bool"),
            (f"{h}.new_zeros(0)", [], "empty"), (f"{h}.sum()", [], "scalar"),
        ]
        weights = [10, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]
        expr, top, tag = r.choices(forms, weights)[0]
        try:
            with _quiet():
                for line in top:
                    exec(line, self.b.ns)
                eval(expr, self.b.ns)
        except Exception:
            return h, [], "output:tensor"
        return expr, top, f"output:{tag}"

    # ---------------------------------------------------------------------------- the file

    def build(self, n_statements: int) -> Tuple[str, List[str], List[str]]:
        """(the file's text, its tags, flags it needs on the command line)."""
        self.make_inputs()
        for _ in range(n_statements):
            self.step()
        ret, out_top, out_tag = self.output()
        tags = self.b.tags + [out_tag]
        inputs = self.b.inputs
        names = [name for name, _, _ in inputs]
        tops = [line for s in self.b.accepted for line in s.top] + out_top
        init = [line for s in self.b.accepted for line in s.init]
        fwd = [line for s in self.b.accepted for line in s.fwd]
        form, example, flags = self._example_inputs(inputs)
        tags.append(f"inputs:{form}")
        signature = ", ".join(["self"] + (names if form != "kwargs-defaults" else [f"{n}=None" for n in names]))
        cls = self.label
        body = "\n".join("        " + line for line in init) or "        pass"
        forward = "\n".join(textwrap.indent(line, "        ") for line in fwd)
        text = (HEADER + "\n\n" + "\n\n\n".join(tops) + ("\n\n\n" if tops else "")
                + f"class {cls}(nn.Module):\n    def __init__(self):\n        super().__init__()\n{body}\n\n"
                + f"    def forward({signature}):\n{forward}\n        return {ret}\n")
        text += self._model_line(cls, example, tags)
        return text, tags, flags

    def _example_inputs(self, inputs) -> Tuple[str, str, List[str]]:
        r = self.rng
        exprs = [expr for _, expr, _ in inputs]
        names = [name for name, _, _ in inputs]
        tensor_only = all(kind not in ("number", "none", "list", "bool") for _, _, kind in inputs)
        forms = ["tuple", "function", "dict", "pair", "list", "attribute"]
        if len(inputs) == 1 and tensor_only:
            forms.append("tensor")
        flag_inputs = [self._flag(expr) for expr in exprs]
        if inputs and tensor_only and all(flag_inputs) and self.alone:
            forms += ["flags", "flags"]
        form = r.choice(forms)
        if form == "tuple":
            return form, "example_inputs = (" + "".join(f"{e}, " for e in exprs) + ")", []
        if form == "tensor":
            return form, f"example_inputs = {exprs[0]}", []
        if form == "list":
            return form, "example_inputs = [" + ", ".join(exprs) + "]", []
        if form == "dict":
            return "kwargs-defaults", "example_inputs = {" + ", ".join(f'"{n}": {e}' for n, e in zip(names, exprs)) + "}", []
        if form == "pair":
            cut = r.randint(0, len(exprs))
            args = "(" + "".join(f"{e}, " for e in exprs[:cut]) + ")"
            kwargs = "{" + ", ".join(f'"{n}": {e}' for n, e in zip(names[cut:], exprs[cut:])) + "}"
            return form, f"example_inputs = ({args}, {kwargs})", []
        if form == "function":
            return form, ("def example_inputs():\n    torch.manual_seed(0)\n    return ("
                          + "".join(f"{e}, " for e in exprs) + ")"), []
        if form == "attribute":
            return form, "ATTRIBUTE(" + "".join(f"{e}, " for e in exprs) + ")", []
        flags: List[str] = []
        named = False  # positional inputs first, then keywords (as in a call)
        for name, spec in zip(names, flag_inputs):
            draw = r.random()  # drawn for every input, so that other seeds' cases stay as they were
            named = named or draw >= 0.5
            flags += ["--input", f"{name}={spec}" if named else spec]
        return "flags", "", flags

    @staticmethod
    def _flag(expr: str) -> Optional[str]:
        """The --input spelling of an input expression, where there is one."""
        import re

        m = re.fullmatch(r"torch\.randn\(([\d, ]+)\)", expr)
        if m:
            dims = [int(d) for d in m.group(1).split(",") if d.strip()]
            return "x".join(map(str, dims)) if dims and all(dims) else None
        m = re.fullmatch(r"torch\.randint\(0, (\d+), \(([\d, ]+)\)\)", expr)
        if m:
            dims = [d.strip() for d in m.group(2).split(",") if d.strip()]
            return "x".join(dims) + f":int64:0..{m.group(1)}"
        return None

    def _model_line(self, cls: str, example: str, tags: List[str]) -> str:
        r = self.rng
        text = ""
        attribute = example.startswith("ATTRIBUTE(")
        how = r.choice(["class", "class", "instance", "factory"])
        if attribute:
            inner = example[len("ATTRIBUTE("):-1]
            text += f"\n\ndef build():\n    net = {cls}()\n    net.example_input_array = ({inner})\n    return net\n"
            text += "\n\nmodel = build()\n" if how != "factory" else ""
            tags.append("model:attribute")
            self.model_flag = "build" if how == "factory" else None
            return text
        if example:
            text += "\n\n" + example + "\n"
        self.model_flag = None
        if how == "instance":
            text += f"\n\nmodel = {cls}()\n"
        elif how == "factory":
            text += f"\n\ndef make_model():\n    return {cls}()\n"
            self.model_flag = "make_model"
        tags.append(f"model:{how}")
        return text


# ------------------------------------------------------------------------------------ faults

def _inject_fault(rng: random.Random, text: str, flags: List[str]) -> Tuple[str, List[str], str]:
    """A mistake a user makes in a model file or on the command line: the run must end in one line
    on stderr and exit 2 for that model."""
    choice = rng.randrange(8)
    if choice == 0:
        head, sep, tail = text.rpartition("    def forward(self")
        return head + sep + ", needed_argument" + tail, flags, "fault:signature"
    if choice == 1:
        lines = text.splitlines()
        cut = rng.randrange(len(lines))
        return "\n".join(lines[:cut]) + "\n" + lines[cut][: len(lines[cut]) // 2] + "(\n", flags, "fault:syntax"
    if choice == 2:
        return text.replace("        return ", '        raise RuntimeError("the model fails")\n        return ', 1), \
            flags, "fault:raises"
    if choice == 3:
        return text.replace("super().__init__()", 'super().__init__()\n        raise ValueError("cannot build")', 1), \
            flags, "fault:init"
    if choice == 4:
        return text, flags + ["--input", rng.choice(["1x0x3", "abc", "x=", "2x3:float99", "-1x4", "1e400x2"])], \
            "fault:input-flag"
    if choice == 5:
        return text, flags + ["--weights", "missing.pt"], "fault:weights"
    if choice == 6:
        return text + "\nexample_inputs = object()\n", [f for f in flags if f != "--input"], "fault:example-inputs"
    return text.replace("        return ", "        import sys\n        sys.exit(3)\n        return ", 1), flags, \
        "fault:exit"


# ------------------------------------------------------------------------------------ cases

def _flags(rng: random.Random) -> Tuple[List[str], List[str]]:
    argv: List[str] = []
    tags: List[str] = []
    fmt = rng.choice(FORMATS)
    argv += ["--output-format", fmt]
    tags.append(f"format:{fmt}")
    if rng.random() < 0.6:
        modes = rng.sample(PRECISIONS, rng.randint(1, len(PRECISIONS)))
        argv += ["--precision", ",".join(modes)]
        tags += [f"precision:{m}" for m in modes]
    probe = rng.random() < 0.15
    if probe:
        argv += ["--probe", "cpu"]
        tags.append("probe")
        if rng.random() < 0.2:
            argv.append("--ablate")
            tags.append("ablate")
    elif rng.random() < 0.15:
        argv.append("--no-run")
        tags.append("no-run")
    if rng.random() < 0.2:
        argv += ["--capture", "function-mode"]
        tags.append("capture:function-mode")
    if rng.random() < 0.2:
        argv += ["--rtol", rng.choice(["1e-3", "0", "1e-7", "0.5"]), "--atol", rng.choice(["1e-5", "0", "1e-9"])]
        tags.append("tolerance")
    if rng.random() < 0.1:
        argv += ["--select", rng.choice(["ALL", "PCL1", "PCL001,PCL3", "PCL2"])]
    if rng.random() < 0.1:
        argv += ["--fail-on", rng.choice(["info", "warning", "error"])]
    if rng.random() < 0.1:
        argv.append("--exit-zero")
    if rng.random() < 0.1:
        argv += ["--seed", str(rng.choice([1, 7, 2 ** 40]))]
    return argv, tags


def model_case(seed: int) -> Case:
    """The case of ``seed``: one to three generated model files and a command line that checks them."""
    rng = random.Random(f"model-{seed}")
    count = rng.choices([1, 2, 3], [22, 2, 1])[0]
    files: Dict[str, str] = {}
    targets: List[str] = []
    tags: List[str] = ["several"] if count > 1 else []
    input_flags: List[str] = []
    for i in range(count):
        gen = ModelGenerator(rng, seed * 7 + i, label=rng.choice(["Net", "Model", "TinyNet"]), alone=count == 1)
        text, model_tags, flags = gen.build(rng.randint(1, 12))
        tags += model_tags
        name = f"m{seed}_{i}.py"
        files[name] = text
        input_flags += flags
        if gen.model_flag and (count > 1 or rng.random() < 0.5):
            targets.append(f"{name}:{gen.model_flag}")  # FILE.py:NAME
            tags.append("target:file-attr")
        elif gen.model_flag:
            targets.append(name)
            input_flags += ["--model", gen.model_flag]
        else:
            targets.append(name)
    valid = True
    if count == 1 and rng.random() < 0.05:
        name = targets[0].partition(":")[0]
        files[name], input_flags, fault = _inject_fault(rng, files[name], input_flags)
        tags.append(fault)
        valid = False
    if count == 1 and rng.random() < 0.05:
        targets = targets + targets  # the same model twice in one run
        tags.append("same-file-twice")
    flags, flag_tags = _flags(rng)
    tags += flag_tags
    if "probe" in flag_tags and rng.random() < 0.3:
        flags = [f for f in flags if f not in ("--probe", "cpu")] + ["--device", "cpu"]
        flags += ["--top", str(rng.choice([1, 3]))] if rng.random() < 0.5 else []
        argv = ["probe"] + targets + flags
        tags.append("command:probe")
    else:
        argv = ["check"] + targets + flags
    argv += input_flags + ["--timeout", "120"]
    case = Case(name=f"model-{seed}", files=files, argv=argv, tags=sorted(set(tags)), valid=valid)
    # now and then the command line in a process of its own: exit statuses, signals, descriptor 1
    if rng.random() < 0.04:
        case.process = True
        case.tags.append("process")
        if rng.random() < 0.3:
            case.interrupt = rng.choice([0.5, 1.5, 3.0])
            case.tags.append("interrupt")
    return case
