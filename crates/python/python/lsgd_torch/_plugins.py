"""What the Python classes share: plugin parameters as the host's ``--set`` text, and the
registry of live plugin holders that ``check_ranks`` compares."""

import weakref

_live = weakref.WeakSet()


def settings(params):
    """``{"warmup_epochs": 5, "nesterov": True}`` as ``[("warmup_epochs", "5"), …]``: the text
    the host's ``--set KIND.KEY=VALUE`` would give, type-checked by the runtime against the
    plugin's ``describe()``."""
    if params is None:
        return []
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of plugin parameters, not {type(params).__name__}")
    return [(str(key), _text(value)) for key, value in params.items()]


def _text(value):
    """One parameter value as ``--set`` text: booleans as true/false, floats in shortest
    round-trip form, a list or tuple as the comma-separated list the host takes
    (``[30, 60, 80]`` is ``30,60,80``), a numpy scalar, a 0-d tensor or array as its Python
    number and a 1-d one as its list. The runtime types the text by the plugin's
    ``describe()``; where it declares an integer, an integral float (``4.0``) counts as that
    integer."""
    if hasattr(value, "tolist") and hasattr(value, "ndim"):
        # numpy scalars and arrays, torch tensors: a float32 0.1 is the float it holds.
        if value.ndim > 1:
            raise TypeError(f"a parameter value has at most one dimension, not {value.ndim}")
        value = value.tolist()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return str(value)


def register(holder):
    """Adds an object with ``_rank_record()`` to what ``check_ranks`` compares."""
    _live.add(holder)


def live():
    """The live holders, in creation order."""
    return sorted(_live, key=lambda h: h._created)
