"""`preclint diff`: its arguments, and the run from the parsed command line to the written output."""
from __future__ import annotations

from preclint.core.errors import UserError
from preclint.core.exitcodes import EXIT_FINDINGS, EXIT_OK
from preclint.report.output import report_destination, write_output_file, write_report

FORMATS = ("full", "json", "sarif", "html")


def add_parser(sub, add_model_arguments, add_output_arguments) -> None:
    diff = sub.add_parser("diff", conflict_handler="resolve",
                          help="why one checkpoint (or one setting) is more fragile than another, layer by layer")
    diff.add_argument("paths", nargs="+", metavar="MODEL",
                      help="a model file (twice the same with two --weights), or two model files of one architecture")
    add_model_arguments(diff)
    diff.add_argument("--weights", metavar="FILE", action="append", default=None,
                      help="a state dict, loaded with torch.load(weights_only=True): once per side")
    diff.add_argument("--against", metavar="SETTING",
                      help="compare the model under --precision with it under SETTING: another precision (fp16, bf16, "
                           "tf32, fp16-full, bf16-full), fp32, or a device (cpu, cuda: the precision on its own kernels)")
    diff.add_argument("--probe", nargs="?", const="auto", choices=("auto", "cuda", "cpu"), metavar="DEVICE",
                      help="measure both ledgers (on a GPU, or emulated on the CPU) instead of comparing predictions; "
                           "the runs compared node by node go to DEVICE too")
    diff.add_argument("--config", metavar="FILE", dest="config_file", help="a pyproject.toml to read [tool.preclint] from")
    diff.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    diff.add_argument("--exit-zero", action="store_true",
                      help="exit 0 even where a side's weights are not valid or its output is inf/NaN")
    add_output_arguments(diff)


def request_of(args):
    from preclint.diff.walk import DiffRequest  # lazy: the plain check loads no probe/measure/plan

    weights = list(args.weights or [])
    if len(weights) > 2:
        raise UserError(f"--weights is given {len(weights)} times: diff compares two checkpoints")
    if args.against is not None:
        return DiffRequest(tuple(args.paths), tuple(weights[:1]) + (None,), args.against)
    padded = tuple(weights + [None] * (2 - len(weights)))
    return DiffRequest(tuple(args.paths), padded)


def cmd_diff(args, use_color: bool) -> int:
    """Run `preclint diff` for the parsed ``args``: 0 once the comparison is written, 1 where a side's
    weights are not valid (inf/NaN, a negative running variance) or its output is inf/NaN under a
    precision compared (unless --exit-zero)."""
    from preclint.config import load_config  # lazy: start-up time: only the commands that use it load it
    from preclint.diff.render import render  # lazy: the plain check loads no probe/measure/plan
    from preclint.diff.walk import check_request, run_diff  # lazy: the plain check loads no probe/measure/plan
    from preclint.engine import CheckOptions, LoadOptions  # lazy: torch-free path

    del use_color  # the console output is plain text
    request = request_of(args)
    check_request(request)
    config = load_config(config_file=args.config_file, isolated=args.isolated)
    config = config.with_flags(precisions=args.precisions, rtol=args.rtol, atol=args.atol, timeout=args.timeout,
                               output_format=args.output_format)
    fmt = args.output_format or "full"
    if fmt not in FORMATS:
        raise UserError(f"diff writes --output-format {', '.join(FORMATS)}")
    inputs = [(w, "a weights file this run loads (--weights)") for w in request.weights if w]
    inputs.append((config.path, "the configuration this run reads"))
    output = report_destination(args.output, fmt, args.paths, inputs)
    precisions = tuple(args.precisions or ["fp16"])
    load = LoadOptions(model=args.model, inputs=args.inputs, input_shapes=args.input_shapes,
                       input_dtype=args.input_dtype, seed=args.seed)
    check = CheckOptions(modes=precisions, rtol=config.rtol, atol=config.atol, capture=args.capture, predict_errors=True)
    probe = None
    if args.probe is not None:
        from preclint.probe import ProbeOptions  # lazy: the plain check loads no probe/measure/plan

        probe = ProbeOptions(device=args.probe, ledger=True)
    result = run_diff(config, load, check, request, probe)
    text = render(result, fmt)
    if output is not None:
        write_output_file(output, text, "report")
    else:
        write_report(text, fmt=fmt)
    return EXIT_FINDINGS if result.fragile() and not args.exit_zero else EXIT_OK


__all__ = ["add_parser", "cmd_diff"]
