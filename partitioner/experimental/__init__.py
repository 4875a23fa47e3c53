"""What the planner offers work outside its core a way to rank partitions by (``scoring``:
sifting's early exit with overlap on stage 0), kept apart: it never paid (docs/sifting.md)."""
