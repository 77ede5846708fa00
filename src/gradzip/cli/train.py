"""``gradzip train``: the command-line front end of :mod:`gradzip.experiments.trainer`.

Its options are checked in two rounds: first everything that needs no registry code
(:func:`check_quickly`: names against :mod:`gradzip.cli.catalog`, numbers in range), so that a
mistake is refused at once, and only then the ``KEY=VALUE`` parameters against the
compressor's, scheme's and method's signatures, which imports torch."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from gradzip.cli.catalog import compressors, models, schemes
from gradzip.cli.help import describe_when_asked, fail
from gradzip.cli.train_method import add_method_options, method_from_args
from gradzip.errors import GradzipError
from gradzip.experiments.config import (
    BACKENDS,
    OPTIMIZERS,
    ConfigError,
    TrainConfig,
)

TRAIN = "gradzip train"


def add_train_parser(sub: Any) -> None:
    """Register ``gradzip train`` on the CLI's subparsers."""
    d = TrainConfig()
    p = sub.add_parser(
        "train",
        help="train a model with compressed gradients (default: NDQSG, FC-300-100, MNIST, 8 workers)",
        description=(
            "Synchronous data-parallel training with compressed gradients. With no options: "
            "FC-300-100 on MNIST, 8 simulated workers (half DQSG with Delta=1/2, half nested "
            "NDQSG with Delta1=1/3, Delta2=1) decoded at a parameter server that returns the "
            "mean as a 5-bit DQSG payload, Adam lr 1e-3, total batch 256, one epoch."
        ),
    )
    p.add_argument("--model", default=d.model, help=", ".join(models()))
    p.add_argument(
        "--dataset", default=None, help="mnist, fashion-mnist, cifar10 (default: the model's)"
    )
    p.add_argument("--data-dir", default=None, help="a directory holding the dataset's files")
    p.add_argument(
        "--compressor", default=d.compressor, help="any name from `gradzip list compressors`"
    )
    p.add_argument(
        "--param",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="compressor parameter(s) (repeatable), typed by its signature, e.g. --param M=2 "
        "(default: the compressor's defaults; an unknown key is refused with the keys it takes)",
    )
    p.add_argument(
        "--scheme",
        default=None,
        help="a scheme, its options in brackets: ps, ps[requantize], powersgd[r1,start2], "
        "`gradzip list schemes` (default: nested[server,dqsg-downlink] "
        "for ndqsg, the paper's server with a 5-bit DQSG downlink; ps[fp32] otherwise)",
    )
    scheme_param = p.add_argument(
        "--scheme-param", action="extend", nargs="+", default=[], metavar="KEY=VALUE"
    )
    describe_when_asked(p, lambda: setattr(scheme_param, "help", scheme_param_help()))
    p.add_argument(
        "--error-feedback",
        action="store_true",
        help="each worker keeps the compression error and adds it to its next gradient "
        "(default: off)",
    )
    p.add_argument(
        "--workers", type=int, default=d.workers, help="data-parallel workers (ranks), P"
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=d.backend,
        help="local: simulated ranks in this process; gloo: one process per rank on this "
        "machine; env: this process is one rank under torchrun",
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer, help="the optimizer")
    p.add_argument(
        "--lr", type=float, default=None, help="default: 0.01 for sgd and adagrad, 0.001 for adam"
    )
    p.add_argument(
        "--lr-decay", type=float, default=d.lr_decay, help="learning-rate factor per epoch"
    )
    p.add_argument("--momentum", type=float, default=d.momentum, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="L2 penalty")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="total over workers")
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the training set")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="stop after N steps (default: every step of --epochs)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="model, data order and dither seed")
    p.add_argument(
        "--out",
        default=None,
        help="run directory (default runs/<model>-<method>-<P>w-s<seed>-<hash of the options>, "
        "-2, -3, ... appended for repeats); refused if it holds a run, unless --force",
    )
    p.add_argument(
        "--force", action="store_true", help="replace the run held by --out (its files only)"
    )
    p.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the run in DIR from its checkpoint, with its options; only --epochs, "
        "--max-steps, --timeout and --no-progress may be given (to change them)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=d.timeout,
        metavar="SECONDS",
        help="process backends: how long a rank waits for a peer before the run fails "
        "(default 60); a run as a whole has no time limit",
    )
    p.add_argument("--entropy", action="store_true", help="entropy-code the payloads (ANS)")
    p.add_argument(
        "--eval-every",
        type=int,
        default=d.eval_every,
        metavar="N",
        help="steps between test-accuracy evaluations (and one at the end)",
    )
    p.add_argument(
        "--eval-images",
        type=int,
        default=None,
        metavar="N",
        help="evaluate on the first N test images only (default: all)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (default: one on a terminal)",
    )
    p.add_argument(
        "--vectorized-gradients",
        action="store_true",
        help="compute the simulated workers' gradients in one vectorized pass (torch.func.vmap): "
        "about twice as fast, but NOT bit-exact with --backend gloo/env (by default each worker's "
        "gradient is computed exactly as a process rank computes it)",
    )
    add_method_options(p)
    p.set_defaults(func=cmd_train)
    _record_explicit(p)


