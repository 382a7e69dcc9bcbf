"""`kvchat` in a child process for the fault and terminal tests, with two knobs from the environment:
- TEST_PARTIAL_SAVE_S: the reply's save interval (0 saves at every token), so a test controls how often
  it writes;
- TEST_STEP_S: each engine step lasts at least this long, so a reply of a tiny model is still
  streaming when a test ends it (the fused decode step runs thousands of its tokens a second).

    python -m tests.app.cli.cli_child ask MESSAGE ...
"""

import os
import sys
import time

import app.chat.saved.reply_writer as reply_writer
from app.cli.main import main

if "TEST_PARTIAL_SAVE_S" in os.environ:
    reply_writer.PARTIAL_SAVE_S = float(os.environ["TEST_PARTIAL_SAVE_S"])

if "TEST_STEP_S" in os.environ:
    from engine.request.runner import ModelRunner

    step_s, run = float(os.environ["TEST_STEP_S"]), ModelRunner.run

    def slow_run(self, step):
        time.sleep(step_s)
        return run(self, step)

    ModelRunner.run = slow_run

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
