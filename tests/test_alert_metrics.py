"""The metrics the on-call alerts (alerts/gpuq.rules.yml) read, on real objects: the scheduler's
wait histogram and oldest pending wait, the accounting's rejected queue file, the writer's refused
inserts (a real chDB store whose table is gone)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from accounting.metrics import AccountingCollector
from accounting.queues import parse_queue_config
from collector.health import CollectorMetrics
from gpuq.store.writer import BatchWriter
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting
from scheduler.service.metrics import SchedulerCollector
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl

QUEUES = {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 8}}, "b": {"guaranteed": {"gpu": 8}}}


def scrape(*collectors: object) -> str:
    reg = CollectorRegistry()
    for c in collectors:
        reg.register(c)  # type: ignore[arg-type]
    return generate_latest(reg).decode()


def test_scheduler_exports_first_admission_waits_and_the_oldest_pending_wait() -> None:
    svc = SchedulerService(parse_queue_config({"queues": QUEUES}), DryRunActuator(),
                           nodes=nodes(("h", "H100", 8, 2)), settings=Settings(True, 30.0),
                           cluster="c1", sleep=lambda s: None)
    svc.submit(wl("a1", "a", 8, 1, submit_s=0.0), Target(), 0.0)
    svc.submit(wl("a2", "a", 8, 1, submit_s=10.0), Target(), 10.0)      # over a's max: waits
    svc.submit(wl("b1", "b", 8, 1, submit_s=100.0), Target(), 100.0)
    assert "gpuq_scheduler_oldest_pending_seconds{" not in scrape(SchedulerCollector(svc))   # no cycle yet
    svc.cycle(400.0)                    # a1 waited 400 s, b1 300 s; a2 stays pending
    text = scrape(SchedulerCollector(svc))
    for line in ('gpuq_scheduler_wait_seconds_bucket{le="300.0",queue="a"} 0.0',
                 'gpuq_scheduler_wait_seconds_bucket{le="600.0",queue="a"} 1.0',
                 'gpuq_scheduler_wait_seconds_bucket{le="300.0",queue="b"} 1.0',
                 'gpuq_scheduler_wait_seconds_count{queue="a"} 1.0',
                 'gpuq_scheduler_wait_seconds_sum{queue="a"} 400.0',
                 'gpuq_scheduler_oldest_pending_seconds{queue="a"} 390.0',
                 'gpuq_scheduler_last_cycle_timestamp_seconds 400.0'):
        assert line in text, line
    assert 'gpuq_scheduler_oldest_pending_seconds{queue="b"}' not in text
    svc.finish("a1", 500.0)
    svc.cycle(500.0)                    # a2 admitted after 490 s
    text = scrape(SchedulerCollector(svc))
    assert 'gpuq_scheduler_wait_seconds_count{queue="a"} 2.0' in text
    assert 'gpuq_scheduler_wait_seconds_sum{queue="a"} 890.0' in text
    assert "gpuq_scheduler_oldest_pending_seconds{" not in text


def test_rejected_queue_file_is_exported_while_the_last_good_one_stays(tmp_path: Path) -> None:
    qf = tmp_path / "queues.yaml"
    qf.write_text("queues:\n  a: {guaranteed: {gpu: 8}}\n")
    live = LiveAccounting(None, queues_file=str(qf))
    assert "gpuq_accounting_queue_config_rejected 0.0" in scrape(live.collector)
    qf.write_text("queues:\n  a: {guaranteed: {gpu: -1}\n")            # broken YAML
    live.reload()
    assert live.error and "a" in live.config.queues
    assert "gpuq_accounting_queue_config_rejected 1.0" in scrape(live.collector)
    qf.write_text("queues:\n  a: {guaranteed: {gpu: 4}}\n")
    live.reload()
    assert "gpuq_accounting_queue_config_rejected 0.0" in scrape(live.collector)
    assert "gpuq_accounting_queue_config_rejected" not in scrape(AccountingCollector())   # no queue file


def test_writer_counts_inserts_the_store_refuses(store, tmp_path: Path) -> None:
    now = dt.datetime.now(dt.timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0) - dt.timedelta(days=1)
    w = BatchWriter(store, tmp_path / "spill")
    reg = CollectorRegistry()
    CollectorMetrics(reg, w)
    w.write("ray_resources", [(now, "c", "n", "GPU", "USED", 1.0)])
    w.flush()
    assert 'gpuq_collector_rows_refused_total{table="ray_resources"} 0.0' in generate_latest(reg).decode()
    store.command(f"RENAME TABLE {store.database}.ray_resources TO {store.database}.ray_resources_gone")
    w.write("ray_resources", [(now, "c", "n", "GPU", "USED", 2.0)])      # the table is gone: refused
    w.flush()
    text = generate_latest(reg).decode()
    assert 'gpuq_collector_rows_refused_total{table="ray_resources"} 1.0' in text
    assert w.spilled_files() == 1                    # the refused rows stay on disk for a human
    w.flush()                                        # refused again at the replay: counted once
    assert 'gpuq_collector_rows_refused_total{table="ray_resources"} 1.0' in generate_latest(reg).decode()
    store.command(f"RENAME TABLE {store.database}.ray_resources_gone TO {store.database}.ray_resources")
    assert w.replay() == 1 and w.spilled_files() == 0
