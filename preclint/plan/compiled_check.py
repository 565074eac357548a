"""``preclint plan --backend inductor``: the verified plan run compiled, and its float32 decisions
checked in the compiled graph.

A plan that keeps layers in float32 is worth nothing if the compiled graph does not keep them. The
model with the plan applied (preclint.policy, as deployed) is compiled under the plan's precision
and compared with the same float64 reference as the eager verification; each kept unit, and each
float32 decision of the model's own code, is looked up in the compiled graph, and every one whose
ops compute in a reduced format there is named with its source line and the measured effect.
"""
from __future__ import annotations

from typing import Any, Dict, List

from preclint.core.errors import one_line
from preclint.core.findings import sci
from preclint.load.modelio import output_tensors
from preclint.measure.compare import compare
from preclint.measure.compiled import CompiledRunner
from preclint.measure.compilers import backend_named
from preclint.measure.copies import copy_to
from preclint.policy import apply_policy, load_policy
from preclint.probe.compiled import check_sites, kept_sites, module_sites


def verify_compiled(plan, verifier, graph, backend: str) -> None:
    """Run ``plan`` (verified eagerly by ``verifier``) compiled by ``backend``; its figures go in
    ``plan.measured['compiled']`` and its audit in ``plan.measured['compiled_audit']`` and the notes."""
    import torch

    chosen = backend_named(backend)
    reason = chosen.unavailable(verifier.device)
    if reason is not None:
        plan.notes.append(f"not compiled with {backend}: {reason}; the plan is verified eagerly only")
        return
    runner = CompiledRunner(plan.precision, verifier.device, chosen, sets_tf32=False)
    model = apply_policy(copy_to(verifier.model32, verifier.device), load_policy(plan.policy()))
    prepared = runner.adopt(model, verifier.inputs)
    try:
        outputs = output_tensors(runner.run(prepared))
        runner.run(prepared)  # again: a graph compiled now is a recompilation
    except Exception as exc:  # noqa: BLE001 - the eager verification stands; the compiled one is noted
        plan.notes.append(f"the plan did not run compiled with {backend}: {one_line(exc)}")
        return
    finally:
        torch._dynamo.reset()
    compilation = runner.compilation(prepared)
    if compilation.error is not None:
        plan.notes.append(f"the model could not be compiled with {backend} ({compilation.error}): "
                          "the plan is verified eagerly only")
        return
    comparison = compare(outputs, verifier.reference, verifier.tolerance)
    summary = comparison.figure
    sites = module_sites(graph, [(k.module, k.op) for k in plan.keep]) + kept_sites(graph)
    checks, _ = check_sites(compilation.graph.nodes, sites)
    audit: List[Dict[str, Any]] = [c.to_json() for c in checks]
    plan.measured = dict(plan.measured or {})
    plan.measured["compiled"] = summary
    plan.measured["compiled_how"] = runner.how
    plan.measured["compiled_meets"] = comparison.meets
    plan.measured["compilation"] = compilation.summary()
    plan.measured["compiled_audit"] = audit
    eager = plan.measured.get("after")
    shown = f"{sci(summary.rel_error)} (eager with the plan {sci(eager.rel_error) if eager is not None else 'n/a'})"
    plan.notes.append(f"compiled with {backend}: output error {shown}, "
                      f"{'meets' if comparison.meets else 'misses'} the tolerance; {compilation.graphs} graph(s), "
                      f"{sum(compilation.graph_breaks.values())} graph break(s), {compilation.recompiles} "
                      f"recompilation(s), first call {compilation.seconds:.1f} s")
    for check in checks:
        where = f"{check.site.path}:{check.site.line}"
        if check.offending:
            ops = ", ".join(f"{n.original} in {n.dtype}" for n in check.offending[:4])
            plan.notes.append(f"compiled: {check.site.what} at {where} does NOT stay float32 in the compiled graph "
                              f"({ops}); compiled output error {sci(summary.rel_error)}")
        elif check.compiled_ops:
            plan.notes.append(f"compiled: {check.site.what} at {where} stays float32 in the compiled graph "
                              f"({check.compiled_ops} op(s))")
        else:
            plan.notes.append(f"compiled: {check.site.what} at {where} runs outside the compiled graphs "
                              "(a graph break: eagerly, as verified)")
