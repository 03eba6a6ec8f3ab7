"""A graceful stop on SIGTERM and Ctrl-C: finish the step, save the training state, exit.

What TensorFlow's `tf.distribute.experimental.PreemptionCheckpointHandler`
does for custom training loops (on the preemption signal, save a checkpoint
at the next step boundary; on restart, restore it), done as a Keras callback
for `model.fit` around `TrainingStateBackup`:

- the first SIGTERM or SIGINT (Ctrl-C) only sets a flag and says so on
  stderr; the step in flight finishes (Python runs signal handlers between
  steps, never inside TensorFlow's kernels);
- after that step the training state is backed up atomically (the same file
  a periodic backup writes: weights, Adam's moments, step counter, epoch and
  step in the epoch) and `TrainingInterrupted` is raised out of `fit`, which
  carries the exit status a shell expects: 128 + the signal number (143 for
  SIGTERM, 130 for SIGINT);
- a signal during the epoch-end evaluation takes effect once that epoch's
  checkpoints, log row and backup are written, so a resumed run never skips
  an epoch's evaluation;
- a second signal exits at once (`os._exit`, status 128 + signal): every
  file is written atomically, so the last complete backup is where the run
  continues.

The handlers are installed for the duration of `fit` only (and only in the
main thread, where Python delivers signals); before and after it the
process's own handlers apply.
"""

import os
import signal
import sys
import threading

import keras

__all__ = ["GracefulStop", "TrainingInterrupted"]


class TrainingInterrupted(Exception):
    """Training stopped on a signal; the state it was saved in is described.

    Attributes:
        signal_number: the signal (`signal.SIGTERM`, `signal.SIGINT`).
        exit_code: 128 + `signal_number`, what a shell reports for it.
        state: metadata of the backup the run continues from (`epoch`,
            `step_in_epoch`, `global_step`, `path`), or None when nothing
            has been saved yet.
    """

    def __init__(self, message, signal_number, state):
        super().__init__(message)
        self.signal_number = signal_number
        self.exit_code = 128 + int(signal_number)
        self.state = state


def _signal_name(signal_number):
    try:
        return signal.Signals(signal_number).name
    except ValueError:
        return f"signal {signal_number}"


class GracefulStop(keras.callbacks.Callback):
    """Turns SIGTERM and the first Ctrl-C into a saved state and `TrainingInterrupted`.

    Put it after the run's `TrainingStateBackup` in the callback list, so
    that at an epoch end it acts after the backup of that epoch.

    Args:
        backup: the run's `TrainingStateBackup`, which saves the state.
        signals: the signals handled.
        save: back up at the stop (False under a multi-worker strategy,
            where the workers would otherwise stop at different steps: there
            they stop without a new backup and all resume from the last
            periodic one, taken at the same step on every worker).
        resume_hint: the sentence saying how to continue, for the message.
    """

    def __init__(self, backup, signals=(signal.SIGTERM, signal.SIGINT), save=True,
                 resume_hint="Run the same command again to continue."):
        super().__init__()
        self.backup = backup
        self.signals = tuple(signals)
        self.save = save
        self.resume_hint = resume_hint
        self.pending = None
        self._previous = {}

    # --- Handlers ----------------------------------------------------------

    def _handle(self, signal_number, frame):
        if self.pending is None:
            self.pending = signal_number
            print(
                f"\n{_signal_name(signal_number)} received: stopping after the current step "
                "and saving the training state (send it again to stop at once).",
                file=sys.stderr, flush=True,
            )
            return
        last = self.backup.last_saved
        where = f" from global step {last['global_step']}" if last else " from its start"
        print(
            f"\n{_signal_name(signal_number)} received again: stopped at once. The same "
            f"command continues the run{where}.",
            file=sys.stderr, flush=True,
        )
        os._exit(128 + int(signal_number))

    def _install(self):
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only
        for number in self.signals:
            self._previous[number] = signal.signal(number, self._handle)

    def uninstall(self):
        """Puts the process's own handlers back (also after `fit` raised)."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    # --- Callback ----------------------------------------------------------

    def on_train_begin(self, logs=None):
        self.pending = None
        self._install()

    def on_train_end(self, logs=None):
        self.uninstall()

    def on_train_batch_end(self, batch, logs=None):
        if self.pending is None or self.backup.epoch_end_follows(batch):
            return  # no signal, or the epoch's evaluation and backup come first
        state = self.backup.save_now(batch) if self.save else self.backup.last_saved
        self._stop(state)

    def on_epoch_end(self, epoch, logs=None):
        if self.pending is not None:
            self._stop(self.backup.last_saved)

    def _stop(self, state):
        self.uninstall()
        if state is None:
            where = "before the first backup; the same command starts it afresh."
        else:
            if state["step_in_epoch"]:
                point = f"epoch {state['epoch'] + 1}, step {state['step_in_epoch']}"
            else:
                point = f"the end of epoch {state['epoch']}"
            where = (
                f"at global step {state['global_step']} ({point}); the training state is in "
                f"{state['path']}. {self.resume_hint}"
            )
        raise TrainingInterrupted(
            f"Stopped on {_signal_name(self.pending)} {where}", self.pending, state
        )
