"""``python -m firstfault``: the same as the ``firstfault`` command."""
import sys

from firstfault.cli import main

sys.exit(main())
