"""The tools around the serving core: the ``spec-fused`` command (``cli``: ``doctor``,
``selftest``), the "where it helps" table (``impact``) and continuous-batching traces
through a real FutureMap (``traces``). The core never imports from here."""
