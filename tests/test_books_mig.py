"""MIG admissions in the books (issue 19): gpuq's admission row of a MIG type is billed the slices'
fraction of their GPU from the admit, as the slices' pods will be, and still counts the slices it
placed. Through chDB (``accounting.sql``) and serve's ``LiveAccounting``/``check_books``: the "now"
view counts what the scheduler placed, the audit finds no difference, and the bill over a window is
the same whether the pods were seen or only the admission was (conservation: share x time,
computed here from the profile table)."""
from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from accounting.ledger import admission_rows, combine
from accounting.intervals import running
from accounting.model import Allocation, Window
from accounting.queues import parse_queue_config
from accounting.store_adapter import read_allocations, read_usage
from gpuq.gpu_share import mig_fraction
from gpuq.store.schema import COLUMNS
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.model import Node
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting, check_books
from scheduler.service.ledger import admission_store_row
from scheduler.snapshot import Settings
from scheduler.testing import wl
from tests.accounting_helpers import T0

PRODUCT = "NVIDIA-A100-SXM4-80GB"
SLICE = f"{PRODUCT}-MIG-1g.10gb"                  # the collector's model of a pod's 1g.10gb slice
CONFIG = parse_queue_config({
    "gpu_types": {"A100": {"price_per_hour": 7.0, "node_labels": [PRODUCT]}, "A100-mig-1g.10gb": {}},
    "queues": {"a": {"guaranteed": {"gpu": 7}}}})
CLUSTER, NS = "c", "ml"
NODES = (Node("m-0", "A100-mig-1g.10gb", 7),)
SHARE = mig_fraction(PRODUCT, "1g.10gb")          # 1/7, the MIG User Guide's table (gpuq.gpu_share)


def test_an_admission_of_slices_is_billed_their_fraction() -> None:
    (row,) = admission_rows("w", "a", cluster=CLUSTER, namespace=NS, gpu_type="A100-mig-1g.10gb",
                            placement={"m-0": 3}, start_s=T0, mig_model=CONFIG.mig_model("A100-mig-1g.10gb"))
    assert (row.gpu_model, row.milli_gpus, row.counted_milli) == (SLICE, 428, 3000)   # floor(3/7 x 1000)
    (whole,) = admission_rows("w", "a", cluster=CLUSTER, namespace=NS, gpu_type="A100", placement={"a-0": 2},
                              start_s=T0, mig_model=CONFIG.mig_model("A100"))
    assert (whole.gpu_model, whole.milli_gpus, whole.counted_milli) == ("A100", 2000, 2000)
    assert CONFIG.mig_model(SLICE) == SLICE and CONFIG.mig_model("H100") == ""


@pytest.mark.parametrize("pods_seen", [False, True], ids=["admission-only", "pods-seen-later"])
def test_the_books_balance_with_mig_admissions(store: Any, pods_seen: bool) -> None:
    sink: list[tuple[str, list[Any]]] = []

    class Sink:
        def write(self, table: str, rows: Any) -> None:
            sink.append((table, list(rows)))

    svc = SchedulerService(CONFIG, DryRunActuator(), nodes=NODES, settings=Settings(True, 0.0), cluster=CLUSTER,
                           sleep=lambda s: None, sink=Sink())
    live = LiveAccounting(store, config=CONFIG, declared=())
    live.follow(svc)
    try:
        svc.submit(wl("w", "a", 1, pods=3, types=("A100-mig-1g.10gb",), submit_s=T0), Target("RayJob", NS, "w"), T0)
        svc.cycle(T0)
        assert svc.state_of("w") == "running"
        (adm,) = svc.admitted_allocations()
        assert (adm.gpu_model, adm.milli_gpus, adm.counted_milli) == (SLICE, 428, 3000)
        seen = T0 + 600.0
        if pods_seen:       # the collector's three pods, each billed its slice (collector.k8s_extract)
            pods = [Allocation(CLUSTER, NS, f"w-{i}", f"pod-w-{i}", "a", "m-0", SLICE, 142, seen, None,
                               "nvidia.com/mig-1g.10gb", source="pod", workload_id="w", owner_kind="RayJob",
                               owner="w") for i in range(3)]
            store.insert("gpu_allocations", [_pod_row(p) for p in pods], COLUMNS["gpu_allocations"])
        store.insert("gpu_allocations", [admission_store_row(adm)], COLUMNS["gpu_allocations"])
        now = T0 + 3600.0
        r = live.refresh(now)
        view = live.live_view()
        assert view is not None
        held = {(row.queue, row.gpu_type): row.allocated for row in view.rows}
        assert held[("a", "A100-mig-1g.10gb")] == 3                      # slices, as placed
        assert check_books(live, svc, r, now) == ()
        got = read_allocations(store, Window(now - 1, now), now)
        assert sum(a.counted_milli for a in running(combine(got, svc.admitted_allocations()), now)) == 3000
        # the bill: 3 slices x 1/7 from the admit (rounded down as billed), seen or not
        billed = sum(u.gpu_seconds for u in read_usage(store, Window(T0, now), now))
        by_share = float(Fraction(3) * SHARE) * 3600.0
        rounded = (0.428 if not pods_seen else (0.428 * 600 + 0.426 * 3000) / 3600) * 3600.0
        assert billed == pytest.approx(rounded, abs=1e-3)
        assert abs(billed - by_share) < 0.01 * by_share and billed < 1.0 * 3600      # never a whole GPU a slice
    finally:
        svc.close()


def _pod_row(a: Allocation) -> tuple[Any, ...]:
    from tests.test_books_conservation import to_row, version

    return to_row(version(a), a)
