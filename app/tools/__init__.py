"""Tools: what a model may call (function calling), where the tools come from (MCP servers: tools/mcp/),
how each model family writes a call (tools/formats/) and what kvchat does with a call's result."""
