"""``python -m app.experiments``: same as ``dpquant experiments``."""

import sys

from app.experiments.cli import main

if __name__ == "__main__":
    sys.exit(main())
