"""What kvchat keeps on disk: the conversation database (SQLite, storage/db/) and the K/V block store
(storage/kv/, which keeps its index in that database; db/ never imports kv/). Beside them: emptying the
trash, which needs both (purge.py), where the data dir is (data_dir.py), the file helpers the stores share
(disk_files.py), the package's errors (errors.py) and the user's preferences file (preferences.py).

Depends on `engine` only for plain data types.
"""
