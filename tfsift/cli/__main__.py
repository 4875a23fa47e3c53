"""``python -m tfsift.cli``: the ``tfsift`` command."""

import sys

from tfsift.cli.main import main

sys.exit(main())
