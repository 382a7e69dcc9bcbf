"""`kvchat bench`: the engine, chat-app and server measurements (never imported by the product)."""
