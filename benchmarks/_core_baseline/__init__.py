"""A frozen copy of the scheduler core as of commit 392f039 (before issue 11), the peer the backlog
benchmark measures the current core against in the same run. Only the import lines differ from
that commit (they point here), and where it kept its memo: on ``cluster.memo``, a dict then, now
the current core's typed ``scheduler.memo.CycleMemo``, so it keeps its dict beside the cluster
(``cycle._memo``, for the last cluster it saw). It shares scheduler.model, scheduler.snapshot and
scheduler.errors."""
