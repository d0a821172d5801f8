-- What a preemption cost (issue 21): the GPU-seconds of work each preempt event threw away (the
-- victim's GPUs times the time since its start, or since the last checkpoint it reported in that
-- run). Rows written before hold 0: their cost was not recorded.
ALTER TABLE {db}.scheduler_events ADD COLUMN IF NOT EXISTS lost_gpu_seconds Float64 DEFAULT 0
