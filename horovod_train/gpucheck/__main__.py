import sys

from horovod_train.gpucheck.check import main

sys.exit(main())
