"""`python -m normlab ...` (as `torchrun -m normlab train ...` needs): the command line."""

from normlab.cli import main

main()
