"""A conversation as it is kept: SavedConversation (its rows, turns and branches in the database), the
reply's row written while it streams, its K/V blocks to and from the block store, and the saved
conversations exported or deleted as the command line and the chat app both act on them."""
