"""TensorFlow's fused BatchNormalization kernels, for `model.batch_norm.BatchNormalization` on TensorFlow.

`call` is how the layer computes here: the fused kernel where it applies, in
float64 plain ops with the same written-out gradient, Keras's own path
otherwise (inference, masks, renormalisation).

Keras 3's `BatchNormalization` trains with separate ops (`tf.nn.moments`,
`tf.nn.batch_normalization` and their gradients: several passes over every
activation); Keras 2 used the fused `FusedBatchNormV3` kernel (one op each
way, cuDNN on GPUs). That is most of the gap between a Keras 3 YOLOv3
training step and keras-yolo3's (BENCHMARKS.md, "Training step").

`fused_training_call` computes the same function as Keras's training path:
normalisation by the biased batch variance, moving statistics updated with
Keras 3's formula from the biased variance (the kernel returns the
Bessel-corrected one; it is scaled back), gradients through the batch
statistics.

Synchronized statistics over several replicas (`synchronized=True` inside a
MirroredStrategy replica function, the default of multi-device training)
need the statistics of the global batch. Keras all-reduces three moment
tensors (sum, sum of squares and a count built from a ones tensor the size
of the input), normalises with separate ops and differentiates through
all of it. Here the per-channel sums and the count go through one
all-reduce, the normalisation is the fused kernel in inference mode with
the global statistics, and the backward pass is written out: the fused
gradient kernel gives the local `dy * gamma / sigma`, `sum dy` and
`sum dy * x_hat`; the two sums are all-reduced in one call and the
statistics' share of the input gradient is added,

    dx = gamma / sigma * (dy - mean_global(dy) - x_hat * mean_global(dy * x_hat)),

the textbook batch-normalization gradient with means over the global batch.
The gamma and beta gradients stay local sums; the optimizer's all-reduce of
gradients adds the replicas' shares, as for every other weight.
"""

from __future__ import annotations

import keras
import tensorflow as tf

FUSED_DTYPES = ("float16", "bfloat16", "float32")


def keras_synchronized(synchronized: bool) -> bool:
    """`synchronized` for `keras.layers.BatchNormalization`: Keras synchronises over MirroredStrategy replicas."""
    return synchronized


def call(layer, inputs, training, mask, keras_call):
    """(N, H, W, C) -> (N, H, W, C): `layer`'s call; `keras_call` is Keras's own (`super().call`)."""
    if fused_applies(layer, inputs, training, mask):
        return fused_training_call(layer, inputs)
    if written_gradient_applies(layer, inputs, training, mask):
        return written_gradient_training_call(layer, inputs)
    return keras_call(inputs, training=training, mask=mask)


def fused_applies(layer, inputs, training, mask) -> bool:
    """Whether `layer`'s training call can run the fused kernel: 4-D channels-last float32/16 inputs, no mask."""
    if not (layer.fused and training is True and layer.trainable) or mask is not None or layer.renorm:
        return False
    if len(inputs.shape) != 4 or layer.axis not in (-1, 3):
        return False
    return keras.backend.standardize_dtype(inputs.dtype) in FUSED_DTYPES


def _statistics_are_global(layer) -> bool:
    """Whether this call all-reduces its statistics: synchronized, in a replica function of >1 replicas.

    Outside a replica function (the cross-replica context) Keras uses the
    local statistics too.
    """
    if not layer.synchronized:
        return False
    context = tf.distribute.get_replica_context()
    return context is not None and context.num_replicas_in_sync > 1


