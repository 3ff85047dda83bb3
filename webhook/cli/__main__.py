"""`python -m webhook.cli`: the same as the `dra-guard` console script."""

import sys

from webhook.cli import main

sys.exit(main())
