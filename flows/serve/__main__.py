"""``python -m flows.serve [--host H --port P]`` and ``python -m flows.serve keys add|list|revoke``."""

import sys

from flows.serve.cli import main

sys.exit(main())