def fused_training_call(layer, inputs):
    """(N, H, W, C) -> (N, H, W, C): `layer`'s training step with the fused kernel; updates its moving statistics."""
    channels = inputs.shape[-1]
    # Statistics and parameters in float32, as Keras does; float16 inputs
    # go in as they are (the kernel computes in float32 internally).
    gamma = tf.cast(layer.gamma, tf.float32) if layer.scale else tf.ones([channels], tf.float32)
    beta = tf.cast(layer.beta, tf.float32) if layer.center else tf.zeros([channels], tf.float32)
    if _statistics_are_global(layer):
        mean, variance, count = _global_moments(inputs)
        outputs = _normalize_by_global_moments(inputs, gamma, beta, mean, variance, count, layer.epsilon)
    else:
        outputs, mean, corrected_variance = tf.compat.v1.nn.fused_batch_norm(
            inputs, gamma, beta, epsilon=layer.epsilon, data_format="NHWC", is_training=True
        )
        # The kernel returns variance * n / (n - 1) (n - 1 floored at 1);
        # Keras's moving variance follows the biased batch variance.
        count = tf.cast(tf.size(inputs) // channels, tf.float32)
        variance = corrected_variance * (tf.maximum(count - 1.0, 1.0) / count)
    layer.moving_mean.assign(layer.moving_mean * layer.momentum + mean * (1.0 - layer.momentum))
    layer.moving_variance.assign(layer.moving_variance * layer.momentum + variance * (1.0 - layer.momentum))
    return tf.cast(outputs, layer.compute_dtype)


def written_gradient_applies(layer, inputs, training, mask) -> bool:
    """Whether `layer`'s training call takes the float64 path: 4-D channels-last inputs the kernel cannot take."""
    if not (training is True and layer.trainable) or mask is not None or layer.renorm:
        return False
    if len(inputs.shape) != 4 or layer.axis not in (-1, 3):
        return False
    return keras.backend.standardize_dtype(inputs.dtype) not in FUSED_DTYPES


def written_gradient_training_call(layer, inputs):
    """(N, H, W, C) -> (N, H, W, C): a float64 training step, statistics over every replica when synchronized.

    For the dtypes the fused kernel does not take (float64: the equivalence
    proofs). Keras's own path would compute float64 inputs in float32, and its
    synchronized statistics go through `ReplicaContext.all_reduce`, slow to
    trace (`_all_reduce_sum`). Here the statistics are `_global_moments`' sums
    in the input's dtype and the gradient is written out
    (`_normalize_with_written_gradient`): the same arithmetic on one device
    and on N replicas.
    """
    dtype = inputs.dtype
    channels = inputs.shape[-1]
    gamma = tf.cast(layer.gamma, dtype) if layer.scale else tf.ones([channels], dtype)
    beta = tf.cast(layer.beta, dtype) if layer.center else tf.zeros([channels], dtype)
    over_replicas = _statistics_are_global(layer)
    mean, variance, count = _global_moments(inputs, dtype, over_replicas)
    outputs = _normalize_with_written_gradient(inputs, gamma, beta, mean, variance, count, layer.epsilon, over_replicas)
    momentum = layer.momentum
    layer.moving_mean.assign(tf.cast(layer.moving_mean, dtype) * momentum + mean * (1.0 - momentum))
    layer.moving_variance.assign(tf.cast(layer.moving_variance, dtype) * momentum + variance * (1.0 - momentum))
    return tf.cast(outputs, layer.compute_dtype)


def _normalize_with_written_gradient(inputs, gamma, beta, mean, variance, count, epsilon, over_replicas):
    """(N, H, W, C) -> (N, H, W, C): `gamma * (x - mean) / sqrt(variance + eps) + beta`, in plain ops.

    The backward pass is the module docstring's formula, its two sums
    all-reduced when the statistics are the global batch's; `mean` and
    `variance` (C,) then get no gradient of their own.
    """

    @tf.custom_gradient
    def normalize(x, gamma, beta, mean, variance):
        inv_sigma = tf.math.rsqrt(variance + epsilon)
        x_hat = (x - mean) * inv_sigma
        outputs = gamma * x_hat + beta

        def gradient(upstream):
            channels = x.shape[-1]
            dbeta = tf.reduce_sum(upstream, [0, 1, 2])
            dgamma = tf.reduce_sum(upstream * x_hat, [0, 1, 2])
            totals = tf.concat([dbeta, dgamma], 0)
            if over_replicas:
                totals = _all_reduce_sum(totals)
            mean_dy = tf.math.divide_no_nan(totals[:channels], count)
            mean_dy_xhat = tf.math.divide_no_nan(totals[channels:], count)
            dx = gamma * inv_sigma * (upstream - mean_dy - x_hat * mean_dy_xhat)
            return dx, dgamma, dbeta, tf.zeros_like(mean), tf.zeros_like(variance)

        return outputs, gradient

    return normalize(inputs, gamma, beta, mean, variance)


def _all_reduce_sum(values: tf.Tensor) -> tf.Tensor:
    """Sum of a 1-D float32 tensor over the replicas of the current replica function, with no gradient.

    `ReplicaContext.all_reduce` reduces exactly this way, but inside a
    `tf.custom_gradient` that walks the graph back from the reduced tensor,
    here every replica's graph: tracing grows with the square of the
    network's BatchNormalization layers (BENCHMARKS.md, "Tracing the
    replicated step"). Neither caller differentiates the sum (the statistics
    come from `tf.stop_gradient` inputs; the backward pass's sums are part of
    a written-out gradient), so the reduction is called without the wrapper.
    """
    context = tf.distribute.get_replica_context()
    extended = context.strategy.extended
    total, options = tf.distribute.ReduceOp.SUM, tf.distribute.experimental.CommunicationOptions()
    # all_reduce's two branches: merge_call, except where XLA compiles the
    # replica function on GPUs (collective ops launched from each replica).
    if extended._use_merge_call():

        def batch_all_reduce(strategy, per_replica):
            return strategy.extended.batch_reduce_to(total, [(per_replica, per_replica)], options)[0]

        return context.merge_call(batch_all_reduce, args=(values,))
    return extended._replica_ctx_all_reduce(total, values, options)


def _global_moments(
    inputs: tf.Tensor, dtype=tf.float32, over_replicas: bool = True
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Mean and biased variance (C,) of (N, H, W, C) inputs over every replica's batch, and the count.

    Keras's formula (`var = E[x^2] - E[x]^2`, floored at 0) with one
    all-reduce of [sum (C), sum of squares (C), count (1)], in `dtype`
    (`over_replicas=False`: the same sums of this replica alone). No gradient
    flows through these: `_normalize_by_global_moments` and
    `_normalize_with_written_gradient` account for them.
    """
    channels = inputs.shape[-1]
    x = tf.stop_gradient(tf.cast(inputs, dtype))
    local_count = tf.cast(tf.size(x) // channels, dtype)[None]
    totals = tf.concat([tf.reduce_sum(x, [0, 1, 2]), tf.reduce_sum(tf.square(x), [0, 1, 2]), local_count], 0)
    if over_replicas:
        totals = _all_reduce_sum(totals)
    count = totals[-1]
    # divide_no_nan as Keras: replicas that all got empty batches give zero statistics, not NaN.
    mean = tf.math.divide_no_nan(totals[:channels], count)
    variance = tf.maximum(tf.math.divide_no_nan(totals[channels:-1], count) - tf.square(mean), 0.0)
    return mean, variance, count


def _normalize_by_global_moments(inputs, gamma, beta, mean, variance, count, epsilon):
    """(N, H, W, C) -> (N, H, W, C): `gamma * (x - mean) / sqrt(variance + eps) + beta`.

    `mean`, `variance` (C,) are the global batch's (`_global_moments`,
    `count` elements per channel over all replicas); the gradient with
    respect to `inputs` includes their dependence on every replica's inputs
    (the module docstring's formula), so they themselves get none.
    """
    # The kernels' floor on epsilon, as tf.compat.v1.nn.fused_batch_norm applies it.
    epsilon = max(float(epsilon), 1.001e-5)

    @tf.custom_gradient
    def normalize(x, gamma, beta, mean, variance):
        outputs = tf.raw_ops.FusedBatchNormV3(
            x=x,
            scale=gamma,
            offset=beta,
            mean=mean,
            variance=variance,
            epsilon=epsilon,
            data_format="NHWC",
            is_training=False,
        )[0]

        def gradient(upstream):
            # Inference mode: dy * gamma / sigma, sum(dy * x_hat), sum(dy) with the given statistics.
            local_dx, dgamma, dbeta = tf.raw_ops.FusedBatchNormGradV3(
                y_backprop=upstream,
                x=x,
                scale=gamma,
                reserve_space_1=mean,
                reserve_space_2=variance,
                reserve_space_3=tf.zeros([0], tf.float32),
                epsilon=epsilon,
                data_format="NHWC",
                is_training=False,
            )[:3]
            channels = x.shape[-1]
            totals = _all_reduce_sum(tf.concat([dbeta, dgamma], 0))
            mean_dy, mean_dy_xhat = (
                tf.math.divide_no_nan(totals[:channels], count),
                tf.math.divide_no_nan(totals[channels:], count),
            )
            inv_sigma = tf.math.rsqrt(variance + epsilon)
            # dx = local_dx - gamma/sigma * (mean_dy + x_hat * mean_dy_xhat), x_hat = (x - mean) / sigma,
            # as local_dx + x * slope + intercept per channel (one pass over x).
            slope = -gamma * tf.square(inv_sigma) * mean_dy_xhat
            intercept = -gamma * inv_sigma * mean_dy - slope * mean
            dx = tf.cast(local_dx, tf.float32) + (tf.cast(x, tf.float32) * slope + intercept)
            return tf.cast(dx, x.dtype), dgamma, dbeta, tf.zeros_like(mean), tf.zeros_like(variance)

        return outputs, gradient

    return normalize(inputs, gamma, beta, mean, variance)
