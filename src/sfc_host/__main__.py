import sys

from sfc_host.cli.main import main

sys.exit(main())
