"""Test-only start-up hook: with ATTNAUDIT_TEST_TINY_SYNTHETIC set, the built-in synthetic tasks
are generated at a few dozen examples per split, so documented commands that train on them
(including sweep workers in other processes) finish in seconds. Never on the package's path."""

import os

if os.environ.get("ATTNAUDIT_TEST_TINY_SYNTHETIC"):
    from attnaudit.data import synthetic

    synthetic.synthetic_task.__defaults__ = (160, 40, 40)
