"""`python -m gateway.cli`: the same as the `gatehouse` script."""

from gateway.cli import main

main()
