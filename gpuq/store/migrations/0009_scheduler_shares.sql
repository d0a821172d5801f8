-- Shares of one GPU in the scheduler's events (issue 19). placement_milli holds GPUs per node in
-- milli-GPUs and is what readers read: rows written before it get placement x 1000 (computed on
-- read at once, then written into their parts). A gang of shares (gpus_per_pod below 1) leaves
-- placement (whole GPUs, UInt32) empty. shares holds such a gang's device slots as JSON,
-- [[node, slot, share], ...] (scheduler.model.Placement.shares), '' for whole gangs.
ALTER TABLE {db}.scheduler_events ADD COLUMN IF NOT EXISTS placement_milli Map(String, UInt32) DEFAULT mapApply((k, v) -> (k, toUInt32(v * 1000)), placement);
ALTER TABLE {db}.scheduler_events ADD COLUMN IF NOT EXISTS shares String DEFAULT '' CODEC(ZSTD(1));
ALTER TABLE {db}.scheduler_events MATERIALIZE COLUMN placement_milli
