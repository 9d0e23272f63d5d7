"""`python -m engine.cli`: the `funnel` command."""

import sys

from . import main

sys.exit(main())
