"""mcp-server-time, unmodified: the uv bundle's entry point runs its main."""

from mcp_server_time import main

main()
