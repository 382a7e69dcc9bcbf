"""The K/V snapshot files of a kvchat from before the block store (snapshots/<conversation id>.safetensors),
fenced off: the reader (snapshots.py, snapshot_dir.py) and their migration into the block store
(migration.py). Nothing else in kvchat reads that format.

It can go once no kvchat data dir from before the block store (migration 0010_kv_blocks) is expected.
No release shipped the old format (kvchat is at 0.1.0 with no release tag), so that is a matter of the
data dirs of people who ran kvchat from the repository before then; removing it means deleting this
folder, the migration's queueing in Storage.open (app), and the old snapshot file's removal in
delete_conversation (app).
"""
