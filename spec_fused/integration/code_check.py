"""Run only against SGLang code that was tested: fingerprints of the code spec_fused patches.

Why: a version number says little about the code behind it (a patch release, a local
build, a vendor fork), and a parameter-name probe misses what matters most - a new branch
inside ``resolve_seq_lens_cpu`` (a restored DFLASH fast path, a field it starts to set)
would be silently bypassed by the fused relay, and a new keyword on ``publish`` would be
a ``TypeError`` inside the scheduler loop. So for every SGLang function the patch
replaces, wraps, or relies on to behave a known way, this compares its signature (every
parameter's name, kind and default) and a fingerprint of its code (the AST, so comments,
whitespace and docstrings do not count) with those of the releases the compat tier tested
(``tested_code.py``, written by ``python scripts/compat_tier.py record``).

The installed code must equal, as a whole, the code of one tested release: then it runs
whatever its version says. Otherwise SGLang's own path runs and one log line names the
function that changed, unless ``SPEC_FUSED_ALLOW_UNTESTED=1``.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "CHECKED",
    "RELAY_MODULES",
    "CodeVerdict",
    "check_module",
    "fingerprint_function",
    "fingerprint_source_file",
    "installed_fingerprints",
    "patchable",
    "tested_function",
    "verdict",
]

ABSENT = "absent"

# What the patch touches, per module: (module, qualified name). The FutureMap methods it
# replaces or wraps, the ones that write the buffer it guards, the function whose way of
# reading two-batch overlap it reads back, and the scheduler method whose barrier it gates.
CHECKED = {
    "sglang.srt.managers.overlap_utils": (
        "FutureMap.__init__",
        "FutureMap._adopt_relay",
        "FutureMap.publish",
        "FutureMap.resolve_seq_lens_cpu",
        "FutureMap.resolve_mixed_spec_tails",
        "decide_needs_cpu_seq_lens",
    ),
    "sglang.srt.managers.scheduler": ("Scheduler._apply_war_barrier",),
    # What the bound variant rests on (integration/flashinfer_plan.py), gating it alone: the
    # plan it guards, where SGLang installs that plan and builds its host arguments, the
    # worker that hands it DFLASH's bound, and the bound itself.
    "sglang.srt.layers.attention.flashinfer_backend": (
        "fast_prefill_plan",
        "FlashInferAttnBackend.init_forward_metadata_out_graph",
        "FlashInferIndicesUpdaterPrefill.call_begin_forward",
    ),
    "sglang.srt.speculative.dflash_worker_v2": ("DFlashWorkerV2.forward_batch_generation",),
    "sglang.srt.speculative.dflash_info_v2": ("DFlashDraftInputV2.prepare_for_decode",),
    "sglang.srt.mem_cache.allocation_sizing": ("page_aligned_decode_alloc_lens",),
}
# The modules whose code is the relay's (the rest gate the bound variant only): releases
# with the same relay code share the compat tier's relay runs.
RELAY_MODULES = ("sglang.srt.managers.overlap_utils", "sglang.srt.managers.scheduler")


def _strip_docstring(node: Any) -> Any:
    body = getattr(node, "body", None)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        node.body = body[1:] or [ast.Pass()]
    return node


def _canonical(node: Any) -> str:
    """The AST as text that every Python reads alike. ``ast.dump`` does not: 3.12 added
    ``type_params=[]`` to every definition and 3.13 stopped printing empty fields, so its
    hash of one source differed by interpreter and the gate refused SGLang 0.5.23 on
    Python 3.12 (the first GPU run). Empty and ``None`` fields are left out, by name."""
    if isinstance(node, ast.AST):
        fields = (
            f"{name}={_canonical(value)}"
            for name in node._fields
            if (value := getattr(node, name, None)) is not None and value != []
        )
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_canonical(item) for item in node)}]"
    return repr(node)


def _fingerprint_node(node: Any) -> str:
    """``signature|hash``: the signature as source (names, kinds, defaults, annotations)
    and a short hash of the whole definition's AST, docstring left out."""
    node = _strip_docstring(node)
    signature = ast.unparse(node.args)
    return f"({signature})|{hashlib.sha256(_canonical(node).encode()).hexdigest()[:16]}"


def fingerprint_function(fn) -> str:
    """The fingerprint of a live function object (what is installed right now: another
    plugin's replacement shows as a change)."""
    src = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(src)
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"{fn!r} is not a plain function definition")
    return _fingerprint_node(node)


def _find(tree: ast.Module, qualname: str) -> Optional[ast.AST]:
    scope = tree.body
    node = None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        scope = getattr(node, "body", [])
    return node


def fingerprint_source_file(path, qualnames) -> dict:
    """``{qualname: fingerprint or "absent"}`` read from a source file without importing
    it (the compat tier records every release this way)."""
    if not Path(path).exists():  # a module a release does not have yet
        return dict.fromkeys(qualnames, ABSENT)
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    out = {}
    for name in qualnames:
        node = _find(tree, name)
        out[name] = ABSENT if node is None else _fingerprint_node(node)
    return out


