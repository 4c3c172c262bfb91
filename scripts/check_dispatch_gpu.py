"""On a GPU: dispatch resolves every entry of this device's committed tuning database to the entry's config.

    python scripts/check_dispatch_gpu.py        # exit 0 when every entry is chosen as recorded

The check behind "dispatch picks the same configs as before" after a database migration: a stale entry
(another spec, kernel source, search space, timing procedure, triton or torch) would warn and fall back.
"""

from __future__ import annotations

import sys
import warnings

import torch

from layoutgen.family import get_family
from layoutgen.loader import load
from layoutgen.runtime import LayoutgenWarning, configs
from layoutgen.tuning_db import device_file_name, entry_versions, read_database


def main() -> int:
    device = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(device)
    database = read_database(configs.packaged_database_dir() / device_file_name(name))
    print(f"device {name}, {entry_versions()}", flush=True)
    same = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutgenWarning)
        for entry in database.entries.values():
            key = entry.key
            module = load(key.spec)
            decl = get_family(key.family).kernel(key.kernel)
            chosen = configs.resolve_config(
                key.family, key.spec, decl, device, dict(key.extents), key.dtype, key.bucket,
                module.SPEC_HASH, module.SOURCE_HASHES[key.kernel], lambda: None,
            )  # fmt: skip
            same += chosen is not None and chosen.as_dict() == entry.config
    print(f"dispatch on the GPU picks the committed config for {same} of {len(database.entries)} entries")
    return 0 if same == len(database.entries) else 1


if __name__ == "__main__":
    sys.exit(main())
