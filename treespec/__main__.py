"""``python -m treespec``: the ``treespec`` command, for an environment whose scripts are not on ``PATH``."""

import sys

from .cli import main

sys.exit(main())
