"""Argument parsing and exit codes. Everything else lives in the modules this one calls.

Exit codes: 0 no finding at or above --fail-on; 1 findings; 2 usage, input or internal error (or a
model that could not be checked, or a source-only run that checked no file); 130 / 143 interrupted by SIGINT / SIGTERM; 141 the reader of stdout
went away.
"""
from __future__ import annotations

import argparse
import io
import math
import os
import signal
import sys
import traceback
from typing import List, Optional, Sequence

from preclint import __version__
from preclint.core.errors import UserError, one_line
from preclint.core.exitcodes import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, exit_code
from preclint.core.choices import PROBE_BACKEND_CHOICES as PROBE_BACKENDS
from preclint.core.choices import PROBE_DEVICE_CHOICES as PROBE_DEVICES
from preclint.core.numerics import DEFAULT_MODES, MODES, scaling_value
from preclint.report.formats import help_text as output_format_help
from preclint.rules import installed_pack_rules, all_rules
from preclint.report.formats import names as output_format_names
from preclint.capture.usercode import interrupt_signals, Interrupted
from preclint.core import progress
from preclint.diff.command import add_parser as add_diff_parser
from preclint.load import processes
from preclint.load.interrupts import interrupts_deferred, say_interrupted
from preclint.report import render_reports
from preclint.report.output import report_destination, run_inputs, write_output_file, write_report


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, as for every usage error
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _codes(text: str) -> List[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _precisions(text: str) -> List[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _scaling_option(text: str):
    option, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError(f"expected OPTION=VALUE, not {text!r}")
        scaling_value(option.strip(), value.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return option.strip(), value.strip()


def _seed(text: str) -> int:
    """A seed torch.manual_seed takes: a whole number from -2**63 to 2**64 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if not -(2 ** 63) <= value < 2 ** 64:
        raise argparse.ArgumentTypeError(f"{text} is out of range (from -2**63 to 2**64 - 1)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0 (0: no limit), not {text!r}")
    return value


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="NAME", help="the model in the file: a class, a factory or an instance")
    p.add_argument("--input", metavar="[NAME=]SHAPE[:DTYPE[:VALUES]]", action="append", dest="inputs",
                   help="one input, drawn at random; named inputs are keywords, e.g. 1x3x224x224, "
                        "input_ids=1x128:int64, attention_mask=1x128:int64:1 (VALUES: a number every element "
                        "takes, or LOW..HIGH); integer inputs stay below the rows of the embedding that reads "
                        "them; repeat for each input")
    p.add_argument("--input-shape", metavar="SHAPE", action="append", dest="input_shapes",
                   help="shape of one positional input, e.g. 1,3,224,224 (repeat for each input)")
    p.add_argument("--input-dtype", metavar="DTYPE", default="float32",
                   help="dtype of --input-shape inputs, and of --input inputs that name none")
    p.add_argument("--weights", metavar="FILE", help="a state dict, loaded with torch.load(weights_only=True)")
    p.add_argument("--seed", type=_seed, default=0, help="seed for random init and random inputs (default 0)")
    p.add_argument("--precision", metavar="MODES", type=_precisions, dest="precisions",
                   help=f"comma-separated: {', '.join(MODES)} (default {','.join(DEFAULT_MODES)}); "
                        "fp32 is float32 itself (TF32 off) against float64")
    p.add_argument("--scaling", metavar="OPTION=VALUE", action="append", type=_scaling_option,
                   help="a choice of the FP8/MX/NVFP4 recipes: format=e4m3|e5m2, power-of-two=true|false, "
                        "amax-epsilon=1e-12, fast-accum=true|false, keep=GLOB[,GLOB] (layers kept in bfloat16); "
                        "repeat for each (defaults: torchao's; docs/fp8.md)")
    p.add_argument("--rtol", type=float, help="relative tolerance the outputs are compared with (enables PCL001)")
    p.add_argument("--atol", type=float, help="absolute tolerance the outputs are compared with (enables PCL001)")
    p.add_argument("--capture", choices=("fx", "function-mode"), help="force a capture path instead of FX first")
    p.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                   help="give up on a model that takes longer to load, capture and run (default 600; 0: no limit)")


def _add_selection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--select", type=_codes, help="rule codes or prefixes to enable (or ALL)")
    p.add_argument("--ignore", type=_codes, help="rule codes or prefixes to disable")
    p.add_argument("--extend-select", type=_codes, help="rule codes or prefixes to enable in addition")
    p.add_argument("--fail-on", choices=("info", "warning", "error"),
                   help="lowest severity that makes the exit code 1 (default warning)")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    p.add_argument("--config", metavar="FILE", dest="config_file", help="a pyproject.toml to read [tool.preclint] from")
    p.add_argument("--isolated", action="store_true", help="ignore every configuration file")


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output-format", choices=output_format_names(), help=output_format_help())
    p.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars on stderr")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def _add_train_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", action="store_true",
                   help="also check one training step: the file gives loss_fn and example_targets (or a model that "
                        "returns its loss) and make_optimizer(params), optionally a GradScaler; a Lightning module "
                        "gives its training_step and configure_optimizers, the file an example_batch (docs/training.md)")
    p.add_argument("--steps", type=_positive, metavar="N", default=0,
                   help="with --train and --probe: run N steps of each precision beside float32 and report where "
                        "its loss parts from float32's")


def _add_backend_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=PROBE_BACKENDS, default="eager",
                   help="with the probe: also measure the model compiled (inductor: torch.compile on the probe's "
                        "device) against the same float64 reference, and audit the compiled graph's precision")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="preclint", description="A precision linter for PyTorch models.")
    parser.add_argument("-V", "--version", action="version", version=f"preclint {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    check = sub.add_parser("check", help="report precision risks of a model, with predicted errors")
    check.add_argument("paths", nargs="+", metavar="PATH", help="a model file or package.module:attr")
    _add_model_arguments(check)
    check.add_argument("--no-run", action="store_true",
                       help="skip the reference pass (for models too large for the CPU)")
    _add_selection_arguments(check)
    check.add_argument("--source-only", action="store_true",
                       help="only the source rules (PCL5xx) over files and directories; never imports torch or the code "
                            "(a run that finds no file to check exits 2)")
    check.add_argument("--fix", action="store_true", help="apply the safe fixes (with --source-only)")
    check.add_argument("--diff", action="store_true", help="print the fixes as a diff instead of writing them")
    check.add_argument("--unsafe-fixes", action="store_true",
                       help="with --fix or --diff: also the fixes that may change behaviour (review them)")
    check.add_argument("--no-cache", action="store_true",
                       help="with --source-only: neither read nor write the cache of unchanged files' results")
    check.add_argument("--force-exclude", action=argparse.BooleanOptionalAction, default=None,
                       help="with --source-only: apply exclude (and the default excludes, build/ and the like) to "
                            "the files named too, as a walk does (pre-commit names every staged file)")
    check.add_argument("--baseline", metavar="FILE", help="hide the findings recorded in FILE (see --write-baseline)")
    check.add_argument("--write-baseline", metavar="FILE", help="record the current findings in FILE and exit 0")
    check.add_argument("--probe", nargs="?", const="auto", choices=PROBE_DEVICES, metavar="DEVICE",
                       help="measure every finding on a GPU (cuda) or emulated on the CPU (cpu); auto (the default "
                            "DEVICE) picks the GPU when there is one")
    check.add_argument("--ablate", action="store_true",
                       help="with --probe: check the measured contributions against one-layer-at-a-time runs (small models)")
    check.add_argument("--stream", action="store_true",
                       help="with --probe: bring the model to the device one block (layer, stage) at a time; the default "
                            "when its copies do not fit there")
    check.add_argument("--reference-device", metavar="DEVICE",
                       help="with --probe: the expected outputs produced on DEVICE (cpu, cuda, cuda:N): float32 there "
                            "against float32 on the probe's device, each against float64 (the same device: its other "
                            "kernels)")
    _add_train_argument(check)
    _add_output_arguments(check)

    _add_backend_argument(check)
    probe = sub.add_parser("probe", help="measure every layer's error per precision: the full per-layer ledger")
    probe.add_argument("paths", nargs="+", metavar="PATH", help="a model file or package.module:attr")
    _add_model_arguments(probe)
    probe.add_argument("--device", dest="probe", choices=PROBE_DEVICES, default="auto",
                       help="cuda runs the precisions on the GPU, cpu emulates them; auto (default) picks the GPU if any")
    probe.add_argument("--ablate", action="store_true",
                       help="check the measured contributions against one-layer-at-a-time runs (small models)")
    probe.add_argument("--stream", action="store_true",
                       help="bring the model to the device one block (layer, stage) at a time; the default when its "
                            "copies do not fit there")
    _add_backend_argument(probe)
    probe.add_argument("--reference-device", metavar="DEVICE",
                       help="the expected outputs produced on DEVICE (cpu, cuda, cuda:N): float32 there against float32 "
                            "on --device, each against float64 (the same device: its other kernels)")
    probe.add_argument("--top", type=_positive, metavar="N",
                       help="per precision, only the N nodes with the largest share of the output error, and the totals")
    _add_selection_arguments(probe)
    _add_train_argument(probe)
    _add_output_arguments(probe)
    # `probe` is `check --probe` with the ledger of every node in its report
    probe.set_defaults(no_run=False, source_only=False, fix=False, diff=False, baseline=None, write_baseline=None,
                       no_cache=False, unsafe_fixes=False,
                       ledger=True)

    from preclint.plan.arguments import add_parser as add_plan_parser  # lazy: the plain check loads no probe/measure/plan

    add_plan_parser(sub, _add_model_arguments, _add_output_arguments)

    add_diff_parser(sub, _add_model_arguments, _add_output_arguments)

    rule = sub.add_parser("rule", help="show a rule's documentation")
    rule.add_argument("code", nargs="?", help="a rule code such as PCL103")
    rule.add_argument("--all", action="store_true", help="every rule")
    rule.add_argument("--debug", action="store_true")
    return parser


def _load_options(args):
    from preclint.engine import LoadOptions  # lazy: torch-free path

    return LoadOptions(model=args.model, inputs=args.inputs, input_shapes=args.input_shapes,
                       input_dtype=args.input_dtype, weights=args.weights, seed=args.seed,
                       train=getattr(args, "train", False))


def _config(args):
    from preclint.config import load_config  # lazy: start-up time: only the commands that use it load it

    config = load_config(config_file=args.config_file, isolated=args.isolated)
    return config.with_flags(select=args.select, ignore=args.ignore, extend_select=args.extend_select,
                             precisions=args.precisions, rtol=args.rtol, atol=args.atol, fail_on=args.fail_on,
                             output_format=args.output_format, timeout=args.timeout,
                             scaling=dict(args.scaling) if getattr(args, "scaling", None) else None,
                             force_exclude=getattr(args, "force_exclude", None))


def _use_color(args) -> bool:
    if args.color == "always":
        return True
    if args.color == "never" or os.environ.get("NO_COLOR"):
        return False
    return sys.stdout is not None and sys.stdout.isatty()


def cmd_check(args) -> int:
    from preclint.source.command import check_baseline_arguments  # lazy: start-up time: only the commands that use it load it

    config = _config(args)
    _check_output(args, config.output_format, config.path)
    if args.source_only:
        from preclint.source.command import run_source_only  # lazy: start-up time: only the commands that use it load it

        buffer = io.StringIO() if args.output else None
        code = run_source_only(args.paths, config, fix=args.fix, diff=args.diff, baseline=args.baseline,
                               write_baseline=args.write_baseline, exit_zero=args.exit_zero,
                               color=_use_color(args) and not args.output, out=buffer,
                               cache=not args.no_cache, unsafe_fixes=args.unsafe_fixes)
        if buffer is not None:
            _write_output(args.output, buffer.getvalue())
        return code
    if args.fix or args.diff:
        raise UserError("--fix and --diff apply the fixes of source rules: use them with --source-only")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UserError("the graph check needs torch in this environment (pip install torch torchvision); "
                        "--source-only works without it")
    _import_torch()  # here, not on a model's clock

    probe = _probe_options(args, every_node=config.output_format == "html")

    check_baseline_arguments(args.baseline, args.write_baseline, args.paths, inputs=run_inputs(args, config.path))
    return _check_all(args, config, probe)


def _check_all(args, config, probe) -> int:
    from preclint.engine import CheckOptions, Session  # lazy: torch-free path
    from preclint.source.command import apply_baseline_to_reports  # lazy: start-up time: only the commands that use it load it

    # (the probe compares the predicted errors with its measurements, and the HTML page draws them
    # for every layer: both need them whatever the selected rules read)
    options = CheckOptions(modes=tuple(config.precisions), run=not args.no_run, rtol=config.rtol, atol=config.atol,
                           capture=args.capture, predict_errors=probe is not None or config.output_format == "html",
                           train=args.train, steps=args.steps)
    if args.steps and not (args.train and probe is not None):
        raise UserError("--steps measures a trajectory of training steps: use it with --train and --probe")
    if args.train and args.no_run:
        raise UserError("--train runs a training step; it cannot be combined with --no-run")
    session = Session(config, load=_load_options(args), check=options, probe=probe,
                      warn=_debug_warning if args.debug else None)
    if session.distributed:  # torchrun: rank 0 checks and writes the report, the other ranks measure the modes
        if probe is None:
            raise UserError("under torchrun preclint measures with the probe: run `probe`, or `check --probe`")
        if args.baseline or args.write_baseline:
            raise UserError("--baseline and --write-baseline are for one process: run them without torchrun")
    with session:
        measuring = not session.reports_here  # under torchrun, a rank other than 0: rank 0 writes the report
        if measuring:
            _silence_stdout()
        reports = session.check_each(args.paths, on_error=lambda exc: _report_error(exc, args.debug))
    if measuring:
        return EXIT_OK
    for report in reports:
        report.ledger_top = getattr(args, "top", None)
    failed = [r for r in reports if r.error is not None]
    if args.baseline or args.write_baseline:
        written = apply_baseline_to_reports(reports, args.baseline, args.write_baseline)
        if args.write_baseline and not written:
            sys.stderr.write(_console_line(f"preclint: error: {args.write_baseline} was left as it was: a baseline "
                                           "written now would miss the findings of the models that could not be checked"))
    text = render_reports(reports, config.output_format, color=_use_color(args) and not args.output)
    if args.output:
        _write_output(args.output, text)
    else:
        write_report(text, fmt=config.output_format)
    if failed:
        return EXIT_ERROR
    return exit_code([f for r in reports for f in r.findings], config.fail_on, args.exit_zero or bool(args.write_baseline))


def cmd_plan(args) -> int:
    from preclint.config import load_config  # lazy: start-up time: only the commands that use it load it
    from preclint.engine import CheckOptions, PlanOptions, Session  # lazy: torch-free path
    from preclint.plan.command import render_plan  # lazy: the plain check loads no probe/measure/plan

    config = load_config(config_file=args.config_file, isolated=args.isolated)
    config = config.with_flags(rtol=args.rtol, atol=args.atol, max_flip=args.max_flip, timeout=args.timeout,
                               output_format=args.output_format,
                               scaling=dict(args.scaling) if getattr(args, "scaling", None) else None)
    formats = ()
    if args.formats is not None:
        from preclint.plan.formats import parse_formats  # lazy: the plain check loads no probe/measure/plan

        if args.precisions:
            raise UserError("--formats chooses the formats itself: give it without --precision")
        formats = tuple(parse_formats(args.formats))
    modes = [f for f in formats if f != "bf16"] or args.precisions or ["fp16"]
    options = CheckOptions(modes=tuple(modes), rtol=config.rtol, atol=config.atol, capture=args.capture)
    session = Session(config, load=_load_options(args), check=options,
                      plan=PlanOptions(verify=not args.no_verify, device=args.device, policy_file=args.policy,
                                       backend=args.backend, formats=formats))
    fmt = args.output_format or "full"
    if fmt not in ("full", "json", "html"):
        raise UserError("plan writes --output-format full, json or html")
    output = report_destination(getattr(args, "output", None), fmt, args.paths, run_inputs(args, config.path))
    report, plan = session.plan(args.paths[0])
    text = render_plan(report, plan, fmt, _use_color(args) and output is None)
    if output is not None:
        _write_output(output, text)
    else:
        write_report(text, fmt=fmt)
    return EXIT_OK if plan.meets_tolerance else EXIT_FINDINGS


def _check_output(args, fmt: str, config_path: Optional[str]) -> None:
    """Mistakes in --output, found before any model runs; an HTML page is not printed on a terminal."""

    args.output = report_destination(args.output, fmt, args.paths, run_inputs(args, config_path))


def _write_output(filename: str, text: str) -> None:
    write_output_file(filename, text, "report")


def _probe_options(args, every_node: bool = False):
    """The probe's options for `check --probe` and `probe`, or None without a probe; ``every_node``:
    the report shows every node's measurements (the ledger), as `probe` and the HTML page do."""
    device = getattr(args, "probe", None)
    if device is None:
        if args.ablate:
            raise UserError("--ablate checks the probe's measured contributions: use it with --probe")
        if args.stream:
            raise UserError("--stream streams the model through the probe's device: use it with --probe")
        if getattr(args, "backend", "eager") != "eager":
            raise UserError("--backend measures the compiled model beside eager with the probe: use it with --probe")
        if getattr(args, "reference_device", None):
            raise UserError("--reference-device compares float32 across devices in the probe: use it with --probe")
        return None
    if args.no_run:
        raise UserError("--probe measures against the reference pass that --no-run skips: use one of them")
    from preclint.probe import ProbeOptions  # lazy: the plain check loads no probe/measure/plan

    return ProbeOptions(device=device, ablate=args.ablate, ledger=getattr(args, "ledger", False) or every_node,
                        stream=True if args.stream else None, backend=getattr(args, "backend", "eager"),
                        reference_device=getattr(args, "reference_device", None))


def cmd_rule(args) -> int:
    rules = all_rules()
    if args.all:
        write_report("\n".join(rules[code].documentation() for code in sorted(rules)))
        return EXIT_OK
    if not args.code:
        raise UserError("give a rule code (e.g. preclint rule PCL101) or --all")
    code = args.code.upper()
    if code not in rules:
        by_name = {r.name: r for r in rules.values()}
        if args.code in by_name:
            code = by_name[args.code].code
        else:
            raise UserError(f"unknown rule {args.code!r} (known: {', '.join(sorted(rules))})")
    write_report(rules[code].documentation())
    return EXIT_OK


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _report_error(exc: Exception, debug: bool) -> str:
    """Print the one line for an error (after its traceback, with --debug); return the error as a
    report states it."""
    if debug:
        traceback.print_exc()
    if isinstance(exc, UserError):
        message = str(exc)
        sys.stderr.write(_console_line(f"preclint: error: {message}"))
    else:  # a bug in preclint: still one line unless --debug
        message = f"internal error: {one_line(exc)}"
        sys.stderr.write(_console_line(f"preclint: {message} (run with --debug for the traceback)"))
    return message


def _debug_warning(warning: str) -> None:
    sys.stderr.write(_console_line(f"preclint: debug: warning: {warning}"))


def _console_line(text: str) -> str:
    """A line for stderr: the names in it (paths, modules, the model's own messages) shown with
    escapes, so that it stays one line that no terminal acts on and no CI runner reads as a command."""
    from preclint.report.escape import console_line  # lazy: start-up time: only the commands that use it load it

    return console_line(text) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``preclint`` command; ``argv`` None means the process's own arguments (the program itself)."""

    if argv is None:  # the command's own process: what the model's code starts ends with it
        processes.take_charge()
        from preclint.load.allocator import keep_freed_memory  # lazy: start-up time: only the commands that use it load it

        keep_freed_memory()  # freed temporaries are reused, not faulted in again (load/allocator.py)
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # a SIGINT before or after preclint's handler (parsing, the report's end)
        code = say_interrupted(signal.SIGINT)
    finally:
        if argv is None:
            processes.end_descendants()  # a child holding stdout would keep `preclint ... | cat` waiting
    if argv is None:
        from preclint.capture.usercode import end_process  # lazy: looked up at each call, so that it can be replaced

        end_process(code)  # the exit code is preclint's: no exit handler of the model's code runs after it
    return code


def _import_torch() -> None:
    """torch (with numpy) is imported whole or not at all: an interrupt waits until it is in."""

    with interrupts_deferred():
        import preclint.load.loader  # noqa: F401  # lazy: torch-free path (it imports torch)


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors (already printed on one line)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = getattr(args, "debug", False)

    progress.enable(progress.wanted(getattr(args, "quiet", False)))
    try:
        os.getcwd()
    except FileNotFoundError:
        sys.stderr.write("preclint: error: the working directory no longer exists; cd to one that does\n")
        return EXIT_ERROR
    with interrupt_signals():
        try:
            installed_pack_rules()  # a broken or clashing rule pack: one line before anything runs
            if args.command in ("check", "probe"):
                return cmd_check(args)
            if args.command == "rule":
                return cmd_rule(args)
            if args.command == "plan":
                _import_torch()
                return cmd_plan(args)
            if args.command == "diff":
                from preclint.diff.command import cmd_diff  # lazy: torch-free path

                _import_torch()
                return cmd_diff(args, _use_color(args))
            raise UserError(f"unknown command {args.command}")
        except Interrupted as exc:  # SIGINT, SIGTERM: the shell's convention, 128 + the signal number
            return say_interrupted(exc.signum)
        except BrokenPipeError:  # the reader left (`| head`): quietly, as a process ended by SIGPIPE
            _silence_stdout()
            return 128 + signal.SIGPIPE
        except Exception as exc:
            _report_error(exc, debug)
            return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
