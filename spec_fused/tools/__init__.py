"""The tools around the serving core: the ``spec-fused`` command (``cli``: ``doctor``,
``selftest``), the "where it helps" table (``impact``), continuous-batching traces through a
real FutureMap (``traces``) and the per-step timing shared with bench/ (``measure``).

The core (``kernels/``, ``relay``, ``caps``, ``integration/``, ``upstream``, ``cuda_ops``,
``releases``, ``settings``, ``log``) never imports from here
(tests/integration/test_layout.py holds it to that)."""
