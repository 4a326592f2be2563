"""``python -m simulator`` runs the ``ccsim`` command line."""

import sys

from .cli import main

sys.exit(main())