def tested_function(module: str, name: str, namespace: dict):
    """``module.name`` (a module-level function) compiled alone from the installed
    release's source once its fingerprint is a tested release's, for the checks that must
    run SGLang's own code where its module cannot be imported (FlashInfer's backend pulls
    kernels a CPU, or the lent GPU's older torch, cannot load); ``namespace`` holds the
    names it uses. Returns ``(function, [the releases whose code it is])``."""
    import importlib.util

    from spec_fused.integration.tested_code import TESTED_CODE

    top = importlib.util.find_spec(module.split(".")[0])  # the top package: nothing imported
    if top is None or top.origin is None:
        raise LookupError(f"{module.split('.')[0]} is not installed")
    path = Path(top.origin).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    node = _find(ast.parse(path.read_text(encoding="utf-8")), name)
    got = ABSENT if node is None else _fingerprint_node(node)
    releases = [r for r, code in TESTED_CODE.items() if code.get(module, {}).get(name) == got]
    if not isinstance(node, ast.FunctionDef) or not releases:
        raise LookupError(f"{path}: {name} is no tested release's ({got})")
    flags = __import__("__future__").annotations.compiler_flag  # the module's own import
    exec(compile(ast.Module([node], []), str(path), "exec", flags=flags), namespace)
    return namespace[name], releases


def _live(module, qualname: str):
    obj = module
    for part in qualname.split("."):
        owner = obj
        obj = (owner.__dict__ if isinstance(owner, type) else vars(owner)).get(part)
        if obj is None:
            return None
    return obj


def installed_fingerprints(module, names=None) -> dict:
    """``{qualname: fingerprint}`` of the live functions of an imported ``module``."""
    names = CHECKED[module.__name__] if names is None else names
    out = {}
    for name in names:
        fn = _live(module, name)
        if fn is None:
            out[name] = ABSENT
            continue
        fn = getattr(fn, "__wrapped__", None) if _is_ours(fn) else fn
        try:
            out[name] = fingerprint_function(fn)
        except (OSError, TypeError, ValueError, SyntaxError) as exc:
            out[name] = f"unreadable ({type(exc).__name__})"
    return out


def _is_ours(fn) -> bool:
    """One of spec_fused's own replacements (checked against what it replaced)."""
    return getattr(fn, "__module__", "").startswith("spec_fused.")


@dataclass
class CodeVerdict:
    """``release``: the tested release whose code this is (None: none). ``changed``: the
    functions that differ from the closest tested release, each with how."""

    module: str
    release: Optional[str]
    closest: Optional[str]
    changed: dict

    @property
    def tested(self) -> bool:
        return self.release is not None

    def describe(self) -> str:
        if self.tested:
            return f"{self.module}: the code of SGLang {self.release} (tested)"
        parts = [f"{name} {how}" for name, how in self.changed.items()]
        return (
            f"{', '.join(parts)} (compared with SGLang {self.closest}, the closest tested release)"
        )


def _how(got: str, want: str) -> str:
    if got == ABSENT:
        return "is gone"
    if want == ABSENT:
        return "is new"
    if got.split("|")[0] != want.split("|")[0]:
        return f"changed signature {got.split('|')[0]} (tested: {want.split('|')[0]})"
    return "changed code"


def verdict(
    module_name: str, installed: dict, tested: Optional[dict] = None, prefer: Optional[str] = None
) -> CodeVerdict:
    """Which tested release the installed functions of ``module_name`` are, as a whole.
    ``tested``: ``{release: {module: {qualname: fingerprint}}}`` (default: the recorded
    table); ``prefer``: the installed version, tried first and taken as closest on ties."""
    if tested is None:
        from spec_fused.integration.tested_code import TESTED_CODE

        tested = TESTED_CODE
    order = sorted(tested, key=_release_key, reverse=True)
    if prefer in tested:
        order.remove(prefer)
        order.insert(0, prefer)
    best, best_diff = None, None
    for release in order:
        want = tested[release].get(module_name)
        if want is None:
            continue
        diff = {
            n: _how(installed.get(n, ABSENT), want.get(n, ABSENT))
            for n in sorted(set(want) | set(installed))
            if installed.get(n, ABSENT) != want.get(n, ABSENT)
        }
        if not diff:
            return CodeVerdict(module_name, release, release, {})
        if best_diff is None or len(diff) < len(best_diff):
            best, best_diff = release, diff
    return CodeVerdict(module_name, None, best, best_diff or {"(module)": "was never tested"})


def _release_key(release: str):
    from spec_fused.releases import parse

    return parse(release) or ()


def patchable(module, version: str, otherwise: str) -> Optional[CodeVerdict]:
    """The verdict on ``module``'s code where spec_fused may patch it (a tested release's,
    or any under ``SPEC_FUSED_ALLOW_UNTESTED=1``); else None, with one log line saying
    what stays SGLang's (``otherwise``)."""
    from spec_fused import settings
    from spec_fused.log import log_once

    found = check_module(module, prefer=version)
    if found.tested or settings.ALLOW_UNTESTED.on():
        return found
    why = "SGLang %s: %s: not tested; %s"
    log_once(("code", module.__name__), why, version, found.describe(), otherwise)
    return None


def check_module(
    module, *, prefer: Optional[str] = None, tested: Optional[dict] = None, name=None
) -> CodeVerdict:
    """The verdict on ``module``'s installed code, read as the module ``name`` (default:
    its own name; a stand-in or a vendor's copy is held to the module it stands for)."""
    name = name or module.__name__
    return verdict(name, installed_fingerprints(module, CHECKED[name]), tested, prefer)
