"""`layoutgen tune`: Optuna search of launch configs per GPU, into the tuning database, for any family.

* `problem`   what is tuned: (spec, kernel, shape as named extents, dtype) per size bucket
* `space`     a kernel's declared search space bound to a problem, and the rules that prune it
* `procedure` the timing procedure as data, and the hashes entries are current against
* `plan`      run options, targets from the families' grids, deterministic study names
* `compile`   ahead-of-time compiles on a process pool, into Triton's cache
* `objective` one trial: compile -> correctness gate (the family's workload) -> timing
* `timing`    CUDA-graph replay timing (GPU) and a wall-clock timer (interpreter)
* `prepare`   create or load a study, its seeds
* `claims`    the multi-worker claim protocol
* `search`    the search of one compiled family of studies
* `decision`  the final re-timing and what the database gets
* `context`, `worker`, `runner`, `results`, `report`, `storage`: a whole run

Importing this package is cheap: the submodules import torch, Triton and Optuna.
"""
