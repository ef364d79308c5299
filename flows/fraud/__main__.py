"""``python -m flows.fraud {train,adapt,score,batch,tune}``."""

import sys

from flows.fraud.cli import main

sys.exit(main())
