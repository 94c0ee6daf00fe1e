"""`python -m oospec ...`: the `oospec` command."""

import sys

from oospec.cli import main

sys.exit(main())
