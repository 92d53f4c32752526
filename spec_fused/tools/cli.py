"""The ``spec-fused`` command line (``python -m spec_fused`` too): ``doctor`` and ``selftest``.

Why a CLI: the plugin runs inside SGLang's processes and says why it did not load in one
log line at most, so "is it on here, and is it right here?" needs an answer from outside a
server. The facts come from :mod:`~spec_fused.tools.doctor` and
:mod:`~spec_fused.tools.selftest`; ``--json`` prints the same dicts the tests inspect.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Optional

__all__ = ["build_parser", "main"]


def _doctor(args: argparse.Namespace) -> int:
    from spec_fused.tools import doctor

    config = {
        "attention_backend": args.attention_backend,
        "speculative_algorithm": args.speculative_algorithm,
        "speculative_draft_attention_backend": args.speculative_draft_attention_backend,
        "enable_two_batch_overlap": args.enable_two_batch_overlap,
    }
    # Importing SGLang or Triton can print; with --json stdout is exactly one JSON object.
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        report = doctor.gather(config)
    print(json.dumps(report, indent=2, default=str) if args.json else doctor.render(report))
    return 0 if doctor.would_load(report) else 1


def _selftest(args: argparse.Namespace) -> int:
    import torch

    from spec_fused import settings

    if not torch.cuda.is_available() and "triton" not in sys.modules:
        # On a CPU the kernel can only run in Triton's interpreter, chosen before import.
        settings.set_default("TRITON_INTERPRET", "1")
    from spec_fused.tools import selftest

    with contextlib.redirect_stdout(sys.stderr if args.json == "-" else sys.stdout):
        report = selftest.run(quick=args.quick, device=args.device)
    if args.json == "-":
        print(json.dumps(report, indent=2, default=str))
    else:
        print(selftest.render(report))
        if args.json:
            selftest.dump(report, args.json)
    return 0 if report["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spec-fused",
        description="SGLang's speculative-decoding length relay in one fused Triton launch.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    doctor = sub.add_parser(
        "doctor",
        help="versions, whether SGLang would load it, the canary per device, where it helps",
        description="Exit status 0 when SGLang would load the plugin, 1 otherwise.",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    flags = doctor.add_argument_group("your configuration, in SGLang's own flags")
    flags.add_argument("--attention-backend", metavar="NAME", help="fa3, flashinfer, triton, ...")
    flags.add_argument("--speculative-algorithm", metavar="NAME", help="default EAGLE")
    flags.add_argument("--speculative-draft-attention-backend", metavar="NAME")
    flags.add_argument("--enable-two-batch-overlap", action="store_true")
    doctor.set_defaults(func=_doctor)
    selftest = sub.add_parser(
        "selftest",
        help="check the relay on this device against SGLang's own, and time it",
        description="Exit status 0 when correct here, 1 otherwise. Under a minute on a GPU.",
    )
    selftest.add_argument("--json", metavar="PATH", help="also write JSON ('-': only JSON)")
    selftest.add_argument("--quick", action="store_true", help="fewer traces and cells")
    selftest.add_argument("--device", help="default: cuda if available, else cpu")
    selftest.set_defaults(func=_selftest)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point (``spec-fused``); returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
