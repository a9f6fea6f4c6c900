"""`python -m offsetlake.cli`: the `offsetlake` command."""

import sys

from offsetlake.cli import main

sys.exit(main())
