"""Campaigns: many runs, planned from a grid, resumed, bounded by a budget, and reported.

Three packages, three scales, from the top down:

- ``dcp_bench.campaign`` (here): many runs. `sweep` expands a grid of overrides into run specs
  and runs them locally (forked processes or torchrun, resume, deadlines); `slurm` submits the
  same runs as a Slurm job array; `launch` is a sweep from its command line (plan, list or run,
  sum up); `reproduce_config` reads the reproduction's YAML into typed sections; `reproduce`
  runs those sections under their budgets and writes the report. The commands (`sweep`,
  `reproduce`) parse their arguments and call one function here.
- ``dcp_bench.run``: one run. A composed config parsed into a frozen `RunSpec`, its parts
  assembled, and the one step loop on either executor (simulated or under torchrun), written as
  one run record.
- ``dcp_bench.runtime``: the torch execution of one rank inside a real run (process-group pool,
  sequence-parallel attention, models, training states, the executor).
"""
