"""`python -m mcp_rl ...`: see mcp_rl/cli.py."""

import sys

from .cli import main

sys.exit(main())
