r"""One epoch of MNIST under each Keras backend, in turn, on this machine (issue 46).

    python benchmarks/backends/one_epoch.py --output_dir=benchmarks/results/NAME

Trains the paper's MNIST CapsNet (`CapsNet.from_preset("mnist")`, float32,
Keras's Adam at 1e-3, margin loss + 0.0005 x reconstruction loss) for one
epoch of the 60,000 MNIST training images (batch 100, shuffled with the same
seed, no augmentation) with `model.fit`, then scores the 10,000 test images,
once per backend in `--backends`, each in a fresh process started with
`KERAS_BACKEND` set (Keras picks its backend once per process), one after the
other so that they never share the cores. Keras's Adam rather than
`capsnet_tf.optimizers.FusedAdam` (a TensorFlow kernel), so that both
backends run the same update. The data come from TFDS through TensorFlow in
every process; only the model runs on the backend.

Writes `one_epoch.json` (per backend: training seconds, images/s over the
steps after the first 20, which hold the compilation, test accuracy) and
`one_epoch.md` (the same as a table, with each backend's rate as a multiple
of TensorFlow's).
"""

import json
import os
import subprocess
import sys
import time

from absl import app, flags

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where the results go.", required=True)
_BACKENDS = flags.DEFINE_list("backends", ["tensorflow", "jax"], "Keras backends, in order.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 100, "Batch size.", lower_bound=1)
_TRAIN_EXAMPLES = flags.DEFINE_integer(
    "train_examples", 60_000, "Training images (one epoch over them).", lower_bound=1
)
_WORKER = flags.DEFINE_string("worker", None, "Internal: run one backend, write this JSON file.")

_SKIPPED_STEPS = 20  # the first steps hold the compilation


def _train_and_score(output_path):
    import keras
    import numpy as np

    from capsnet_tf import CapsNet, MarginLoss, ReconstructionLoss
    from capsnet_tf.data.multimnist import load_mnist_arrays

    keras.utils.set_random_seed(0)
    train_images, train_labels = load_mnist_arrays("train")
    test_images, test_labels = load_mnist_arrays("test")
    count = min(_TRAIN_EXAMPLES.value, len(train_labels))
    images = (train_images[:count, ..., None] / 255.0).astype("float32")
    labels = train_labels[:count].astype("int32")

    model = CapsNet.from_preset("mnist")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss={"length": MarginLoss(), "reconstruction": ReconstructionLoss()},
        loss_weights={"length": 1.0, "reconstruction": 0.0005},
        metrics={"length": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]},
    )
    step_ends = []

    class StepClock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step_ends.append(time.perf_counter())

    start = time.perf_counter()
    model.fit(
        {"image": images, "label": labels},
        {"length": labels, "reconstruction": images},
        batch_size=_BATCH_SIZE.value,
        epochs=1,
        shuffle=True,
        verbose=2,
        callbacks=[StepClock()],
    )
    train_seconds = time.perf_counter() - start
    timed_steps = len(step_ends) - 1 - _SKIPPED_STEPS
    steady = timed_steps * _BATCH_SIZE.value / (step_ends[-1] - step_ends[_SKIPPED_STEPS])
    inference = model.inference_model()
    lengths = inference.predict(
        (test_images[..., None] / 255.0).astype("float32"), batch_size=250, verbose=0
    )["length"]
    accuracy = float(np.mean(np.argmax(np.asarray(lengths), axis=1) == test_labels))
    with open(output_path, "w") as file:
        json.dump({
            "backend": keras.backend.backend(),
            "train_images": count,
            "train_seconds": train_seconds,
            "images_per_second_after_step_20": steady,
            "test_accuracy": accuracy,
            "test_examples": int(len(test_labels)),
            "parameters": int(model.count_params()),
        }, file, indent=2)


def main(argv):
    del argv
    if _WORKER.value:
        _train_and_score(_WORKER.value)
        return
    from capsnet_tf import cpu

    os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
    results = {}
    for backend in _BACKENDS.value:
        path = os.path.join(_OUTPUT_DIR.value, f"one_epoch_{backend}.json")
        command = [sys.executable, os.path.abspath(__file__), f"--worker={path}",
                   f"--output_dir={_OUTPUT_DIR.value}", f"--batch_size={_BATCH_SIZE.value}",
                   f"--train_examples={_TRAIN_EXAMPLES.value}"]
        print(f"== {backend}", flush=True)
        subprocess.run(command, check=True, env={**os.environ, "KERAS_BACKEND": backend})
        with open(path) as file:
            results[backend] = json.load(file)
        os.remove(path)
    family_model = cpu.family_and_model()
    record = {
        "cpu": cpu.model_name() + (
            " (family {}, model {})".format(*family_model) if family_model else ""),
        "usable_cores": cpu.usable_cores(),
        "backends": results,
    }
    with open(os.path.join(_OUTPUT_DIR.value, "one_epoch.json"), "w") as file:
        json.dump(record, file, indent=2)
    reference = results.get("tensorflow", {}).get("images_per_second_after_step_20")
    lines = [f"One epoch of MNIST per Keras backend, one after the other ({record['cpu']}, "
             f"{record['usable_cores']} cores)", "",
             "| backend | training s | images/s after step 20 | x TensorFlow | test accuracy |",
             "| --- | --- | --- | --- | --- |"]
    for backend, result in results.items():
        rate = result["images_per_second_after_step_20"]
        ratio = f"{rate / reference:.2f}" if reference else ""
        lines.append(f"| {backend} | {result['train_seconds']:.0f} | {rate:.1f} | {ratio} | "
                     f"{100 * result['test_accuracy']:.2f}% |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(_OUTPUT_DIR.value, "one_epoch.md"), "w") as file:
        file.write(text)
    print(text)


if __name__ == "__main__":
    app.run(main)
