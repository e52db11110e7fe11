import sys

from broker.server import main

sys.exit(main())
