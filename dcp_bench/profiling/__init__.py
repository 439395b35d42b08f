"""The profiler: measures per-layer time and activation memory and collective times on the
hardware it runs on, and writes a profile artifact the ``profiled`` cost model reads.

- `artifact`: the artifact's schema, reading and hashing;
- `fit`: the size laws fitted to measured grid points;
- `measure`: timing and saved-activation bytes of one module;
- `collectives`: all-to-all and all-reduce timings per group size;
- `layers`: the runtime's layers as profiling cases;
- `ceilings`: matmul and copy ceilings (GPU calibration);
- `run`: spawning the ranks and assembling the artifact.
"""
