"""`layoutgen tune`: Optuna search of launch configs per GPU, into the tuning database.

* `space`     the declared search spaces per kernel and the constraints that prune them
* `plan`      run options, the default grid, targets and deterministic study names
* `compile`   ahead-of-time compiles on a process pool, into Triton's cache
* `objective` one trial: compile -> correctness gate against the reference -> timing
* `timing`    CUDA-graph replay timing (GPU) and a wall-clock timer (interpreter)
* `study`     Optuna studies: prepare, search a family of buckets, finalize the decision
* `storage`   the journal file / Optuna storage URL
* `runner`    a whole run: workers, progress, database write, tables (`report`)

Importing this package is cheap: the submodules import torch, Triton and Optuna.
"""
