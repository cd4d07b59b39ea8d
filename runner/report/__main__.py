"""``python -m runner.report DIR``: see :mod:`runner.report`."""
import sys

from . import main

sys.exit(main())
