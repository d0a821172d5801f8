"""``gpuq demo`` (``make demo``): a local Ray cluster of logical GPUs, a served DCGM page,
``gpuq serve`` with the ray actuator, the dashboards, and a story of teams, preemption, a gang and an
idle allocation told over the API. :mod:`gpuq.demo.run` is the command; :mod:`gpuq.demo.session`
starts and stops; :mod:`gpuq.demo.story` is the timeline."""
