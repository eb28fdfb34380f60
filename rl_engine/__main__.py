"""Entry point: ``python -m rl_engine <command>`` (see ``rl_engine.cli``)."""

import sys

from rl_engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
