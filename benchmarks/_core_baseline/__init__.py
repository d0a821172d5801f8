"""A frozen copy of the scheduler core as of commit 392f039 (before issue 11), the peer the backlog
benchmark measures the current core against in the same run. Only the import lines differ from
that commit (they point here); it shares scheduler.model, scheduler.snapshot and scheduler.errors."""
