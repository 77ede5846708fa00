"""``python -m gradzip``: the ``gradzip`` command."""

import sys

from gradzip.cli import main

sys.exit(main())
