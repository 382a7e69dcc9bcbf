"""`python -m app.cli`: the same as the `kvchat` command."""

from app.cli.main import run

run()
