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
    out = []
    for key, value in params.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float):
            text = repr(value)
        else:
            text = str(value)
        out.append((str(key), text))
    return out


def register(holder):
    """Adds an object with ``_rank_record()`` to what ``check_ranks`` compares."""
    _live.add(holder)


def live():
    """The live holders, in creation order."""
    return sorted(_live, key=lambda h: h._created)
