#!/usr/bin/env bash
# Checks tfsift on this host's GPUs step by step and says what each step saw: TensorFlow's
# build and GPUs, `tfsift doctor`, one rank per GPU, where a model's variables land, the
# examples on the GPU and on the CPU, and with `tests` the multi-process tests (TF32 off,
# deterministic kernels); with one GPU the ranks share it. Why each setting, what to do
# when TensorFlow lists no GPU, and what it printed on an H100: docs/install.md#gpus.
# Usage: PYTHON=.venv/bin/python bash scripts/gpu_check.sh [quick|tests] (default quick).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WHAT="${1:-quick}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
run() { "$PY" -m tfsift.cli run "$@"; }
step() { echo; echo "== $*"; }

step "1. TensorFlow and its GPUs"
"$PY" - <<'EOF'
import tensorflow as tf
info = tf.sysconfig.get_build_info()
print("tensorflow", tf.__version__, "cuda", info.get("cuda_version"), "cudnn", info.get("cudnn_version"))
gpus = tf.config.list_physical_devices("GPU")
print("GPUs:", len(gpus), [tf.config.experimental.get_device_details(g).get("device_name") for g in gpus])
EOF
GPUS=$("$PY" -c 'import tensorflow as tf; print(len(tf.config.list_physical_devices("GPU")))' 2>/dev/null | tail -1)
[ "${GPUS:-0}" -ge 1 ] || { echo "no GPU seen by TensorFlow: nothing more to check"; exit 1; }

step "2. tfsift doctor -np $GPUS"
"$PY" -m tfsift.cli doctor -np "$GPUS"

step "3. $((GPUS + 1)) ranks on $GPUS GPU(s): init must refuse"
if out=$(run -np $((GPUS + 1)) examples/mnist_pipeline.py --epochs 1 --partitions $((GPUS + 1)) 2>&1); then
  echo "FAIL: it trained"; echo "$out" | tail -5
else
  echo "$out" | grep -m1 -o "tfsift.init gives every rank of a host its own GPU.*" || { echo "FAIL: another error"; echo "$out" | tail -20; }
fi

step "4. one process: where the model's variables and a step run"
"$PY" - <<'EOF'
import keras, numpy as np, tfsift
tfsift.init({"partitions": 1})
class Net(tfsift.DistributedModel):
    def __init__(self):
        super().__init__()
        self.d1 = keras.layers.Dense(64, activation="relu")
        self.d2 = keras.layers.Dense(10)
    def call(self, x):
        return self.d2(self.d1(x))
model = Net()
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).normal(size=(256, 20)).astype("float32")
y = np.arange(256) % 10
history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
print("variables on:", sorted({v.value.device.split("/")[-1] for v in model.trainable_variables}))
print("losses", [round(v, 4) for v in history.history["loss"]])
EOF

share=()
if [ "$GPUS" -lt 2 ]; then share=(env TFSIFT_PIN_GPU=0 TF_FORCE_GPU_ALLOW_GROWTH=true); fi
timed() { local t0=$SECONDS; "$@" 2>&1 | grep -v "^\s*$" | tail -4; echo "(${PIPESTATUS[0]}: exit status; $((SECONDS - t0)) s)"; }
step "5a. main example, 2 ranks, GPU"
timed "${share[@]}" "$PY" -m tfsift.cli run -np 2 examples/mnist_pipeline.py
step "5b. sifting example, InfoBatch, 2 ranks, GPU"
timed "${share[@]}" "$PY" -m tfsift.cli run -np 2 examples/sift_mnist1d.py
step "5c. the same two on this host's CPU"
timed env CUDA_VISIBLE_DEVICES= "$PY" -m tfsift.cli run -np 2 examples/mnist_pipeline.py
timed env CUDA_VISIBLE_DEVICES= "$PY" -m tfsift.cli run -np 2 examples/sift_mnist1d.py

if [ "$WHAT" = tests ]; then
  step "6. multi-process tests with GPU kernels"
  "${share[@]}" env NVIDIA_TF32_OVERRIDE=0 TF_DETERMINISTIC_OPS=1 \
    "$PY" -m pytest tests/tfsift -m mpi -q --no-header -p no:cacheprovider "${@:2}"
fi
