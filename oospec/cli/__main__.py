"""`python -m oospec.cli ...`: the `oospec` command."""

import sys

from oospec.cli import main

sys.exit(main())
