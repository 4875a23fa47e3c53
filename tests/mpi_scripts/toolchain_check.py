"""Two ranks: Horovod allreduce, grouped allreduce, two process sets, mpi4py send/recv; and
what the tests' start-up (tests/lean_site) left out and froze."""

import gc
import sys

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from mpi4py import MPI

from mpi import report

first, second = hvd.ProcessSet([0]), hvd.ProcessSet([1])
hvd.init(process_sets=[first, second])
r = hvd.rank()
mine = first if r == 0 else second
total = hvd.allreduce(tf.constant([r + 1.0, 10.0]), op=hvd.Sum)
grouped = hvd.grouped_allreduce([tf.constant([2.0 * r]), tf.constant([[r + 0.5]])], op=hvd.Average)
in_set = hvd.allreduce(tf.constant([r + 1.0]), op=hvd.Sum, process_set=mine)
world = MPI.COMM_WORLD
received = None
if r == 0:
    world.Send(np.arange(5, dtype=np.float64), dest=1, tag=3)
else:
    buf = np.empty(5, dtype=np.float64)
    world.Recv(buf, source=0, tag=3)
    received = buf.tolist()
# Every Horovod query before the barrier: once one rank is past it and exits, Horovod shuts
# down for the other too ("Process set does not exist or has not been registered").
result = dict(
    rank=r,
    size=hvd.size(),
    tf=tf.__version__,
    keras=keras.__version__,
    total=total.numpy().tolist(),
    grouped=[g.numpy().tolist() for g in grouped],
    in_set=in_set.numpy().tolist(),
    received=received,
    set_size=mine.size(),
    gc_enabled=gc.isenabled(),
    frozen=gc.get_freeze_count(),
    skipped=[name for name in ("sklearn", "matplotlib") if name in sys.modules],
)
world.Barrier()
report(**result)
