"""The Textual chat app: the app, its actions, the engine thread, widgets and screens."""
