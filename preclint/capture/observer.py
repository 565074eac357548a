"""What a run of the model through capture tells the code that watches it.

Both capture paths (the FX interpreter and the function-mode recorder) run the model op by op and
hand every op to one observer: the reference pass (reference/statistics_pass.py) records its statistics so, and the
probe's passes measure (probe/). For each op the runner calls

    args, kwargs = observer.before(node, args, kwargs, callee)   # the operands the op will run on
    output = observer(node, args, kwargs, callee, output)        # the output the model goes on with

and the function-mode recorder, which names a node only after it ran, then calls
``observer.rename(node, name)``; it asks ``observer.origin(tensor)`` which tensor an operand that
``before`` replaced stands for. When a traced graph fails part-way where the model itself may not,
capture runs the model again eagerly if ``observer.reset()`` can forget the partial run. An observer overrides only the methods it needs: the defaults leave
the run as the model makes it, so ``Observer()`` itself runs the model unwatched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from preclint.core.ir import Node


@dataclass
class Call:
    """One op as the run made it: what an analysis of the reference pass sees of it."""

    args: tuple
    kwargs: Dict[str, Any]
    callee: Any  # the module, function or method name that ran
    outputs: List[Any]  # the tensors it returned, in order


class Observer:
    """Watches each op of a run; may hand the op other operands or the model another output."""

    def before(self, node: Node, args: Any, kwargs: Any, callee: Any) -> Tuple[Any, Any]:
        """The operands ``node`` runs on (by default the model's own)."""
        return args, kwargs

    def __call__(self, node: Node, args: Any, kwargs: Any, callee: Any, output: Any) -> Any:
        """Sees ``node``'s output; returns the output the model goes on with (by default, that one)."""
        return output

    def rename(self, node: Node, name: str) -> None:
        """The recorder named ``node`` after it ran: move what ``before`` kept under its old name
        (by default nothing was kept)."""

    def origin(self, tensor: Any) -> Any:
        """The tensor an operand handed out by ``before`` stands for (by default, itself)."""
        return tensor

    def reset(self) -> bool:
        """Forget a run that failed part-way, for another run from the start; False when this
        observer cannot (the default), and the failure stands."""
        return False
