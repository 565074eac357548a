"""The IR: the one contract that every capture path produces and every rule and the probe read.

A Graph is the ordered list of Nodes a model executes. A Node is one operation at the level a user
wrote it: a leaf module call (``layer1.0.conv2``), a torch function (``torch.softmax``), a tensor
method (``x.mean``) or an operator (``x + y``). Its statistics come from the reference pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Type, TypeVar

from preclint.core.findings import Location
from preclint.core.notes import Note


class Kind:
    """Op kinds. Rules and the error model dispatch on these, never on capture-specific targets."""

    INPUT = "input"
    OUTPUT = "output"
    CONV = "conv"  # convolution, transposed convolution
    LINEAR = "linear"  # nn.Linear, F.linear, addmm
    MATMUL = "matmul"  # matmul, mm, bmm, einsum, baddbmm, sdpa
    BATCHNORM = "batchnorm"  # BatchNorm*, FrozenBatchNorm2d, F.batch_norm
    NORM = "norm"  # layer_norm, group_norm, instance_norm, rms_norm, normalize
    SOFTMAX = "softmax"  # softmax, log_softmax
    REDUCTION = "reduction"  # sum, mean, var, std, prod, norm, logsumexp
    SCAN = "scan"  # cumsum, cumprod, logcumsumexp
    ELEMENTWISE = "elementwise"  # add, mul, div, sub, pow, exp, log, sqrt, rsqrt, clamp, where, ...
    ACTIVATION = "activation"  # relu, gelu, silu, sigmoid, tanh, hardswish, ...
    POOL = "pool"  # max/avg pooling, adaptive pooling
    RESAMPLE = "resample"  # interpolate, upsample, grid_sample, roi_align
    DECISION = "decision"  # argmax, argmin, topk, sort, argsort, max/min with indices, nms
    COMPARE = "compare"  # gt, lt, ge, le, eq, ne (thresholds)
    CAST = "cast"  # .float(), .half(), .to(dtype), .long(), round, floor, ...
    CONSTANT = "constant"  # arange, zeros, ones, full, tensor creation
    SHAPE = "shape"  # view, reshape, permute, cat, stack, getitem, flatten, ... (no arithmetic)
    OTHER = "other"


DOT_PRODUCT_KINDS = frozenset({Kind.CONV, Kind.LINEAR, Kind.MATMUL})


@dataclass(frozen=True)
class AutocastRegion:
    """An autocast state the model's own code sets around the ops inside it: ``torch.autocast(...,
    enabled=False)``, ``torch.autocast(..., dtype=...)``, or the forward of a custom autograd
    function that ``torch.amp.custom_fwd(cast_inputs=...)`` runs with autocast off. Regions nest
    (``outer``); a node outside every region has none, and the precision mode alone decides."""

    enabled: bool
    dtype: Optional[str] = None  # the dtype an enabled region lowers to ("float16"); None: the enclosing one's
    cast_inputs: Optional[str] = None  # custom_fwd: float inputs from outside are cast to it where autocast is on
    outer: Optional["AutocastRegion"] = None
    serial: int = 0  # which region this is, in the order the code entered them

    def encloses(self, other: Optional["AutocastRegion"]) -> bool:
        """Whether ``other`` is this region or lies inside it."""
        while other is not None:
            if other.serial == self.serial:
                return True
            other = other.outer
        return False


@dataclass
class TensorStats:
    """Statistics of one tensor value from the reference pass (fp32 on the CPU)."""

    shape: Tuple[int, ...]
    dtype: str
    numel: int
    absmax: float = 0.0
    rms: float = 0.0
    absmin_nonzero: float = float("inf")  # smallest nonzero magnitude; inf when all are zero
    finite: bool = True
    integer_valued: bool = False  # every element is a whole number (positions, counts, boxes)

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float") or self.dtype.startswith("bfloat")


# Records: what one analysis (preclint/reference/analyses/) finds out about a node, stored on it by
# type (``node.put(record)``, read with ``node.record(Type)``). Each record type is declared beside
# the analysis that writes it. A node has a record only where its analysis ran and had something to say.


R = TypeVar("R")


@dataclass
class Node:
    name: str
    kind: str
    target: str  # readable target: "nn.Conv2d", "torch.matmul", "Tensor.mean", "operator.add"
    fn: str = ""  # canonical op name shared by every capture path: "conv2d", "batch_norm", "mean", "add"
    module_path: str = ""  # the module that owns the op ("layer1.0.conv2"); "" for the root
    module_type: str = ""  # class name of that module ("Conv2d", "FrozenBatchNorm2d")
    location: Optional[Location] = None  # the line that made the op: the user's, or a library's (torchvision)
    # the model's frames that led to the op, innermost first (location is the first): the user's line
    # that calls into a library is further out; torch's and preclint's own frames are left out
    stack: Tuple[Location, ...] = ()
    inputs: Tuple[str, ...] = ()  # names of the nodes whose tensors this node reads
    scalars: Dict[str, float] = field(default_factory=dict)  # scalar arguments (eps, value, exponent)
    attrs: Dict[str, Any] = field(default_factory=dict)  # groups, kernel_size, stride, dim, ...
    params: Tuple[str, ...] = ()  # qualified names of the parameters and buffers it reads
    reduction_length: Optional[int] = None  # K of a dot product, N of a reduction or scan
    groups: Optional[int] = None
    # reference pass
    outputs: List[TensorStats] = field(default_factory=list)
    input_stats: List[Optional[TensorStats]] = field(default_factory=list)  # stats of each input, in order
    autocast: Optional[AutocastRegion] = None  # the innermost autocast region the model's code set around it
    records: Dict[type, Any] = field(default_factory=dict)  # record type -> the analysis's record (see above)

    def record(self, kind: Type[R]) -> Optional[R]:
        """This node's record of type ``kind`` (Gains, Terms, ...); None where its analysis did not run
        or had nothing to say about the node."""
        return self.records.get(kind)

    def put(self, record: Any) -> None:
        """Store an analysis's record (one of each type)."""
        self.records[type(record)] = record

    @property
    def out(self) -> Optional[TensorStats]:
        return self.outputs[0] if self.outputs else None


