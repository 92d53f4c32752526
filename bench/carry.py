"""The size of what one device call carries to the lent GPU: the working tree plus ``.whl/``.

Why: a call sends the tree (tracked and untracked-not-ignored files) and the paths named in
``carry``, 64 MiB in all, and is refused above that after the machine has started. So the
size is measured here, where a fix is cheap, by the two scripts that make the carry
(``bench/fetch_gpu_wheels.sh``) and prove the check (``bench/gpu_check.sh --dry-run``):
both print it and fail above 60 MiB, leaving room for what a session writes before its call.

Usage: ``python -m bench.carry [--root DIR] [--wheels DIR] [--limit-mib 60]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
CALL_MIB = 64  # what one device call carries
LIMIT_MIB = 60.0


def _size(paths) -> int:
    return sum(p.lstat().st_size for p in paths if p.is_symlink() or p.is_file())


def tree_bytes(root: Path) -> int:
    """Tracked and untracked-not-ignored files: what the device tool sends of the tree."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return _size(root / name for name in listed.split("\0") if name)


def main(argv=None) -> int:
    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=root, help="the working tree (this one)")
    parser.add_argument("--wheels", type=Path, default=None, help="the carried wheels (.whl/)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = parser.parse_args(argv)
    wheels = args.wheels or args.root / ".whl"
    tree = tree_bytes(args.root)
    whl = _size(wheels.rglob("*")) if wheels.is_dir() else 0
    total = tree + whl
    print(
        f"carry: {total / MIB:.1f} MiB = the tree {tree / MIB:.1f} MiB + {wheels.name}/ "
        f"{whl / MIB:.1f} MiB{'' if whl else ' (none yet: bench/fetch_gpu_wheels.sh)'}; "
        f"at most {args.limit_mib:g} MiB here, {CALL_MIB} MiB a device call"
    )
    if total > args.limit_mib * MIB:
        print(f"carry: {total / MIB:.1f} MiB is over {args.limit_mib:g} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
