"""`python -m app.cli`: the same as the `kvchat` command."""

from app.cli.main import run

if __name__ == "__main__":  # not when a spawned child process (the serve bench's clients) imports it
    run()
