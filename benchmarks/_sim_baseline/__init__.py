"""A frozen copy of the simulator's shell as of commit a707389 (before issue 18): the YAML loader
(gpuq/yamlsafe.py: PyYAML's C loader with the alias bound), the scenario reader, the simulated
clock and the report (scheduler/simulator/{scenario,engine,report}.py). benchmarks.bench_simulate
measures today's shell against it in the same run, both around today's scheduler core. Only the
import lines differ from that commit (they point here)."""
