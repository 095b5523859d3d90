"""``python -m convgrad``: the same command as the ``convgrad`` executable (see convgrad.cli)."""

import sys

from .cli import main

sys.exit(main())
