import sys

from firstfault.cli import main

sys.exit(main())
