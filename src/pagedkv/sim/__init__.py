"""Trace-driven simulation: trace readers, the scheduler loop, metrics, the bound, sweeps."""

from pagedkv.sim.planned import PlanInputs, plan_with_num_blocks
from pagedkv.sim.reports.bound import AccessLog, BoundResult, belady_bound
from pagedkv.sim.reports.metrics import SimResult
from pagedkv.sim.run import SweepPoint, simulate, sweep, sweep_sizes
from pagedkv.sim.scheduling.scheduler import SchedulerSettings, SimulationError
from pagedkv.sim.scheduling.simulator import Simulator
from pagedkv.sim.setup import SimSetup, setup_from_model, setup_from_plan
from pagedkv.sim.traces.bundled import list_bundled_traces, load_trace
from pagedkv.sim.traces.readers import read_azure, read_mooncake
from pagedkv.sim.traces.synthetic import SyntheticTraceConfig, synthetic_trace
from pagedkv.sim.traces.trace import Segment, Trace, TraceRequest

__all__ = [
    "AccessLog",
    "BoundResult",
    "PlanInputs",
    "Segment",
    "SchedulerSettings",
    "SimSetup",
    "SimResult",
    "SimulationError",
    "Simulator",
    "SweepPoint",
    "SyntheticTraceConfig",
    "Trace",
    "TraceRequest",
    "belady_bound",
    "setup_from_model",
    "setup_from_plan",
    "list_bundled_traces",
    "load_trace",
    "plan_with_num_blocks",
    "read_azure",
    "read_mooncake",
    "simulate",
    "sweep",
    "sweep_sizes",
    "synthetic_trace",
]
