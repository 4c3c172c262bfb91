"""`python -m layoutgen.tuning.worker INDEX OPTIONS_JSON`: one tuning worker (one GPU) of a run."""

from __future__ import annotations

import sys

from layoutgen.tuning.runner import worker_main

if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
