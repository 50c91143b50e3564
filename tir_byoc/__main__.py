"""``python -m tir_byoc``: the ``tir-byoc`` command line (see :mod:`tir_byoc.cli`)."""

import sys

from .cli import main

sys.exit(main())
