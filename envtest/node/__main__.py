"""`python -m envtest.node up|check`: a full local cluster plus a real node, or the preflight."""

import sys

from envtest.node.localnode import main

sys.exit(main())
