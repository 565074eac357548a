"""The units a plan keeps in float32 and what they cost.

A unit is a leaf module (``layer1.0.conv1``) or one op of a module's own forward (``exp`` in
``block``), and, for a cast model (``-full``), what is not a module: the model's inputs
(``<inputs>``: not cast down on entry), its outputs (``<outputs>``: not cast back) and a parameter the
format cannot hold (``<param:layer1.0.bn1.running_var>``). Those three cost no FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.core.numerics import Mode
from preclint.predict.formats import fx_tensor_constant
from preclint.policy import INPUTS, OUTPUTS, PARAM, is_module, param_name

# kinds whose nodes compute nothing a float32 unit would change
NO_ARITHMETIC = frozenset({Kind.INPUT, Kind.OUTPUT, Kind.SHAPE, Kind.CONSTANT, Kind.DECISION, Kind.COMPARE})


@dataclass(frozen=True)
class Unit:
    """A leaf module (``op`` None), or every call of one op in a module's own forward."""

    module: str
    op: Optional[str] = None

    @property
    def label(self) -> str:
        where = self.module or "<root>"
        return where if self.op is None else f"{where}: {self.op}"

    @property
    def is_module(self) -> bool:
        """A module or an op in one, not the inputs, the outputs or a parameter."""
        return is_module(self.module)


INPUTS_UNIT, OUTPUTS_UNIT = Unit(INPUTS), Unit(OUTPUTS)


def param_unit(name: str) -> Unit:
    return Unit(f"{PARAM}{name}>")


def node_flops(node: Node) -> float:
    """Arithmetic of a node: 2 K per output element of a dot product, else one per element it
    reads or writes (elementwise ops, norms, reductions)."""
    if node.kind in NO_ARITHMETIC or not node.outputs:
        return 0.0
    numel = sum(s.numel for s in node.outputs if s.is_float)
    if node.kind in DOT_PRODUCT_KINDS:
        return 2.0 * (node.reduction_length or 1) * numel
    read = sum(s.numel for s in node.input_stats if s is not None and s.is_float)
    return float(max(numel, read))


def is_model_tensor(node: Node) -> bool:
    """A parameter or buffer the model holds (or a view of one), not a tensor its forward creates
    (fx_tensor_constant)."""
    return node.fn == "parameter" and bool(node.params) and not fx_tensor_constant(node) \
        and not (_FX_CONSTANT in node.params[0] and not node.attrs.get("view_of"))


_FX_CONSTANT = "_tensor_constant"


def promotes(graph: Graph, node: Node, modules_cast: bool = False, formats: Optional[Dict[str, str]] = None) -> bool:
    """Whether every op that reads the tensor (through views and indexing) promotes a float32
    operand by type promotion (elementwise ops, reductions): then keeping the tensor alone in
    float32 runs in a cast model. A dot product or a module call (F.linear, a conv) would refuse a
    float32 weight beside low activations, unless its other operands are float32 too (``formats``:
    each node's format in the cast model, a position table made in float32 by the forward).
    ``modules_cast``: a module call reads it anyway (a layer of the cast model casts a float32
    input to its own dtype, as apply_policy makes it)."""
    readers: Dict[str, List[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    frontier, seen, chain = [node.name], set(), {node.name}
    while frontier:
        name = frontier.pop()
        for reader in readers.get(name, []):
            if reader.name in seen:
                continue
            seen.add(reader.name)
            if reader.target.startswith("nn."):
                if modules_cast:
                    continue
                return False
            if reader.kind in DOT_PRODUCT_KINDS or reader.fn in NO_PROMOTION:
                others = [i for i in reader.inputs if i not in chain and graph.get(i) is not None
                          and graph[i].out is not None and graph[i].out.is_float]
                if formats is None or any(formats.get(i) != "fp32" for i in others):
                    return False
            if reader.kind == Kind.SHAPE:
                frontier.append(reader.name)
                chain.add(reader.name)
    return True


# ops that take their operands' dtypes as given instead of promoting them
NO_PROMOTION = frozenset({"linear", "conv1d", "conv2d", "conv3d", "matmul", "bmm", "mm", "einsum", "addmm", "baddbmm",
                           "layer_norm", "group_norm", "batch_norm", "embedding", "scaled_dot_product_attention"})


def tensor_name(node: Node) -> str:
    """The model's name of the parameter or buffer a parameter node reads."""
    return node.attrs.get("view_of") or node.params[0]


def unit_of(node: Node, mode: Optional[Mode] = None) -> Unit:
    """The unit that keeps ``node``; in a cast model an input or a parameter is its own unit."""
    cast_model = mode is not None and not mode.autocast
    if cast_model and node.kind == Kind.INPUT:
        return INPUTS_UNIT
    if cast_model and is_model_tensor(node):
        return param_unit(tensor_name(node))
    if node.target.startswith("nn.") or node.fn == "parameter":
        return Unit(node.module_path)
    return Unit(node.module_path, node.fn)


def module_within(path: str, outer: str) -> bool:
    if not is_module(path) or not is_module(outer):
        return path == outer
    return outer == "" or path == outer or path.startswith(outer + ".")


def unit_nodes(graph: Graph, unit: Unit) -> List[str]:
    if unit == INPUTS_UNIT:
        return [n.name for n in graph.nodes if n.kind == Kind.INPUT]
    if param_name(unit.module) is not None:
        return [n.name for n in graph.nodes if is_model_tensor(n) and tensor_name(n) == param_name(unit.module)]
    if not unit.is_module:  # <outputs>: no node, the cast back at the output (Planner._cast_back)
        return []
    if unit.op is None:
        return [n.name for n in graph.nodes if n.kind not in (Kind.INPUT, Kind.OUTPUT) and module_within(n.module_path, unit.module)]
    return [n.name for n in graph.nodes
            if n.module_path == unit.module and n.fn == unit.op and not n.target.startswith("nn.")]


def parent(unit: Unit) -> Optional[Unit]:
    """The module around a unit: an op's own module, a module's parent; None above the root (and
    for the inputs, the outputs and a parameter)."""
    if not unit.is_module:
        return None
    if unit.op is not None:
        return Unit(unit.module)
    if unit.module == "":
        return None
    return Unit(unit.module.rpartition(".")[0])
