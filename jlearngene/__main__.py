import sys

from jlearngene.cli import main

sys.exit(main())
