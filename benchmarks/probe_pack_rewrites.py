"""Rewrites of the generated masked pack, for `probe_pack_mask.py --compare` (fortieth pass; none adopted).

Each variant rewrites the text of `generated/<spec>.py` (the DCP lse and (max, sum) specs whose rows are whole
along the pack's stored vectors) and writes it to OUT/<spec>.py; the unmasked pack and the combine are left as
they are, so the probe's byte check and timing weigh one change at a time:

* `over`: the values are stored whatever the flag, and zeros are stored over the empty rows after them (the
  first store no longer waits for the flag; a thread's two stores to one address land in program order);
* `oneflag`: one flag load per row of the tile, broadcast to the payload and the stats tiles (the committed
  pack loads it once per tile shape);
* `both`: `over` and `oneflag` together;
* `split`: two programs per tile, one storing the live rows (values and stats) and one the empty rows (zeros
  and the empty stats), the grid's batch axis doubled for a masked call below the skip threshold;
* `gate`: the stats' flag loaded only by the programs that store the stats (the first dim block).

Usage: python benchmarks/probe_pack_rewrites.py VARIANT OUT [--spec NAME ...]
Then (GPU): python benchmarks/probe_pack_mask.py --compare VARIANT=OUT --spec NAME ... --point N:B:H:D ...
Results: benchmarks/results/archive/probe_pack_{over,oneflag,both,split_1,split_2,gate_1,gate_2}_H100.json
(notes_H200.md, fortieth pass).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPECS = ("trtllm_helix_native_v2", "trtllm_helix_nccl", "flashinfer_mnnvl", "vllm_a2a", "pynccl_a2a")
TWO_STORES = (
    "        tl.store(destination, values, mask=mask & ~row_empty)\n"
    "        tl.store(destination, tl.zeros_like(values), mask=mask & row_empty)\n"
)
STATS_FLAG_MASK = "(batch_3d // TOKENS) * empty_stride, mask=batch_3d < batch_size, other=0)"


def replace_once(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise ValueError(f"expected one {old.strip()[:60]!r} in the module, found {text.count(old)}")
    return text.replace(old, new)


def over(text: str) -> str:
    return replace_once(
        text,
        TWO_STORES,
        "        tl.store(destination, values, mask=mask)\n"
        "        tl.store(destination, tl.zeros_like(values), mask=mask & row_empty)\n",
    )


def oneflag(text: str) -> str:
    expand4 = re.search(r"    batch_4d = batch(\[[^\n]*\])\n", text)
    expand3 = re.search(r"    batch_3d = batch(\[[^\n]*\])\n", text)
    if not (expand4 and expand3):
        raise ValueError("the module's batch_4d and batch_3d are not plain expansions of batch")
    loads = re.search(r"        row_empty = tl\.load\([^\n]*\n        stats_row_empty = tl\.load\([^\n]*\n", text)
    if not loads:
        raise ValueError("the module's two flag loads were not found")
    flag = (
        "        row_flag = tl.load(empty_ptr + (batch // TOKENS) * empty_stride, mask=batch < batch_size, other=0)\n"
        f"        row_empty = row_flag{expand4.group(1)}\n"
        f"        stats_row_empty = row_flag{expand3.group(1)}\n"
    )
    return text[: loads.start()] + flag + text[loads.end() :]


def both(text: str) -> str:
    return oneflag(over(text))


def split(text: str) -> str:
    text = replace_once(
        text,
        "    batch_block = tl.program_id(1)\n",
        "    batch_block = tl.program_id(1)\n"
        "    live_role = True\n"
        "    if HAS_EMPTY and not SKIP_EMPTY_READS:\n"
        "        live_role = batch_block % 2 == 0\n"
        "        batch_block = batch_block // 2\n",
    )
    text = replace_once(
        text,
        "    lse_values = tl.load(lse_source, mask=lse_mask)\n",
        "    lse_values = tl.load(lse_source, mask=lse_mask & live_role)\n",
    )
    text = replace_once(
        text,
        "        values = tl.load(source, mask=mask).to(payload_ptr.dtype.element_ty)\n",
        "        values = tl.load(source, mask=mask & live_role).to(payload_ptr.dtype.element_ty)\n",
    )
    block = re.search(
        r"    if HAS_EMPTY and not SKIP_EMPTY_READS:\n(?:        #[^\n]*\n)*"
        + re.escape(TWO_STORES)
        + r"    else:\n        tl\.store\(destination, values, mask=mask\)\n((?:    tl\.store\([^\n]*mask=lse_mask\)\n)+)",
        text,
    )
    if not block:
        raise ValueError("the module's masked store block was not found")
    stats = [line.strip() for line in block.group(1).splitlines()]

    def stats_lines(indent: str, row_mask: str) -> str:
        return "".join(f"{indent}{line.replace('mask=lse_mask)', f'mask=lse_mask{row_mask})')}\n" for line in stats)

    rewritten = (
        "    if HAS_EMPTY and not SKIP_EMPTY_READS:\n"
        "        if live_role:\n"
        "            tl.store(destination, values, mask=mask & ~row_empty)\n"
        + stats_lines("            ", " & ~stats_row_empty")
        + "        else:\n"
        "            tl.store(destination, tl.zeros_like(values), mask=mask & row_empty)\n"
        + stats_lines("            ", " & stats_row_empty")
        + "    else:\n"
        "        tl.store(destination, values, mask=mask)\n" + stats_lines("        ", "")
    )
    text = text[: block.start()] + rewritten + text[block.end() :]
    # The launcher's own choice of the skipping form, hoisted above the grid so that the grid can follow it.
    skip = re.search(r"\n        SKIP_EMPTY_READS=([^\n]*),\n", text)
    if not skip:
        raise ValueError("the launcher's SKIP_EMPTY_READS argument was not found")
    text = text[: skip.start()] + "\n        SKIP_EMPTY_READS=skip_empty_reads,\n" + text[skip.end() :]
    text = replace_once(
        text,
        "    grid = (\n",
        f"    skip_empty_reads = {skip.group(1)}\n"
        "    split = 2 if empty is not None and not skip_empty_reads else 1\n"
        "    grid = (\n",
    )
    return replace_once(text, "        batch_blocks,\n    ", "        batch_blocks * split,\n    ")


def gate(text: str) -> str:
    return replace_once(text, STATS_FLAG_MASK, "(batch_3d // TOKENS) * empty_stride, mask=lse_mask, other=0)")


VARIANTS: dict[str, Callable[[str], str]] = {
    "over": over,
    "oneflag": oneflag,
    "both": both,
    "split": split,
    "gate": gate,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("out", type=Path, help="folder for the rewritten modules")
    parser.add_argument("--spec", action="append", help=f"a bundled spec (repeatable; default: {', '.join(SPECS)})")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.spec or SPECS:
        text = (REPO / "generated" / f"{name}.py").read_text(encoding="utf-8")
        try:
            rewritten = VARIANTS[args.variant](text)
        except ValueError as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 1
        (args.out / f"{name}.py").write_text(rewritten, encoding="utf-8")
    print(f"{args.variant}: {len(args.spec or SPECS)} module(s) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
