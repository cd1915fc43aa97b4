import sys

from nsc_prune.cli import main

sys.exit(main())
