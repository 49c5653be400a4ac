"""A policy plugin and its clock, driven one training step at a time: what ``WasmLR``,
``WasmLabelSmoothing``, ``WasmBatchSize``, ``WasmLayerRate`` and ``WasmSync`` share. The clock, the train-state, the output
checks and the snapshots are the runtime's (``_native.Policy``); this class only keeps each
step's value, the feedback not yet handed over, and a state that ``torch.save`` can hold."""

import time

from . import _native
from ._plugins import register, settings
from .errors import PluginFault

#: The wording of the host's resume check (``cannot resume from …``), for a state_dict.
MISMATCH = (
    "cannot resume from {what}: it belongs to a different run:\n"
    "  policy plugins: checkpoint has [{then}], this run has [{now}]"
)


def _number(x, what):
    """A float from a Python number or a one-element tensor (``loss.item()`` spared)."""
    if x is None:
        return None
    if hasattr(x, "item"):
        x = x.item()
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number or a one-element tensor, not {type(x).__name__}")


# Without a run shape the clock only has to count steps: one epoch longer than any run (and so
# no last step for a sync plugin's final-step rule).
ENDLESS_STEPS = 1 << 40


def around(inner, plugin, kind, params, *, steps_per_epoch, epochs, global_batch, world_size,
           reference_batch, limits):
    """The ``Driver`` of a ``kind`` plugin wrapped around the optimizer ``inner``: the run shape
    as given, else one endless epoch of global batches of ``world_size × reference_batch``;
    ``base_lr`` is the first group's initial learning rate."""
    first = inner.param_groups[0]
    return Driver(
        plugin, kind, params,
        steps_per_epoch=ENDLESS_STEPS if steps_per_epoch is None else steps_per_epoch,
        epochs=1 if epochs is None else epochs,
        global_batch=world_size * reference_batch if global_batch is None else global_batch,
        world_size=world_size, reference_batch=reference_batch,
        base_lr=float(first.get("initial_lr", first["lr"])), limits=limits,
    )


