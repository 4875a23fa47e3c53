"""partitioner: cost model, exact partition solvers, schedules and a pipeline simulator."""

from partitioner.baselines import block_partition, by_parameters, uniform
from partitioner.costs import CostModel, LayerCost, format_bytes
from partitioner.partition import Partition
from partitioner.plan import Plan, make_plan
from partitioner.schedule import (
    Action,
    Kind,
    Schedule,
    ScheduleError,
    add_communication,
    build,
    format_schedule,
    forward_only,
    interleaved,
    simple,
    validate,
)
from partitioner.simulator import Event, SimResult, simulate
from partitioner.solver import (
    InfeasibleError,
    peak_memory_estimate,
    solve,
    solve_memory,
    solve_speed,
    step_time_estimate,
)

__all__ = [
    "Action",
    "CostModel",
    "Event",
    "InfeasibleError",
    "Kind",
    "LayerCost",
    "Partition",
    "Plan",
    "Schedule",
    "ScheduleError",
    "SimResult",
    "add_communication",
    "block_partition",
    "build",
    "by_parameters",
    "format_bytes",
    "format_schedule",
    "forward_only",
    "interleaved",
    "make_plan",
    "peak_memory_estimate",
    "simple",
    "simulate",
    "solve",
    "solve_memory",
    "solve_speed",
    "step_time_estimate",
    "uniform",
    "validate",
]
