import sys

from flows.compress.cli import main

sys.exit(main())
