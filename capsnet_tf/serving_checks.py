"""The in-graph input checks of the serving signatures (`capsnet_tf.export`).

Each refuses, before the model runs, an input that the signature's fixed
spec lets through: a wrong shape behind an unknown batch, float pixels
outside [0, 1], class ids outside the classes. The error names the
signature and the input it expects.
"""

import tensorflow as tf

__all__ = [
    "checked_decode_inputs",
    "checked_images",
    "graph_assert",
]


def graph_assert(condition, message, *values):
    """An in-graph assertion, for a `tf.control_dependencies` scope."""
    return tf.debugging.Assert(condition, [message, *values], summarize=8)


def checked_images(images, image_shape, name, dtype_text):
    """Refuses wrong shapes (and float values outside [0, 1]) before the model runs."""
    shape_text = f"[batch, {', '.join(str(size) for size in image_shape)}]"
    shape = tf.shape(images)
    # Padding keeps the slice valid for inputs of lower rank.
    padded = tf.concat([shape, tf.zeros([4], tf.int32)], axis=0)
    checks = [
        graph_assert(
            tf.logical_and(
                tf.equal(tf.size(shape), 4),
                tf.reduce_all(tf.equal(padded[1:4], image_shape)),
            ),
            f"{name} expects {dtype_text} images of shape {shape_text}; "
            "received shape",
            shape,
        )
    ]
    if images.dtype != tf.uint8:
        checks.append(
            graph_assert(
                tf.reduce_all((images >= 0.0) & (images <= 1.0)),
                f"{name} expects float32 pixel values in [0, 1] (send uint8 "
                "images in [0, 255] to serving_default); received values in",
                tf.reduce_min(images),
                tf.reduce_max(images),
            )
        )
    with tf.control_dependencies(checks):
        images = tf.identity(images)
    return tf.ensure_shape(images, (None,) + image_shape)


def checked_decode_inputs(capsules, class_ids, num_classes, capsule_dim):
    """`decode`'s inputs, refused before the decoder runs when their shapes or ids are off."""
    shape = tf.shape(capsules)
    padded = tf.concat([shape, tf.zeros([3], tf.int32)], axis=0)
    checks = [
        graph_assert(
            tf.logical_and(
                tf.equal(tf.size(shape), 3),
                tf.reduce_all(tf.equal(padded[1:3], [num_classes, capsule_dim])),
            ),
            f"decode expects float32 capsules of shape [batch, {num_classes}, "
            f"{capsule_dim}]; received shape",
            shape,
        ),
        graph_assert(
            tf.logical_and(
                tf.equal(tf.rank(class_ids), 1),
                tf.equal(tf.size(class_ids), padded[0]),
            ),
            "decode expects int32 class_ids of shape [batch] matching the "
            "capsules' batch; received shapes",
            tf.shape(class_ids),
            shape,
        ),
        graph_assert(
            tf.reduce_all((class_ids >= 0) & (class_ids < num_classes)),
            f"decode expects class_ids in [0, {num_classes}); received",
            class_ids,
        ),
    ]
    with tf.control_dependencies(checks):
        capsules = tf.identity(capsules)
        class_ids = tf.identity(class_ids)
    return tf.ensure_shape(capsules, (None, num_classes, capsule_dim)), class_ids
