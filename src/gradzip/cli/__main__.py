"""``python -m gradzip.cli``: the ``gradzip`` command (what ``torchrun -m gradzip.cli`` runs)."""

import sys

from gradzip.cli import main

sys.exit(main())
