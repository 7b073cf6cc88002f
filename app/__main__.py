"""``python -m app``: the ``bargein`` command line."""

import sys

from app.cli import main

sys.exit(main())
