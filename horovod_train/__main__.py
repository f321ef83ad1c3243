import sys

from horovod_train.cli import main

sys.exit(main())
