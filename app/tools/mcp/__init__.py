"""MCP (Model Context Protocol) servers' tools, through the official SDK: the config that names the servers
(settings.py, mcp_json.py), their processes and transports (server_process.py, stdio_transport.py,
http_transport.py), one server's life (connection.py), the names the model calls tools by (tool_names.py),
what a result becomes before the model reads it (result_text.py, safe_text.py), and McpHub (hub.py), the
synchronous face the chat and `kvchat ask` use."""
