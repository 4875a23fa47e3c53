"""What does crossing hosts cost a 2-stage x 2-replica job, and which placement suits a slow link?

Two simulated hosts (``scripts/simhosts.sh``), their link shaped with ``tc`` (or host 1's
delay line where the kernel has no ``netem``); 4 ranks of a chain of Dense layers cut in the
middle, on one host, with ``placement_strategy="cluster"`` (the allreduce crosses the link)
and ``"spread"`` (every pipeline message crosses it). Per link and configuration: the median
step, the bytes the hosts' counters sent over the link per step, and what the partitioner
predicts to cross (the allreduce: a ring of each stage's gradients). Needs root.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Sequence
from statistics import median

from bench_pipeline import run_job

from bench import harness, report
from bench.harness import SIMHOSTS, Result, say
from bench.main import Benchmark, run
from partitioner.costs import CostModel, LayerCost

IFACE = "tfsift0"  # the simulated hosts' link (scripts/simhosts.sh)
NAMESPACES = ("tfsift-h1", "tfsift-h2")
ONE_HOST, CLUSTER, SPREAD = "one host", "2 hosts, cluster", "2 hosts, spread"
# (configuration, placement, mpirun's --host list): 4 ranks, 2 stages x 2 replicas
CASES = (
    (ONE_HOST, "cluster", "10.251.0.1:4"),
    (CLUSTER, "cluster", "10.251.0.1:2,10.251.0.2:2"),
    (SPREAD, "spread", "10.251.0.1:2,10.251.0.2:2"),
)
CROSSES = {ONE_HOST: "nothing", CLUSTER: "the allreduce", SPREAD: "the stages' messages"}
R = 2  # replicas


@dataclasses.dataclass(frozen=True)
class Link:
    """A link shape: a rate (Mbit/s) and a one-way delay (ms), None for the bare veth's."""

    name: str
    rate_mbit: float | None = None
    delay_ms: float | None = None

    @property
    def bandwidth(self) -> float | None:
        """Bytes per second, or None (unshaped)."""
        return None if self.rate_mbit is None else self.rate_mbit * 1e6 / 8


@dataclasses.dataclass(frozen=True)
class Settings:
    layers: int = 4
    width: int = 1024
    batch: int = 64  # each replica's
    M: int = 4
    warmup: int = 3
    steps: int = 20
    repeats: int = 3
    links: tuple[Link, ...] = (
        Link("the bare veth (unshaped)"),
        Link("1 Gbit/s", rate_mbit=1000),
        Link("100 Mbit/s", rate_mbit=100),
        # the delay line's control: its MTU and copying at a delay of nothing
        Link("100 Mbit/s, 1 µs each way", rate_mbit=100, delay_ms=0.001),
        Link("100 Mbit/s, 5 ms each way", rate_mbit=100, delay_ms=5),  # netem or delay line
    )


QUICK = Settings(
    width=128, batch=16, M=2, warmup=1, steps=3, repeats=1,
    links=(Link("the bare veth (unshaped)"), Link("100 Mbit/s", rate_mbit=100)),
)  # fmt: skip


def tc_commands(link: Link, namespace: str) -> list[list[str]]:
    """The ``tc`` lines that shape ``namespace``'s outgoing link: ``tbf`` for a rate (a burst
    of 10 ms of it, at least 32 KiB; packets queue up to 100 ms), ``netem`` for a delay,
    ``tbf`` below ``netem`` for both; none for the bare link."""
    tc = ["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", IFACE]
    tbf = []
    if link.rate_mbit is not None and link.bandwidth is not None:
        burst = max(32768, int(link.bandwidth / 100))
        tbf = ["tbf", "rate", f"{link.rate_mbit:g}mbit", "burst", str(burst), "latency", "100ms"]
    if link.delay_ms is None:
        return [[*tc, "root", *tbf]] if tbf else []
    netem = [[*tc, "root", "handle", "1:", "netem", "delay", f"{link.delay_ms:g}ms"]]
    return netem + ([[*tc, "parent", "1:1", "handle", "10:", *tbf]] if tbf else [])


def predicted(s: Settings, case: str, link: Link) -> tuple[float, float | None]:
    """What crosses the link per step (bytes, both ways together), and the seconds that
    takes at the link's rate, one way (None on the unshaped link). ``spread``: each of the
    R pipelines sends M microbatches' activations forward over the cut and M gradients
    back, each the partitioner's cut bytes and ``cut_time``; ``cluster``: each stage's 2
    replicas, one a host, average their gradients in a ring allreduce, 2 (R - 1) S in all.
    """
    if case == ONE_HOST:
        return 0.0, None
    params = 4 * (s.width * s.width + s.width)  # float32 kernel and bias; compute left at 0
    layers = [LayerCost(f"dense{i}", 0.0, 0.0, params, 0, output_bytes=4 * s.width)
              for i in range(s.layers)]  # fmt: skip
    model = CostModel(tuple(layers), batch_size=s.batch // s.M, bandwidth=link.bandwidth or 1e9,
                      latency=(link.delay_ms or 0.0) / 1e3)  # fmt: skip
    cut = s.layers // 2
    if case == SPREAD:
        messages = R * s.M  # each way
        total = 2.0 * messages * float(model.prefix.input_bytes[cut])
        seconds = messages * model.cut_time(cut - 1)
    else:
        grads = float(sum(layer.param_bytes for layer in model.layers))
        total = 2.0 * (R - 1) * grads
        seconds = (R - 1) * grads / model.bandwidth + model.latency
    return total, seconds if link.bandwidth is not None else None


