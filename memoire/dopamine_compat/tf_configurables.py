"""TensorFlow's v1 optimizers as gin configurables, for Dopamine's TF agents on TF 2.16+.

Dopamine's stock TF gin files set the optimizer with ``@tf.train.RMSPropOptimizer()`` /
``@tf.train.AdamOptimizer()``, names that ``import gin.tf.external_configurables`` registers;
that module needs ``tf.estimator``, which TensorFlow removed in 2.16, so the import fails
(under Dopamine's own runner too). Importing this module instead registers the same names
(gin module ``tf.train``, classes ``tf.compat.v1.train.*``), so such a file runs with that one
import line changed (see ``configs/atari/tf_*.gin``). Import one or the other, not both.
"""

from __future__ import annotations

import gin
import tensorflow as tf

# The v1 optimizers a TF agent's `optimizer` argument accepts (graph mode, `minimize`).
OPTIMIZERS = (
    "GradientDescentOptimizer",
    "MomentumOptimizer",
    "AdamOptimizer",
    "RMSPropOptimizer",
    "AdagradOptimizer",
    "AdadeltaOptimizer",
    "FtrlOptimizer",
)

for _name in OPTIMIZERS:
    gin.external_configurable(getattr(tf.compat.v1.train, _name), name=_name, module="tf.train")
