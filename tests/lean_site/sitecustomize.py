"""Loaded at start-up by every rank of a ``tests/mpi_scripts`` job (tests/mpi.py puts this
folder first on PYTHONPATH): keeps Keras from importing scikit-learn and matplotlib.

Keras imports both at start-up when they are installed, only for its scikit-learn wrappers
and its image-gallery plot, which tfsift and those scripts never use. That took 1.5 of the
4.2 CPU seconds a rank spends importing TensorFlow, Keras and Horovod, and the suite starts
about 200 ranks. ``None`` in ``sys.modules`` makes ``import sklearn`` raise ImportError,
which Keras catches. Examples and the CLI (which use both) run without this folder.
"""

import sys

for name in ("sklearn", "matplotlib.pyplot"):
    sys.modules.setdefault(name, None)  # type: ignore[assignment]
