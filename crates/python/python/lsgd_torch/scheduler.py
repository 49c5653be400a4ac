"""``WasmLR``: a learning-rate schedule plugin as a ``torch.optim.lr_scheduler.LRScheduler``."""

from torch.optim.lr_scheduler import LRScheduler

from ._driver import Driver


class WasmLR(LRScheduler):
    """The learning rate of each step from a schedule plugin, as ``lsgd-host run --schedule``
    would set it.

    The plugin sees the host's train-state: step, fractional epoch, ``global_batch``,
    ``world_size``, ``base_lr`` (the optimizer's initial lr of its first parameter group) and
    ``reference_batch``. A group whose initial lr differs from the first group's gets the
    plugin's rate times the ratio of the two, as ``LambdaLR`` scales each group's base.

    Call ``step()`` once per optimizer step (after ``optimizer.step()``), as with any
    scheduler; ``observe(loss=…, metric=…)`` feeds ``last-loss`` and ``last-metric`` (the
    ``plateau`` plugin's input) and must come before the ``step()`` that ends the step. The
    constructor's own step gives step 0's rate.

    ``batch_size=`` (a ``WasmBatchSize``) makes the schedule see the batch that controller
    chose for each step, and count epochs in the samples those batches consumed, as in the
    host; step the controller first, then this scheduler.
    """

    def __init__(self, optimizer, plugin, *, steps_per_epoch, epochs, global_batch,
                 world_size=1, reference_batch=256, params=None, last_epoch=-1,
                 batch_size=None, **limits):
        self._batch_size = batch_size
        # The rate before any scheduler touched it: an earlier scheduler of a SequentialLR
        # has already moved "lr", and set "initial_lr" as this constructor would.
        first = optimizer.param_groups[0]
        base = first.get("initial_lr", first["lr"])
        self._driver = Driver(
            plugin, "schedule", params, steps_per_epoch=steps_per_epoch, epochs=epochs,
            global_batch=global_batch, world_size=world_size, reference_batch=reference_batch,
            base_lr=float(base), limits=limits,
        )
        super().__init__(optimizer, last_epoch)

    @property
    def policy(self):
        """The loaded plugin (``lsgd_torch._native.Policy``): name, identity, clock."""
        return self._driver.policy

    def get_lr(self):
        """The rate of step ``last_epoch`` for each parameter group."""
        self._driver.goto(self.last_epoch)
        batch = None if self._batch_size is None else self._batch_size.global_batch
        lr = self._driver.value(batch)
        first = float(self.base_lrs[0])
        # Multiplying by exactly 1.0 keeps the plugin's bits for the usual single base rate.
        return [lr if float(b) == first else lr * (float(b) / first) for b in self.base_lrs]

    # step(epoch) and SequentialLR's restart ask for the closed form: the plugin is one.
    _get_closed_form_lr = get_lr

    def observe(self, loss=None, metric=None):
        """Feeds the plugin: ``loss`` (this step's training loss) becomes ``last-loss`` when the
        step ends, ``metric`` (an evaluation result) ``last-metric`` from the next step on."""
        self._driver.observe(loss, metric)

    def state_dict(self):
        """PyTorch's scheduler state plus the plugin's identity, clock and snapshot."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_driver", "_batch_size")}
        out["plugin"] = self._driver.state()
        return out

    def load_state_dict(self, state_dict):
        """Continues a saved scheduler; a state_dict of another plugin or other parameters is
        refused (``ValueError``) with the host's resume wording."""
        state = dict(state_dict)
        plugin = state.pop("plugin", None)
        if plugin is None:
            raise ValueError("cannot resume from state_dict: it has no `plugin` entry (not a "
                             "WasmLR state_dict)")
        self._driver.load(plugin, "state_dict")
        self.__dict__.update(state)
