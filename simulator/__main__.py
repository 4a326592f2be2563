"""``python -m simulator`` runs the ``ccsim`` command line."""

import sys

from .cli.main import main

sys.exit(main())
