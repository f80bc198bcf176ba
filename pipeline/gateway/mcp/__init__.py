"""The MCP door (docs/behaviour.md §9): agents reached through the Model Context Protocol.

- `tools`: the five tools (schemas, descriptions) on the official SDK's `MCPServer`;
- `door`: what the tools do, over the gateway's producer, outcome follower and journal mirror;
- `turns`: what `send_message` appends and waits for, and `read_events`' window (pure);
- `http`: streamable HTTP at `/mcp` on the gateway, behind its bearer tokens;
- `stdio`: `agentstream mcp`, the same tools over stdio for a local client.
"""
