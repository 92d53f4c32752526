"""The ``spec-fused`` command line (``python -m spec_fused`` too).

Why a CLI at all: the plugin is loaded inside SGLang's processes and says why it did not
load in one log line at most, so "is it on here?" needs an answer from outside a server.
This module only parses arguments and renders; the facts come from
:mod:`spec_fused.tools.doctor`, which stays pure so the tests inspect the same dict ``--json``
prints. Subcommands hang off one parser so more (e.g. a bench) can be added beside
``doctor`` without changing the entry point declared in pyproject.toml.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Optional

__all__ = ["build_parser", "main", "render_doctor"]

PROG = "spec-fused"


# --------------------------------------------------------------------------- rendering


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns; the last column is not padded (the reasons are long)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _caps_cell(row: dict, key: str) -> str:
    value = row.get(key, "")
    return str(value)  # bools as True/False, like the "declared" column describe() gives


def render_doctor(report: dict) -> str:
    """The human-readable doctor report (``--json`` prints ``report`` itself)."""
    from spec_fused.tools.doctor import CAPS_COLUMNS, ENTRY_POINT_GROUP, PLUGIN_NAME

    out: list[str] = []
    v = report.get("versions", {})
    out.append("Versions")
    if "error" in v:
        out.append(f"  {v['error']}")
    else:
        gpus = v.get("gpus") or []
        out += _table(
            [
                ("spec_fused", str(v.get("spec_fused"))),
                ("SGLang", str(v.get("sglang"))),
                ("torch", str(v.get("torch"))),
                ("triton", str(v.get("triton"))),
                ("CUDA runtime", str(v.get("cuda_runtime"))),
                ("driver", str(v.get("driver"))),
                ("GPUs", "; ".join(f"{i}: {g}" for i, g in enumerate(gpus)) if gpus else "none"),
                ("python", str(v.get("python"))),
            ]
        )

    p = report.get("plugin", {})
    out += ["", f"Plugin ({ENTRY_POINT_GROUP} -> {PLUGIN_NAME})"]
    out += _table(
        [
            ("ok" if c.get("ok") else "FAIL", str(c.get("check")), str(c.get("reason")))
            for c in p.get("checks", [])
        ]
    )
    if p.get("would_load"):
        out.append("  => SGLang would load spec_fused and it would patch the relay")
    else:
        out.append("  => spec_fused would NOT load: SGLang runs its own relay")
        if not p.get("checks"):
            out += [f"     {r}" for r in p.get("reasons", [])]

    b = report.get("backends", {})
    out += ["", "Kernel backend per device (publish_gather)"]
    if "error" in b:
        out.append(f"  {b['error']}")
    else:
        out += _table(
            [(dev, str(info.get("backend")), str(info.get("reason"))) for dev, info in b.items()]
        )
        seams = [
            (dev, str(info.get("relay_backend")), str(info.get("relay_reason")))
            for dev, info in b.items()
            if info.get("relay_reason", info.get("reason")) != info.get("reason")
        ]
        if seams:
            out += ["", "Relay backend per device (where it differs: SPEC_FUSED_FORCE_BACKEND)"]
            out += _table(seams)

    canaries = [
        (dev, str(info.get("relay")), str(info.get("canary")))
        for dev, info in b.items()
        if isinstance(info, dict) and info.get("relay")
    ]
    if canaries:
        out += [
            "",
            "Relay per device (start-up canary: the fused step against the torch reference)",
        ]
        out += _table([(d, r, c if c != "None" else "-") for d, r, c in canaries])

    rows = report.get("caps", [])
    out += [
        "",
        "Capabilities (declared = caps_for; the rest as established against the installed SGLang)",
    ]
    table = [tuple(CAPS_COLUMNS), tuple("-" * len(c) for c in CAPS_COLUMNS)]
    for row in rows:
        if "error" in row:
            table.append((str(row.get("algorithm")), "-", "-", "-", "-", f"error: {row['error']}"))
        else:
            table.append(tuple(_caps_cell(row, k) for k in CAPS_COLUMNS))
    out += _table(table)
    out += _render_impact(report.get("impact", {}))
    return "\n".join(out)


def _costs(c: dict) -> str:
    return (
        f"{c['device_ops']} device ops, {c['d2h_bytes']} B D2H, {c['host_syncs']} host "
        f"syncs, barrier {'kept' if c['barrier'] else 'off'}; host waits for "
        f"{c['host_waits_for']}"
    )


def _render_impact(impact: dict) -> list:
    from spec_fused.tools.impact import cells

    if not impact or "error" in impact:
        return ["", f"Where spec_fused helps: {impact.get('error', 'unknown')}"]
    release = impact.get("release")
    out = ["", f"Where spec_fused helps (SGLang {release}; per relay step on CUDA)"]
    row = impact.get("row")
    if row is not None:
        out.append(
            f"  --attention-backend {row['backend']} --speculative-algorithm "
            f"{row['algorithm']}: host lengths "
            f"{'read' if row['needs_host_lengths'] else 'opted out'}"
        )
        for note in row["notes"]:
            out.append(f"    note: {note}")
        out.append(f"  upstream:   {_costs(row['upstream'])}")
        out.append(f"  spec_fused: {_costs(row['spec_fused'])}")
        decision = impact.get("decision", {})
        if "error" in decision:
            out.append(f"  decision: error: {decision['error']}")
        elif decision:
            out.append(
                f"  decision: {decision['variant']}, WAR barrier "
                f"{'kept' if decision['needs_war_barrier'] else 'off'}, host "
                f"lengths {decision['host_seq_lens']} ({decision['reason']})"
            )
        out.append(f"  => {row['verdict']}")
        return out
    table = [
        (
            "attention backend",
            "algorithm",
            "host lengths",
            "upstream",
            "spec_fused",
            "where it helps",
        ),
        (
            "-----------------",
            "---------",
            "------------",
            "--------",
            "----------",
            "--------------",
        ),
    ]
    for r in impact.get("rows", []):
        table.append(
            (
                r["backend"],
                r["algorithm"],
                "read" if r["needs_host_lengths"] else "opted out",
                cells(r["upstream"]),
                cells(r["spec_fused"]),
                "helps: no pool-sized copy"
                if r["needs_host_lengths"]
                else "nothing that matters (upstream is GPU-only here)",
            )
        )
    out += _table(table)
    out.append("  (device ops / D2H bytes / host syncs / WAR barrier)")
    out += [
        f"  note ({r['backend']}, {r['algorithm']}): {note}"
        for r in impact.get("rows", [])
        for note in r["notes"]
    ]
    out.append(
        "  Your configuration: spec-fused doctor --attention-backend NAME "
        "--speculative-algorithm NAME"
    )
    return out


# --------------------------------------------------------------------------- commands


def _cmd_doctor(args: argparse.Namespace) -> int:
    from spec_fused.tools import doctor

    # Importing SGLang (check_supported imports overlap_utils) or Triton can print; in
    # --json mode stdout must be exactly one JSON object, so such chatter goes to stderr.
    config = {
        "attention_backend": args.attention_backend,
        "speculative_algorithm": args.speculative_algorithm,
        "speculative_draft_attention_backend": args.speculative_draft_attention_backend,
        "enable_two_batch_overlap": args.enable_two_batch_overlap,
    }
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        report = doctor.gather(config=config)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(render_doctor(report))
    plugin = report.get("plugin", {})
    if plugin.get("would_load"):
        return 0
    for reason in plugin.get("reasons") or ["unknown reason"]:
        print(f"{PROG} doctor: spec_fused would not load: {reason}", file=sys.stderr)
    return 1


def _cmd_selftest(args: argparse.Namespace) -> int:
    import torch

    from spec_fused import settings

    if not torch.cuda.is_available() and "triton" not in sys.modules:
        # On a CPU the fused kernel can only run in Triton's interpreter, which must be
        # chosen before Triton is imported.
        settings.TRITON_INTERPRET.set_default("1")
    from spec_fused.tools import selftest

    with contextlib.redirect_stdout(sys.stderr if args.json == "-" else sys.stdout):
        report = selftest.run(quick=args.quick, device=args.device)
    if args.json == "-":
        print(json.dumps(report, indent=2, default=str))
    else:
        print(selftest.render(report))
        if args.json:
            selftest.dump(report, args.json)
            print(f"JSON: {args.json}")
    return 0 if report["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="spec_fused: SGLang's speculative-decoding length relay in one fused "
        "Triton launch, loaded as an SGLang plugin.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    doctor = sub.add_parser(
        "doctor",
        help="show versions, whether the plugin would load, kernel backends and "
        "the capability table",
        description="Report versions, whether SGLang would load the spec_fused plugin (and "
        "why not), the kernel backend per device and the capability table. "
        "Exit status 0 when the plugin would load, 1 otherwise.",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    sglang_flags = doctor.add_argument_group(
        "your configuration (SGLang's own flags): where spec_fused helps for it"
    )
    sglang_flags.add_argument(
        "--attention-backend", metavar="NAME", help="e.g. fa3, fa4, flashinfer, triton, trtllm_mha"
    )
    sglang_flags.add_argument(
        "--speculative-algorithm",
        metavar="NAME",
        help="e.g. DFLASH, EAGLE, EAGLE3, NGRAM (default EAGLE)",
    )
    sglang_flags.add_argument("--speculative-draft-attention-backend", metavar="NAME")
    sglang_flags.add_argument("--enable-two-batch-overlap", action="store_true")
    doctor.set_defaults(func=_cmd_doctor)
    selftest = sub.add_parser(
        "selftest",
        help="check the relay on this device against SGLang's own, and time it",
        description="Correctness (random traces through SGLang's real FutureMap, patched vs "
        "unpatched, as the server here would run the relay) and speed (host "
        "and device µs per relay step against SGLang's). Exit status 0 when "
        "correct, 1 otherwise. Under a minute on a GPU.",
    )
    selftest.add_argument(
        "--json", metavar="PATH", help="also write the report as JSON ('-': print only the JSON)"
    )
    selftest.add_argument("--quick", action="store_true", help="fewer traces and steps")
    selftest.add_argument("--device", help="default: cuda if available, else cpu")
    selftest.set_defaults(func=_cmd_selftest)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point (``spec-fused``); returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
