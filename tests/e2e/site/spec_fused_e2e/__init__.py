"""The e2e tier's own SGLang plugin: found by SGLang's ``load_plugins()`` (this folder is on
the tier's PYTHONPATH, so every process the engine spawns finds it too), it installs the
CPU stand-ins (``standins.py``) and the relay step counter (``counting.py``) in the
engine and in the scheduler process. It does nothing unless ``SPEC_FUSED_E2E=1``.

Nothing here touches the relay's logic or SGLang's FutureMap: the counter wraps them from
outside (HookRegistry, applied after every plugin has run), and the planted faults that
give the tier its teeth are switched on only by ``SPEC_FUSED_E2E_PLANT``.
"""

import os


def register() -> None:
    if os.environ.get("SPEC_FUSED_E2E") != "1":
        return
    from spec_fused_e2e import counting, standins

    standins.install()
    if os.environ.get("SPEC_FUSED_E2E_HOST_LENGTHS") == "1":
        host_lengths_read()
    counting.install()


def host_lengths_read() -> None:
    """The configuration where an attention backend reads host lengths (FlashInfer-class):
    SGLang's triton backend, which opts out, is made to declare that it reads them. Both
    arms alike; a configuration, not a stand-in."""
    from sglang.srt.layers.attention import triton_backend

    for cls in (triton_backend.TritonAttnBackend, triton_backend.TritonMultiStepDraftBackend):
        cls.needs_cpu_seq_lens = True
