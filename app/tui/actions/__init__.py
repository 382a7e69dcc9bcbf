"""The chat app's actions, by what they act on: the reply, the panels, the conversation library."""
