"""The reply of a turn: its events cut where its chat format ends a reply, recorded as they arrive (text,
ids, timeline) into its row, its numbers as one record and the texts made of them, the chat's limits on
its length, and several alternatives written at once with their decode rates."""
