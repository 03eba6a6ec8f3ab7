"""benchmarks/profile/step_ops.py's sums and timeline, on hand-made op events."""

import importlib.util
import os

from tests.conftest import REPO_ROOT

_SPEC = importlib.util.spec_from_file_location(
    "step_ops", os.path.join(REPO_ROOT, "benchmarks", "profile", "step_ops.py")
)
step_ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(step_ops)

# (start ms, end ms, op name, op type, thread id), as op_events returns them
EVENTS = [
    (10.0, 12.5, "conv1/Relu", "_MklNativeFusedConv2D", 7),
    (12.5, 40.0, "primary/MatMul", "_MklMatMul", 7),
    (41.0, 51.0, "XLA-compiled function", "XLA", 7),
    (41.5, 50.0, "XLA-compiled function", "XLA", 9),
    (52.0, 52.4, "adam/ResourceApplyAdam", "ResourceApplyAdam", 9),
]


def test_op_times_sum_duration_and_calls_per_op():
    totals = step_ops.op_times(EVENTS)
    assert totals[("XLA-compiled function", "XLA")] == [10.0 + 8.5, 2]
    assert totals[("primary/MatMul", "_MklMatMul")] == [27.5, 1]
    assert len(totals) == 4


def test_timeline_keeps_long_ops_in_order_and_numbers_threads():
    rows, span = step_ops.timeline(EVENTS, shortest_ms=1.0)
    assert span == 52.4 - 10.0
    body = rows[2:]
    assert len(body) == 4  # the 0.4 ms Adam row is below the threshold
    assert body[0] == "| 0.0 | 2.5 | 2.5 | 1 | `conv1/Relu` | _MklNativeFusedConv2D |"
    assert body[3] == "| 31.5 | 40.0 | 8.5 | 2 | `XLA-compiled function` | XLA |"
