"""Modal screens of the chat app: settings, help, confirmations, text prompts."""
