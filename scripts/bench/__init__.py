"""The benchmark harness: every ``scripts/bench_*.py`` is a thin case on it.

``harness`` runs jobs (a quiet machine, one environment, one ``mpirun`` per
configuration, rotating repeats, JSON per rank); ``report`` turns saved results into
the docs (tables, provenance lines, sections between markers); ``main`` is the one
command line every benchmark shares (``--quick``, ``--json``, ``--render``, ``--no-docs``).
"""
