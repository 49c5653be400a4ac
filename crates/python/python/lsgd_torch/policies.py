"""``WasmLabelSmoothing`` and ``WasmBatchSize``: the other two per-step policies, for a training
loop that asks for the step's value (they drive no optimizer, so they are not schedulers)."""

import math

from ._driver import Driver


class _Stepped:
    """A policy plugin asked once per step; ``step()`` ends the step."""

    _kind = None

    def __init__(self, plugin, *, steps_per_epoch, epochs, global_batch, world_size=1,
                 reference_batch=256, base_lr=0.1, params=None, **limits):
        self._driver = Driver(
            plugin, self._kind, params, steps_per_epoch=steps_per_epoch, epochs=epochs,
            global_batch=global_batch, world_size=world_size, reference_batch=reference_batch,
            base_lr=base_lr, limits=limits,
        )

    @property
    def policy(self):
        """The loaded plugin (``lsgd_torch._native.Policy``): name, identity, clock."""
        return self._driver.policy

    @property
    def last_epoch(self):
        """The step whose value is being asked (PyTorch's name for it)."""
        return self._driver.policy.step

    def observe(self, loss=None, metric=None):
        """Feeds ``last-loss`` (when this step ends) and ``last-metric`` (from the next step)."""
        self._driver.observe(loss, metric)

    def state_dict(self):
        """The plugin's identity, clock and snapshot."""
        return {"plugin": self._driver.state()}

    def load_state_dict(self, state_dict):
        """Continues a saved policy; another plugin or other parameters are refused
        (``ValueError``) with the host's resume wording."""
        if "plugin" not in state_dict:
            raise ValueError("cannot resume from state_dict: it has no `plugin` entry")
        self._driver.load(state_dict["plugin"], "state_dict")


class WasmLabelSmoothing(_Stepped):
    """The label-smoothing ε of each step from a label-smoothing plugin, for
    ``F.cross_entropy(logits, y, label_smoothing=float(ls))``.

    ``batch_size=`` (a ``WasmBatchSize``) makes the plugin see the batch that controller chose
    for the step, as in the host; step the controller first, then this one.
    """

    _kind = "label-smoothing"

    def __init__(self, plugin, *, batch_size=None, **kwargs):
        super().__init__(plugin, **kwargs)
        self._batch_size = batch_size

    @property
    def epsilon(self):
        """This step's ε (a binary32 value widened exactly, as the host passes it on)."""
        batch = None if self._batch_size is None else self._batch_size.global_batch
        return self._driver.value(batch)

    def __float__(self):
        return self.epsilon

    def step(self):
        """Ends this step."""
        self.epsilon  # a step never asked still reaches the plugin, as in the host
        self._driver.advance()


class WasmBatchSize(_Stepped):
    """The global batch a batch-size controller asks for at each step.

    The clock advances by the batch each step used, so epochs stay epochs of samples while
    the batch grows (Smith et al.'s "don't decay the learning rate, increase the batch").
    ``accumulation_steps(micro_batch)`` turns the step's batch into gradient-accumulation
    steps of a fixed micro-batch per worker.
    """

    _kind = "batch-size"

    @property
    def global_batch(self):
        """This step's global batch (a multiple of the world size, checked by the runtime)."""
        return int(self._driver.value())

    @property
    def worker_batch(self):
        """This step's batch per worker."""
        return self.global_batch // self._driver.policy.state()["world_size"]

    def micro_batches(self, micro_batch):
        """This step's batch per worker cut into micro-batches of at most ``micro_batch``
        samples: ``[micro, micro, …, rest]``, summing to ``worker_batch``."""
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be at least 1, got {micro_batch}")
        n = self.worker_batch
        return [micro_batch] * (n // micro_batch) + ([n % micro_batch] if n % micro_batch else [])

    def accumulation_steps(self, micro_batch):
        """How many forward/backward passes of at most ``micro_batch`` samples this step's
        worker batch takes (scale each micro-batch's loss by its size / ``worker_batch``)."""
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be at least 1, got {micro_batch}")
        return math.ceil(self.worker_batch / micro_batch)

    def step(self):
        """Ends this step, which consumed this step's global batch."""
        self._driver.advance(self.global_batch)
