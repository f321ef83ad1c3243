"""Arguments on HfArgumentParser (issue 20): Literal choices, sections that check themselves, engine options
beside their engine, and bench gpu parsing train's arguments the way train does."""

from __future__ import annotations

import subprocess
import sys


def test_the_config_imports_no_engine_and_no_torch():
    """config imports the engines' option modules; the engines (and torch) load only when a run needs them."""
    imports = "import sys, horovod_train.config.run_config; "
    code = imports + "print(sorted(m for m in ('torch', 'horovod') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
