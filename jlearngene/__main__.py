"""`python -m jlearngene ...`: the command line (`jlearngene.cli.main`)."""
import sys

from jlearngene.cli import main

sys.exit(main())
