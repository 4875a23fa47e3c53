"""The benchmark harness: ``harness`` runs jobs, ``report`` renders, ``main`` is the CLI."""
