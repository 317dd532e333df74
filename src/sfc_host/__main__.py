import sys

from sfc_host.cli import main

sys.exit(main())
