"""company-db: the read-only MCP server over the company SQLite database (departments, employees, projects).

Its code is the company environment's, in mcp_rl/environments/company/server.py; this file runs it.

    python mcp_server.py                                   # stdio
    python mcp_server.py --transport http --port 8000      # streamable HTTP on 127.0.0.1:8000/mcp
"""

from mcp_rl.environments.company.server import CompanyDB, build_server, format_table, main

__all__ = ["CompanyDB", "build_server", "format_table", "main"]


if __name__ == "__main__":
    main()
