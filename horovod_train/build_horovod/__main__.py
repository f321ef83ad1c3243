"""`python -m horovod_train.build_horovod` (scripts/build_horovod.sh): the command without the CLI's imports."""

import sys

from horovod_train.build_horovod.command import run_standalone

sys.exit(run_standalone(sys.argv[1:]))
