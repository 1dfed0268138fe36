"""``python -m jaxbridge``: what this installation can do, and a one-line verdict."""

import sys

from ._info import main

sys.exit(main())
