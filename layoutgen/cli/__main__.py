"""`python -m layoutgen.cli`: the same as the `layoutgen` command."""

from layoutgen.cli import main

main()
