"""Loading spec_fused into a running SGLang (see :mod:`spec_fused.integration.sglang_patch`)."""
