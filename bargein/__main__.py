"""``python -m bargein``: the ``bargein`` command line."""

import sys

from bargein.app.cli import main

sys.exit(main())
