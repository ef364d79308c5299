import sys

from flows.rag.cli import main

sys.exit(main())
