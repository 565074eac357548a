"""What a rule that needs the reference pass says under --no-run: which sites it could not judge,
rather than a guess either way."""
from __future__ import annotations

from typing import Iterator, Sequence

from preclint.core.findings import Finding


def undecided(rule, ctx, nodes: Sequence, topic: str, needs: str) -> Iterator[Finding]:
    """One info finding naming the candidate sites of ``topic`` (``needs``: what the reference pass
    would have told), or nothing when the graph has none."""
    if not nodes:
        return
    names = ", ".join(ctx.display(n.name) for n in nodes[:3])
    more = f" and {len(nodes) - 3} more" if len(nodes) > 3 else ""
    sites = f"{len(nodes)} site{'s' if len(nodes) > 1 else ''}"
    message = f"Cannot judge {topic} at {sites} ({names}{more}): --no-run skipped the reference pass that gives {needs}."
    yield rule.finding(nodes[0], message, fix="Run without --no-run (the reference pass runs on the CPU).",
                       severity="info", precisions=tuple(ctx.modes))
