import sys

from horovod_train.cli.main import main

sys.exit(main())
