"""`python -m peerdsl ...`: the same command line as the `peerdsl` script."""
import sys

from .cli import main

sys.exit(main())
