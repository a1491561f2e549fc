"""``python -m sinkscope`` runs the command-line interface."""

from sinkscope.cli.application import app

if __name__ == "__main__":
    app(prog_name="sinkscope")
