"""``gpuq import-queues``: the queues of the scheduler a cluster already runs, as a gpuq queue file
(issue 20). Pure: the importers take parsed objects and give an
:class:`~accounting.queue_import.report.Imported` (the queue file's mapping, where each queue came
from, and one :class:`~accounting.queue_import.report.Finding` per thing not carried over
exactly); :mod:`accounting.queue_import.cli` reads the files and writes the result.

* :func:`~accounting.queue_import.kueue.from_kueue`: Kueue's ResourceFlavors, Cohorts,
  ClusterQueues and LocalQueues (docs/KUEUE.md);
* :func:`~accounting.queue_import.yunikorn.from_yunikorn`: a YuniKorn partition's queue tree
  (docs/YUNIKORN.md).
"""
from __future__ import annotations

from accounting.errors import QueueImportError
from accounting.queue_import.report import Finding, Imported, Located, render_yaml

__all__ = ["Finding", "Imported", "Located", "QueueImportError", "render_yaml"]
