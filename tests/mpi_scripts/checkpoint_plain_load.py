"""Loads a .keras file with nothing but Keras (no tfsift, MPI or Horovod) and predicts.

usage: checkpoint_plain_load.py MODEL.keras INPUTS.npy
Prints one JSON line: the predictions, the class loaded, and the modules of tfsift, mpi4py
or horovod that got imported (there must be none).
"""

import json
import sys

import keras
import numpy as np

model = keras.saving.load_model(sys.argv[1])
predictions = model.predict(np.load(sys.argv[2]), verbose=0)
imported = sorted(m for m in sys.modules if m.split(".")[0] in ("tfsift", "mpi4py", "horovod"))
print(
    json.dumps(
        {"predictions": predictions.tolist(), "class": type(model).__name__, "imported": imported}
    )
)