class Driver:
    """One plugin of one kind, its clock at the step about to be taken, and that step's value."""

    def __init__(self, plugin, kind, params, *, steps_per_epoch, epochs, global_batch,
                 world_size, reference_batch, base_lr, limits):
        for name, v in [("steps_per_epoch", steps_per_epoch), ("epochs", epochs),
                        ("global_batch", global_batch)]:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        unknown = set(limits) - {"fuel", "deadline_ms", "memory_mb", "max_batch"}
        if unknown:
            raise TypeError(f"unknown keyword arguments: {', '.join(sorted(unknown))}")
        self.global_batch = global_batch
        # What a copy (copy.deepcopy, pickle) loads its own plugin from.
        self._args = dict(
            plugin=str(plugin), kind=kind, params=params, steps_per_epoch=steps_per_epoch,
            epochs=epochs, global_batch=global_batch, world_size=world_size,
            reference_batch=reference_batch, base_lr=float(base_lr), limits=dict(limits),
        )
        self.policy = _native.Policy(
            str(plugin), kind, settings(params),
            epochs=epochs, samples_per_epoch=steps_per_epoch * global_batch,
            global_batch=global_batch, world_size=world_size, base_lr=float(base_lr),
            reference_batch=reference_batch, **limits,
        )
        # (step, value) of the last call: a stateful plugin is called once per step, as in
        # the host, however often PyTorch asks for the step's value.
        self._value = None
        # (step, momentum) likewise: a contract-0.4 schedule's second output (older contracts
        # have none, and are not asked: a native call per step saved).
        self._momentum = None
        # (step, kind) of a sync plugin's plan, or (step, PluginFault) when the plan faulted:
        # asked once per step, a fault raised again to whoever asks next at that step.
        self._plan = None
        major_minor = tuple(int(x) for x in self.policy.contract.split(".")[:2])
        self._answers_momentum = kind == "schedule" and major_minor >= (0, 4)
        # The batch each step consumed is the one in force when it was decided.
        self._batch = None
        self._loss = None
        self._created = time.monotonic_ns()
        register(self)

    def value(self, batch=None):
        """This step's output, asked of the plugin once per step."""
        step = self.policy.step
        if self._value is None or self._value[0] != step:
            self._value = (step, self.policy.value(batch))
            self._batch = batch
        return self._value[1]

    def momentum(self, batch=None):
        """This step's momentum (``None``: the plugin leaves it alone), asked once per step
        right after the step's value, as the host asks them."""
        if not self._answers_momentum:
            return None
        step = self.policy.step
        if self._momentum is None or self._momentum[0] != step:
            self.value(batch)
            self._momentum = (step, self.policy.momentum(self._batch))
        return self._momentum[1]

    def plan(self, batch=None):
        """A sync plugin's plan for this step (``synchronous``, ``local`` or ``average``),
        asked of the plugin once per step; a fault at it is raised to every caller at the
        step."""
        step = self.policy.step
        if self._plan is None or self._plan[0] != step:
            try:
                self._plan = (step, self.policy.plan(batch))
            except PluginFault as e:
                self._plan = (step, e)
            self._batch = batch
        kind = self._plan[1]
        if isinstance(kind, PluginFault):
            raise kind
        return kind

    def observe(self, loss=None, metric=None):
        """Feedback: ``loss`` becomes ``last-loss`` once this step ends, ``metric``
        ``last-metric`` from the next call on (as the host's evaluation after an epoch)."""
        if loss is not None:
            self._loss = _number(loss, "loss")
        if metric is not None:
            self.policy.set_metric(_number(metric, "metric"))

    def advance(self, batch=None):
        """Ends this step, which consumed ``batch`` samples (default: the global batch)."""
        batch = batch or self._batch or self.global_batch
        self.policy.advance(int(batch), self._loss)
        self._loss = None

    def goto(self, step):
        """Puts the clock at ``step``: one step on ends the current step as training does; any
        other move (PyTorch's deprecated ``step(epoch)``, ``SequentialLR``'s restart at 0)
        reseats the clock at ``step`` global batches, keeping the feedback."""
        now = self.policy.step
        if step == now + 1:
            self.advance()
        elif step != now and step >= 0:
            self.policy.seek(step, step * self.global_batch, self.policy.last_loss,
                             self.policy.last_metric)
            self._value = None
            self._momentum = None
            self._plan = None

    def identity(self):
        """The plugin's identity line (the host's resume check prints these)."""
        return self.policy.identity

    def state(self):
        """What a state_dict keeps: identity, clock, pending feedback and, for a stateful
        plugin, its snapshot as of the current step."""
        p = self.policy
        return {
            "identity": p.identity,
            "blake3": p.blake3,
            "params": p.params,
            "step": p.step,
            "samples_seen": p.samples_seen,
            "last_loss": p.last_loss,
            "last_metric": p.last_metric,
            "pending_loss": self._loss,
            "value": self._value,
            "momentum": self._momentum,
            "batch": self._batch,
            "snapshot": p.snapshot(),
            # A sync plugin's window and the plan already given at this step (not a fault).
            "window": p.window if p.kind == "sync" else None,
            "plan": self._plan if self._plan and isinstance(self._plan[1], str) else None,
        }

    def load(self, state, what):
        """Continues from ``state`` (from ``state``), refusing another plugin or parameters
        with the host's wording."""
        if state.get("identity") != self.policy.identity:
            raise ValueError(MISMATCH.format(what=what, then=state.get("identity"),
                                             now=self.policy.identity))
        p = self.policy
        window = state.get("window")
        p.seek(state["step"], state["samples_seen"], state["last_loss"], state["last_metric"],
               window=None if window is None else (int(window[0]), int(window[1])))
        if state["snapshot"] is not None:
            p.restore(state["step"], bytes(state["snapshot"]))
        self._loss = state["pending_loss"]
        self._value = None
        self._momentum = None
        self._plan = None
        self._batch = state["batch"]
        # The interrupted run had already asked for this step's outputs: ask again, so that a
        # stateful plugin's state moves on exactly as it did there.
        asks = [("value", self.value), ("momentum", self.momentum)]
        if p.kind == "sync":
            asks = [("plan", self.plan)]
        for name, ask in asks:
            saved = state.get(name)
            if saved is None or saved[0] != state["step"]:
                continue
            v = ask(self._batch)
            if v != saved[1]:
                raise ValueError(
                    f"{what}: plugin {p.label} answers {name} {v!r} at step {saved[0]} after "
                    f"the resume, the saved run had {saved[1]!r}"
                )

    def __getstate__(self):
        """The constructor's arguments and :meth:`state`: a copy (``copy.deepcopy`` or ``pickle``
        of a scheduler, as PyTorch's own schedulers allow) loads the plugin again and continues
        from this one's clock and snapshot."""
        return {"args": self._args, "state": self.state()}

    def __setstate__(self, saved):
        self.__init__(**saved["args"])
        self.load(saved["state"], "a copy")

    def _rank_record(self):
        """What ``check_ranks`` compares across ranks."""
        snap = self.policy.snapshot()
        return {
            "kind": self.policy.kind,
            "label": self.policy.label,
            "identity": self.policy.identity,
            "blake3": self.policy.blake3,
            "params": self.policy.params,
            "step": self.policy.step,
            "window": self.policy.window if self.policy.kind == "sync" else None,
            "state": None if snap is None else _native.blake3_hex(snap),
        }
