from pathlib import Path

from partitioner.costs import CostModel, LayerCost
from partitioner.partition import Partition
from partitioner.schedule import build
from partitioner.simulator import simulate
from partitioner.timeline import draw_timeline


def test_draws_a_png(tmp_path: Path) -> None:
    costs = CostModel(
        tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 100) for i in range(3)), bandwidth=1000.0
    )
    result = simulate(costs, Partition((0, 1, 2, 3)), build("interleaved", 3, 4))
    path = tmp_path / "timeline.png"
    draw_timeline(result, path, title="K=3, M=4")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
