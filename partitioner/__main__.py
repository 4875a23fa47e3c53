"""`python -m partitioner`: the `plan` and `simulate` commands."""

from partitioner.cli import main

raise SystemExit(main())
