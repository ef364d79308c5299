"""``python -m flows.sensor``."""

import sys

from flows.sensor.cli import main

sys.exit(main())
