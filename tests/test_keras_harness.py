"""Keras's own layer test harness (`keras.src.testing.TestCase.run_layer_test`) on every layer.

The harness checks what Keras checks on its core layers: the config round
trip, `build` from shapes (one shape per call argument for two-input layers),
symbolic and eager calls against `compute_output_shape`, the trainable
weight count, a compiled training step, and the mixed-precision output dtype.
It runs beside the project's own checks (`tests/layer_test_case.py`), which
compare values against independent references.
"""

from keras.src import testing

from capsnet_tf.layers import CapsuleLayer, Length, Mask, PrimaryCapsule


class KerasLayerHarnessTest(testing.TestCase):
    def test_primary_capsule(self):
        self.run_layer_test(
            PrimaryCapsule,
            init_kwargs={"num_capsule_types": 2, "capsule_dim": 4, "kernel_size": 3, "strides": 2},
            input_shape=(2, 7, 7, 3),
            expected_output_shape=(2, 2 * 3 * 3, 4),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=0,
            supports_masking=False,
        )

    def test_capsule_layer(self):
        self.run_layer_test(
            CapsuleLayer,
            init_kwargs={"num_capsules": 3, "capsule_dim": 4, "routing_iterations": 2},
            input_shape=(2, 5, 6),
            expected_output_shape=(2, 3, 4),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=0,
            supports_masking=False,
        )

    def test_length(self):
        self.run_layer_test(
            Length,
            init_kwargs={},
            input_shape=(2, 3, 4),
            expected_output_shape=(2, 3),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=0,
            supports_masking=False,
        )

    def test_mask_with_labels(self):
        self.run_layer_test(
            Mask,
            init_kwargs={},
            input_shape={"capsules_shape": (2, 3, 4), "labels_shape": (2,)},
            input_dtype={"capsules_shape": "float32", "labels_shape": "int32"},
            call_kwargs={"training": True},
            run_training_check=False,  # as above: a dict input, no weights
            expected_output_shape=(2, 3, 4),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=0,
            supports_masking=False,
        )

    def test_mask_two_targets(self):
        self.run_layer_test(
            Mask,
            init_kwargs={"num_targets": 2},
            input_shape={"capsules_shape": (2, 5, 4), "labels_shape": (2, 2)},
            input_dtype={"capsules_shape": "float32", "labels_shape": "int32"},
            call_kwargs={"training": True},
            # The harness's training model passes a dict input as one positional
            # argument; Mask has no weights to train anyway.
            run_training_check=False,
            expected_output_shape=(2, 2, 5, 4),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=0,
            supports_masking=False,
        )

    def test_mask_without_labels(self):
        self.run_layer_test(
            Mask,
            init_kwargs={},
            input_shape=(2, 3, 4),
            expected_output_shape=(2, 3, 4),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=0,
            supports_masking=False,
        )
