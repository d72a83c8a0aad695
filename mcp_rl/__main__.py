"""`python -m mcp_rl ...`: see mcp_rl/cli.py."""

import sys

from mcp_rl.cli import main

sys.exit(main())
