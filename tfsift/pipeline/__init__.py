"""Running a ``@tfsift.step``: the step plan, the executor, stages, the last-stage head, outputs."""
