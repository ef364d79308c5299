import sys

from flows.registry.cli import main

sys.exit(main())