_UNSET = object()


def _record_explicit(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` also record in ``args.explicit`` the destinations of the options given
    on the command line (``--resume`` must tell an option given from one left at its
    default, whatever its value): a second parse into a namespace where every destination is
    preset to a marker, which argparse overwrites only for options that are present."""
    parse = parser.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        parsed, rest = parse(args, namespace)
        actions = [a for a in parser._actions if a.dest != argparse.SUPPRESS]
        # append actions copy what is there: start them from None, not the marker
        unset = {a.dest: None if isinstance(a, argparse._AppendAction) else _UNSET for a in actions}
        probe = argparse.Namespace(**unset)
        parse(args, probe)
        parsed.explicit = {
            dest for dest, marker in unset.items() if getattr(probe, dest) is not marker
        }
        return parsed, rest

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's options, the ``KEY=VALUE`` parameters read by their targets' signatures
    (which imports the compressors, schemes and methods, and so torch)."""
    from gradzip.cli.params import compressor_params, scheme_params

    method, method_options = method_from_args(args)
    config = options_as_given(args)
    scheme = config.resolved_scheme()
    return replace(
        config,
        compressor_params=compressor_params(args.compressor, args.param) if args.param else {},
        scheme_params=scheme_params(scheme, args.scheme_param) if args.scheme_param else {},
        method=method,
        method_options=method_options,
    )


def options_as_given(args: argparse.Namespace) -> TrainConfig:
    """The run's options without its ``KEY=VALUE`` parameters (nothing heavy imported)."""
    return TrainConfig(
        model=args.model,
        dataset=args.dataset,
        data_dir=args.data_dir,
        compressor=args.compressor,
        scheme=args.scheme,
        error_feedback=args.error_feedback,
        workers=args.workers,
        backend=args.backend,
        optimizer=args.optimizer,
        lr=args.lr,
        lr_decay=args.lr_decay,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        batch_size=args.batch_size,
        epochs=args.epochs,
        max_steps=args.max_steps,
        seed=args.seed,
        out=args.out,
        entropy=args.entropy,
        eval_every=args.eval_every,
        eval_images=args.eval_images,
        progress=not args.no_progress,
        vectorized_gradients=args.vectorized_gradients,
        timeout=args.timeout,
        method=args.method,
    )


def check_quickly(args: argparse.Namespace) -> None:
    """``ConfigError`` for every mistake in the options that needs no registry code: --out or
    --force beside --resume, unknown names (:mod:`gradzip.cli.catalog`), numbers out of
    range. Imports nothing heavy, so a mistake is refused before torch loads."""
    explicit = set(getattr(args, "explicit", set()))
    if args.resume is not None and explicit & {"out", "force"}:
        raise ConfigError(
            f"--resume continues the run in {args.resume}; leave out --out and --force"
        )
    config = options_as_given(args)
    config.check_names(models(), compressors(), schemes())
    config.check_values()


#: ``gradzip train`` destinations that are not TrainConfig fields, or are named otherwise
_NOT_FIELDS = {"func", "command", "explicit", "force", "resume"}
_FIELD = {
    "param": "compressor_params",
    "scheme_param": "scheme_params",
    "method_param": "method_options",
    "no_progress": "progress",
}


def resume_config(args: argparse.Namespace) -> TrainConfig:
    """The options of the run in ``args.resume`` with the options given on the command line
    applied (refused if they change the computation, or with --out or --force)."""
    from gradzip.experiments import checkpoint

    explicit = set(getattr(args, "explicit", set())) - {"resume", "func", "command"}
    if explicit & {"out", "force"}:
        raise ConfigError(
            f"--resume continues the run in {args.resume}; leave out --out and --force"
        )
    given = config_from_args(args)
    fields = {_FIELD.get(dest, dest) for dest in explicit - _NOT_FIELDS}
    return checkpoint.resumed_config(args.resume, {f: getattr(given, f) for f in fields})


def cmd_train(args: argparse.Namespace) -> int:
    try:
        check_quickly(args)
    except ConfigError as err:
        return fail(TRAIN, str(err))
    # imported once the options passed the quick checks: these import torch
    from gradzip.experiments.backends import train
    from gradzip.experiments.resolved_config import validate
    from gradzip.experiments.run_dir import claim_run_dir

    try:
        if args.resume is not None:
            config = resume_config(args)
        else:
            config = validate(config_from_args(args))
            if config.backend != "env":  # under torchrun, rank 0 claims it for all ranks
                config = claim_run_dir(config, force=args.force)
        result = train(config, force=args.force, resume=args.resume is not None)
    except (ConfigError, GradzipError) as err:
        return fail(TRAIN, str(err))
    if not result.complete:
        return report_stopped(result.to_dict())
    if result.rank != 0:
        return 0  # under torchrun, rank 0 reports
    acc = result.test_acc
    print(
        f"{result.steps} steps in {result.seconds or 0.0:.1f} s "
        f"({result.steps_per_second or 0.0:.2f} steps/s); test accuracy "
        f"{'n/a' if acc is None else f'{100 * acc:.2f}%'}; run directory {result.run_dir}"
    )
    print(traffic_line(result.to_dict()))
    return 0


def kbit(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1000:,.1f}"


def traffic_line(summary: dict[str, Any]) -> str:
    """Per step: the workers' uplink payloads, then every byte each rank sent and received as
    counted by the transport (mean, busiest rank), beside fp32 ring all-reduce at this P."""
    return (
        f"per step: uplink payload {kbit(summary.get('wire_bits'))} Kbit per worker "
        f"(paper {kbit(summary.get('paper_bits'))}, entropy {kbit(summary.get('entropy_bits'))}; "
        f"fp32 {kbit(summary['baseline_bits'])}); each rank sent {kbit(summary.get('sent_bits'))} "
        f"Kbit (busiest {kbit(summary.get('sent_bits_max'))}) and received "
        f"{kbit(summary.get('received_bits'))} (busiest {kbit(summary.get('received_bits_max'))}), "
        f"against {kbit(summary.get('fp32_ring_allreduce_bits'))} sent and received by each rank "
        "of an fp32 ring all-reduce"
    )


def report_stopped(summary: dict[str, Any]) -> int:
    """One line for a run a signal stopped early; the shell's status for that signal."""
    import signal

    from gradzip.comm.signals import exit_status

    name = summary.get("interrupted_by") or "SIGINT"
    if summary.get("killed"):
        after = f"after {summary['steps']} steps" if summary["steps"] else "before its first step"
        then = (
            f"continue it from its last checkpoint with `gradzip train --resume {summary['run_dir']}`"
            if summary["resumable"]
            else "it has no checkpoint yet (one is written after every epoch)"
        )
        print(
            f"gradzip train: {name} killed the ranks {after}; {summary['run_dir']} keeps the "
            f"metrics of those steps; {then}",
            file=sys.stderr,
        )
    elif summary.get("rank", 0) == 0:
        print(
            f"gradzip train: interrupted by {name} after {summary['steps']} of "
            f"{summary['total_steps']} steps; partial run in {summary['run_dir']} (continue it "
            f"with `gradzip train --resume {summary['run_dir']}`)",
            file=sys.stderr,
        )
    try:
        return exit_status(signal.Signals[name].value)
    except KeyError:
        return 1


def scheme_param_help() -> str:
    """``--scheme-param``'s help: the keys each scheme takes (from their signatures)."""
    from gradzip.cli.params import Target
    from gradzip.schemes import SCHEMES

    keys = []
    for name, cls in SCHEMES.items():
        target = Target.of_callable(name, cls, skip=("compressor", "run_seed", "error_feedback"))
        if target.keys:
            keys.append(f"{name}: {', '.join(target.keys)}")
    return (
        "a parameter of the scheme (repeatable), e.g. --scheme-param downlink=fp32; the keys "
        f"each scheme takes: {'; '.join(keys)} (default: the variant's own settings)"
    )
