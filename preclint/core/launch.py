"""Whether a launcher (torchrun) started this process among others, read from the environment
without importing the probe's distributed machinery (probe/distributed.py), which a check does not use.

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK together. A WORLD_SIZE above 1 makes this process one of
several; one that is not a whole number, or a RANK or LOCAL_RANK missing or out of range beside it
(an environment half set by hand, or left over from another job), is a UserError in one line, never
a guess and never a traceback."""
from __future__ import annotations

import os
from typing import Optional, Tuple

from preclint.core.errors import UserError

_HOW = "start preclint with torchrun, or unset WORLD_SIZE to run it as one process"


def _whole(name: str) -> Optional[int]:
    """The whole number in the environment variable ``name``; None when it is unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise UserError(f"the environment sets {name}={text[:40]!r}, which is not a whole number; {_HOW}") from None


def launched() -> bool:
    """Whether torchrun (or another launcher setting WORLD_SIZE) started this process among others."""
    world = _whole("WORLD_SIZE")
    if world is not None and world < 1:
        raise UserError(f"the environment sets WORLD_SIZE={world}; a world has at least one process; {_HOW}")
    return world is not None and world > 1


def launch_ranks() -> Tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) of a process torchrun started (``launched()``): a UserError when
    the environment does not hold all three, or holds them out of range (LOCAL_RANK defaults to RANK)."""
    world = _whole("WORLD_SIZE")
    if world is None or world < 2:
        raise UserError(f"the environment sets no WORLD_SIZE above 1; {_HOW}")
    rank = _whole("RANK")
    if rank is None:
        raise UserError(f"the environment sets WORLD_SIZE={world} but no RANK (torchrun sets both); {_HOW}")
    if not 0 <= rank < world:
        raise UserError(f"the environment sets RANK={rank}, outside the {world} ranks of WORLD_SIZE={world}; {_HOW}")
    local_rank = _whole("LOCAL_RANK")
    if local_rank is None:
        local_rank = rank
    elif local_rank < 0:
        raise UserError(f"the environment sets LOCAL_RANK={local_rank}; a local rank is 0 or more; {_HOW}")
    return rank, world, local_rank
