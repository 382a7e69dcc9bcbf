"""`kvchat` in a child process for the fault tests, with the reply's save interval set from the
environment (TEST_PARTIAL_SAVE_S; 0 saves at every token) so a test controls how often it writes.

    python -m tests.app.cli_child ask MESSAGE ...
"""

import os
import sys

import app.chat.reply_writer as reply_writer
from app.cli.main import main

if "TEST_PARTIAL_SAVE_S" in os.environ:
    reply_writer.PARTIAL_SAVE_S = float(os.environ["TEST_PARTIAL_SAVE_S"])

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
