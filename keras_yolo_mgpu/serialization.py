"""Saving the project's custom Keras objects: the package they register under, and their config.

Keras rebuilds a custom layer or schedule by passing its `get_config()` to
its constructor, so the config is the constructor's arguments. Our objects
store each argument, validated, in an attribute of the same name, and
`constructor_config` reads them back from there: adding an argument cannot
leave it out of the saved config.
"""

from __future__ import annotations

import inspect

import numpy as np

#: The package every custom object registers under (`keras_yolo_mgpu>YoloLoss` in a saved model).
SERIALIZABLE_PACKAGE = "keras_yolo_mgpu"


def constructor_config(obj) -> dict:
    """`{argument: obj.argument}` for every named argument of `type(obj).__init__`, arrays as lists.

    `*args` and `**kwargs` are left out: a layer passes its `**kwargs` to
    `keras.layers.Layer`, whose own `get_config()` holds them.
    """
    config = {}
    for name, parameter in inspect.signature(type(obj).__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        value = getattr(obj, name)
        config[name] = value.tolist() if isinstance(value, np.ndarray) else value
    return config
