"""Runs `experiments/mnist.py` and sends this process a signal after a given optimizer step.

A test helper, not a test: `python tests/signal_at_step.py STEP SIGNAL [mnist.py flags]`
(SIGNAL as `SIGTERM`, `SIGINT` or `SIGKILL`; `SIGINT*2` sends it twice) trains
as `mnist.py` does, with one extra callback that calls
`os.kill(os.getpid(), SIGNAL)` once the optimizer has done STEP steps. The
signal is real and goes through the script's own handling, at a step the test
chooses instead of a moment a timer happens to hit.
"""

import os
import runpy
import signal
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "experiments", "mnist.py")


def main():
    step, name = int(sys.argv[1]), sys.argv[2]
    name, _, times = name.partition("*")
    sys.argv = [SCRIPT] + sys.argv[3:]
    sys.path.insert(0, REPO_ROOT)
    import keras

    from capsnet_tf import training

    number = getattr(signal, name)
    make_callbacks = training._make_callbacks

    class SendSignal(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == step:
                for _ in range(int(times or 1)):
                    os.kill(os.getpid(), number)

    def with_signal(*args, **kwargs):
        return [SendSignal(), *make_callbacks(*args, **kwargs)]

    training._make_callbacks = with_signal
    runpy.run_path(SCRIPT, run_name="__main__")


if __name__ == "__main__":
    main()
