"""``python -m collsim``: the same command line as the ``collsim`` script."""

from collsim.cli import main

main()