@dataclass
class Graph:
    nodes: List[Node]
    model_name: str
    capture: str  # "fx" or "function-mode" (the fallback), see capture.py
    source_path: Optional[str] = None  # the model file, for locations
    ran_reference: bool = False  # False with --no-run: rules must not rely on statistics
    notes: List[Note] = field(default_factory=list)  # why a fallback was used, etc.
    first_nonfinite: Optional[str] = None  # the first node whose fp32 reference value is inf or NaN
    param_stats: Dict[str, TensorStats] = field(default_factory=dict)  # qualified name -> stats
    module_attrs: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # module path -> attributes rules need
    fx_graph: Any = None  # the traced torch.fx.Graph (FX capture only): the probe re-runs it on copies of the model
    analyses: Tuple[type, ...] = ()  # the analyses (preclint.reference.analyses) that ran: their records are on the nodes
    output_paths: Tuple[str, ...] = ()  # each tensor the model returns, as indexed: "[0]", "['logits']", ".boxes"

    def computed(self, records) -> bool:
        """Whether the analyses writing each of ``records`` ran (a node without one then has nothing
        to record, rather than not having been looked at)."""
        written = {a.record for a in self.analyses}
        return all(r in written for r in records)

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, name: str) -> Node:
        return self._by_name[name]

    def get(self, name: str) -> Optional[Node]:
        return self._by_name.get(name)

    def users(self, name: str) -> List[Node]:
        return [n for n in self.nodes if name in n.inputs]

    @property
    def output_nodes(self) -> List[Node]:
        return [n for n in self.nodes if n.kind == Kind.OUTPUT]
