r"""TensorFlow's own peak bytes in use beside VmHWM, for one `measure.py` configuration.

With `TF_CPU_ALLOCATOR_USE_BFC=true` TensorFlow's CPU allocator is its BFC
allocator, whose `tf.config.experimental.get_memory_info("CPU:0")["peak"]`
is the most bytes the step's tensors held at once. Against the estimate's
tensor parts (its total less the `tensorflow` baseline) that separates the
estimate's tensor count from what lies outside TensorFlow's allocator
(VmHWM less that peak: the runtime, oneDNN's buffers, allocator slack).

    python benchmarks/memory/tensorflow_peak.py rgb_48x48x3_b16

Prints one JSON line. The BFC allocator changes the resident peak itself, so
`measure.py`, not this, measures the default allocator's VmHWM.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(os.path.dirname(_HERE))]


def main(name, steps=4):
    import measure
    import tensorflow as tf

    if name not in measure.CONFIGURATIONS:
        sys.exit(f"error: unknown configuration {name!r}; one of {sorted(measure.CONFIGURATIONS)}")
    model, inputs, targets = measure.training_setup(name, steps)
    for _ in range(steps):
        model.train_on_batch(inputs, targets)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    estimate = measure.estimate(name)
    print(json.dumps({
        "configuration": name,
        "vm_hwm_mib": round(measure.vm_hwm() / 2**20),
        "tensorflow_peak_mib": round(peak / 2**20),
        "estimate_mib": round(estimate.total / 2**20),
        "estimate_tensors_mib": round((estimate.total - estimate.parts["tensorflow"]) / 2**20),
    }))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
