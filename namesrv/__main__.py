import sys

from namesrv.server import main

sys.exit(main())