def crossing_bytes(reports: Sequence[Result]) -> float:
    """The bytes the hosts sent over the link per timed step: each host's counter, read
    by the lowest rank on it."""
    first: dict[str, Result] = {}
    for got in sorted(reports, key=lambda r: r["rank"]):
        first.setdefault(got["host"], got)
    steps = len(reports[0]["times"])
    return float(sum(got["bytes"]["tx_bytes"] for got in first.values())) / steps


def simhosts(*args: str) -> None:
    done = subprocess.run(["bash", str(SIMHOSTS), *args], capture_output=True, text=True)
    if done.returncode != 0:
        said = f"{done.stdout}{done.stderr}"
        raise SystemExit(f"bench_hosts: simhosts.sh {' '.join(args)} failed: {said}")


def shape(link: Link, delay_line: bool = False) -> None:
    """Shapes the link; with ``delay_line``, the delay is host 1's delay line (MS ms each
    way between the hosts, as ``netem`` on both) and only the rate is ``tc``'s."""
    if delay_line:  # its 64 KiB frames need a tbf burst of 64 KiB: 100 Mbit/s's is 125 kB
        simhosts("delay", "1", f"{link.delay_ms:g}" if link.delay_ms else "off")
        link = dataclasses.replace(link, delay_ms=None)
    for namespace in NAMESPACES:
        unshape = ["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", IFACE, "root"]
        subprocess.run(unshape, capture_output=True, check=False)
        for cmd in tc_commands(link, namespace):
            subprocess.run(cmd, check=True)


def has_netem() -> bool:
    """Whether this kernel has the ``netem`` qdisc, tried on a probe namespace's loopback."""
    probe = "tfsift-netem-probe"
    subprocess.run(["ip", "netns", "add", probe], check=True)
    try:
        tc = ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root"]
        return subprocess.run([*tc, "netem", "delay", "1ms"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=True)


def measure(s: Settings) -> Result:
    simhosts("check")
    delayed = [link.name for link in s.links if link.delay_ms is not None]
    delay_line = delayed if delayed and not has_netem() else []
    if delay_line:
        say(f"no netem qdisc in this kernel: {', '.join(delay_line)} by the delay line")
    cases = {name: (placement, hosts) for name, placement, hosts in CASES}

    def job(name: str) -> Result:
        placement, hosts = cases[name]
        fields = ("layers", "width", "batch", "M", "warmup", "steps")
        config = {f: getattr(s, f) for f in fields} | {"placement": placement}
        reports = run_job(4, "hosts", config, bind="none", hosts=hosts)
        return {"step_s": median(reports[0]["times"]), "bytes": crossing_bytes(reports)}

    simhosts("up", "2")
    out: dict[str, dict[str, list[Result]]] = {}
    try:
        for link in s.links:
            say(link.name)
            shape(link, bool(delay_line))
            out[link.name] = harness.by_name(harness.rounds(list(cases), s.repeats, job))
    finally:
        simhosts("down")  # the shaping goes with the namespaces
    return {"links": out, "delay_line": delay_line}


def rows(s: Settings, link: Link, jobs: dict[str, list[Result]]) -> list[list[str]]:
    """One row per configuration: its median step, against one host's, and the bytes
    measured and predicted to cross per step."""
    step = {name: median(j["step_s"] for j in got) for name, got in jobs.items()}
    out = []
    for name in (name for name, _, _ in CASES if name in jobs):
        measured = median(j["bytes"] for j in jobs[name])
        total, seconds = predicted(s, name, link)
        out.append([
            name, f"{1e3 * step[name]:.1f}",
            f"{step[name] / step[ONE_HOST]:.2f}x" if ONE_HOST in step else "", CROSSES[name],
            f"{measured / 1e6:.2f}", f"{total / 1e6:.2f}",
            "" if seconds is None else f"{1e3 * seconds:.1f}",
        ])  # fmt: skip
    return out


def answer(link: Link, jobs: dict[str, list[Result]]) -> list[str]:
    """Which 2-host placement had the shorter step on ``link``, and ``cluster``'s step over
    ``spread``'s (medians of the jobs); no row without both."""
    if CLUSTER not in jobs or SPREAD not in jobs:
        return []
    cluster, spread = (median(j["step_s"] for j in jobs[c]) for c in (CLUSTER, SPREAD))
    return [link.name, "`spread`" if spread < cluster else "`cluster`", f"{cluster / spread:.2f}"]


def render(raw: Result, meta: Result, s: Settings) -> str:
    links = {link.name: link for link in s.links}
    by_line = set(raw.get("delay_line", []))  # delayed by the userspace delay line, not netem

    def label(name: str) -> str:
        return f"{name} (delay line)" if name in by_line else name

    answers = [answer(links[n], j) for n, j in raw["links"].items() if n in links]
    answers = [[label(a[0]), *a[1:]] for a in answers if a]
    answers += [[name, "not measured: this kernel has no netem (a delay)", ""]
                for name in raw.get("unshaped", [])]  # fmt: skip
    header = ["link", "configuration", "step ms", "vs one host", "crosses the link",
              "MB/step measured", "MB/step predicted", "predicted link ms"]  # fmt: skip
    every = [[label(name), *row] for name, jobs in raw["links"].items() if name in links
             for row in rows(s, links[name], jobs)]  # fmt: skip
    return report.section(
        meta, f"sudo {BENCH.command}",
        f"### 2 x 2 of {s.layers} x Dense({s.width}), B={s.batch} per replica, M={s.M}, "
        f"{s.repeats} jobs per configuration",
        report.table(["link", "shorter step", "cluster / spread"], answers),
        report.table(header, every),
    )  # fmt: skip


BENCH = Benchmark("hosts", __doc__.splitlines()[0], Settings(), QUICK, measure, render)

if __name__ == "__main__":
    run(BENCH)
