-- GPUs counted in milli-GPUs (issue 16; docs/SCHEMA.md, "The ledger's unit"). milli_gpus is the
-- ledger's count, in thousandths of a GPU, read by everything (accounting.sql); writers send gpus
-- (GPUs, at most three decimals: Kubernetes milli-units, Ray's fractions) and the store derives
-- milli_gpus at insert. gpus stays for queries written before. Rows written before this migration
-- get the same value: computed on read at once, then written into their parts (MATERIALIZE COLUMN).
ALTER TABLE {db}.gpu_allocations ADD COLUMN IF NOT EXISTS milli_gpus UInt32 DEFAULT toUInt32(round(gpus * 1000)) AFTER gpus;
ALTER TABLE {db}.gpu_allocations_open ADD COLUMN IF NOT EXISTS milli_gpus UInt32 DEFAULT toUInt32(round(gpus * 1000)) AFTER gpus;
ALTER TABLE {db}.gpu_allocations MATERIALIZE COLUMN milli_gpus;
ALTER TABLE {db}.gpu_allocations_open MATERIALIZE COLUMN milli_gpus
