"""``WasmLR``: a learning-rate schedule plugin as a ``torch.optim.lr_scheduler.LRScheduler``."""

import torch
from torch.optim.lr_scheduler import LRScheduler

from ._driver import Driver
from ._plugins import settings


def _group_params(params, n):
    """``params`` for each of ``n`` parameter groups: one dict for all, or a list of dicts,
    one per group (as torch takes a list ``max_lr`` or ``min_lr``)."""
    if params is None or isinstance(params, dict):
        return [params] * n
    if isinstance(params, (list, tuple)) and all(p is None or isinstance(p, dict) for p in params):
        if len(params) != n:
            raise ValueError(f"params has {len(params)} dicts, but the optimizer has {n} "
                             f"parameter groups: give one dict per group, or one dict for all")
        return list(params)
    raise TypeError("params must be a dict of plugin parameters or a list of them, one per "
                    f"parameter group, not {type(params).__name__}")


def _stored(held, lr):
    """``lr`` as a group whose lr is ``held`` will hold it: a tensor lr (torch allows one)
    rounds to its dtype."""
    return held.new_tensor(lr).item() if isinstance(held, torch.Tensor) else lr


class WasmLR(LRScheduler):
    """The learning rate of each step from a schedule plugin, as ``lsgd-host run --schedule``
    would set it.

    Each parameter group runs the plugin with its own initial lr as ``base_lr``, so absolute
    parameters (``eta_min``, ``min_lr``) stay absolute per group as in torch; ``params`` may be
    a list of dicts, one per group (torch's per-group ``max_lr``/``min_lr``). Groups with the
    same initial lr and parameters share one plugin instance. The plugin also sees the host's
    train-state: step, fractional epoch, ``global_batch``, ``world_size`` and
    ``reference_batch``.

    Like torch's own schedulers it has a closed form and a chainable form. ``step(epoch)`` and
    ``SequentialLR``'s milestones use the closed form: the plugin's rate. ``step()`` uses the
    chainable form: the group's current rate times the plugin's change since its last step, so
    that ``ChainedScheduler`` and other schedulers stepping the same optimizer multiply their
    factors with it; alone it gives the plugin's rate bit for bit. A contract-0.4 schedule's
    momentum (one-cycle's) is written to each group's ``momentum`` (SGD) or ``betas[0]``
    (Adam, AdamW), as ``OneCycleLR(cycle_momentum=True)`` does; ``momentum=False`` leaves it.

    ``last_epoch`` counts optimizer steps (``step(epoch)`` takes a step index): stepped once
    per epoch, give ``steps_per_epoch=1``. Call ``step()`` once per optimizer step (after
    ``optimizer.step()``); ``observe(loss=…, metric=…)`` feeds ``last-loss`` and
    ``last-metric`` (the ``plateau`` plugin's input) and must come before the ``step()`` that
    ends the step. The constructor's own step gives step 0's rate.

    ``batch_size=`` (a ``WasmBatchSize``) makes the schedule see the batch that controller
    chose for each step, and count epochs in the samples those batches consumed, as in the
    host; step the controller first, then this scheduler.
    """

    def __init__(self, optimizer, plugin, *, steps_per_epoch, epochs, global_batch,
                 world_size=1, reference_batch=256, params=None, last_epoch=-1,
                 batch_size=None, momentum=True, **limits):
        self._batch_size = batch_size
        self._cycle_momentum = bool(momentum)
        groups = optimizer.param_groups
        # One plugin per distinct (initial lr, parameters): each group's own base_lr.
        self._drivers, self._group_driver, seen = [], [], {}
        for group, p in zip(groups, _group_params(params, len(groups))):
            # The rate before any scheduler touched it: an earlier scheduler of a SequentialLR
            # has already moved "lr", and set "initial_lr" as this constructor would.
            base = float(group.get("initial_lr", group["lr"]))
            key = (base, tuple(settings(p)))
            if key not in seen:
                seen[key] = len(self._drivers)
                self._drivers.append(Driver(
                    plugin, "schedule", p, steps_per_epoch=steps_per_epoch, epochs=epochs,
                    global_batch=global_batch, world_size=world_size,
                    reference_batch=reference_batch, base_lr=base, limits=limits,
                ))
            self._group_driver.append(seen[key])
        # The chainable form's bookkeeping, per group: the rate this scheduler wrote last, and
        # the rate the other schedulers' factors alone would give (the group's base at first).
        self._written = [None] * len(groups)
        self._others = [None] * len(groups)
        # Whether any plugin answers momentum (contract 0.4): the others are not asked.
        self._momentum_drivers = any(d._answers_momentum for d in self._drivers)
        super().__init__(optimizer, last_epoch)

    @property
    def policy(self):
        """The loaded plugin of the first parameter group (``lsgd_torch._native.Policy``):
        name, identity, clock."""
        return self._drivers[0].policy

    def _rates(self):
        """Each group's plugin rate at step ``last_epoch``, its momentum written on the way."""
        batch = None if self._batch_size is None else self._batch_size.global_batch
        t = self.last_epoch
        rates = []
        for d in self._drivers:
            d.goto(t)
            rates.append(d.value(batch))
        if self._cycle_momentum and self._momentum_drivers:
            for i, group in enumerate(self.optimizer.param_groups):
                m = self._drivers[self._group_driver[i]].momentum(batch)
                if m is not None:
                    self._write_momentum(group, m)
        if len(rates) == 1:
            return rates * len(self._group_driver)
        return [rates[k] for k in self._group_driver]

    def _write_momentum(self, group, m):
        if "betas" in group:
            group["betas"] = (m, *tuple(group["betas"])[1:])
        elif "momentum" in group:
            group["momentum"] = m
        else:
            raise ValueError(
                f"WasmLR: plugin {self.policy.label} sets the momentum, but "
                f"{type(self.optimizer).__name__}'s groups have neither `momentum` nor `betas`;"
                " pass momentum=False to leave it")

    def get_lr(self):
        """The chainable form: each group's current rate times the plugin's change since this
        scheduler's last step (other schedulers' factors carry through)."""
        out = []
        first = self.last_epoch == 0
        for i, (group, rate) in enumerate(zip(self.optimizer.param_groups, self._rates())):
            held = group["lr"]
            base = float(self.base_lrs[i])
            now, written, others = float(held), self._written[i], self._others[i]
            if written is None or first:
                # As torch's chainable forms at step 0: the rate found is the base times the
                # other schedulers' factors (a SequentialLR restarts here too).
                others = now if first else base
            elif now != written:
                # Another scheduler moved the rate since this one wrote it: a chainable one
                # multiplied it (its factor carries over); from 0, a closed form set it.
                others = others * (now / written) if written != 0 else now
            # The plugin's bits where nothing else acts; a product of factors otherwise.
            lr = rate if others == base or base == 0 else others * (rate / base)
            self._written[i], self._others[i] = _stored(held, lr), others
            out.append(lr)
        return out

    def _get_closed_form_lr(self):
        """The closed form (``step(epoch)``, ``SequentialLR``'s milestones): the plugin's rate
        of each group at step ``last_epoch``, whatever other schedulers did."""
        out = self._rates()
        self._written = [_stored(g["lr"], lr) for g, lr in zip(self.optimizer.param_groups, out)]
        self._others = [float(b) for b in self.base_lrs]
        return out

    def observe(self, loss=None, metric=None):
        """Feeds the plugin: ``loss`` (this step's training loss) becomes ``last-loss`` when the
        step ends, ``metric`` (an evaluation result) ``last-metric`` from the next step on."""
        for d in self._drivers:
            d.observe(loss, metric)

    def state_dict(self):
        """PyTorch's scheduler state plus each plugin's identity, clock and snapshot."""
        skip = ("optimizer", "_drivers", "_batch_size")
        out = {k: v for k, v in self.__dict__.items() if k not in skip}
        out["plugins"] = [d.state() for d in self._drivers]
        return out

    def load_state_dict(self, state_dict):
        """Continues a saved scheduler; a state_dict of another plugin or other parameters is
        refused (``ValueError``) with the host's resume wording."""
        state = dict(state_dict)
        plugins = state.pop("plugins", None)
        if plugins is None and "plugin" in state:
            # Saved before each group ran its own plugin: one plugin for every group.
            plugins = [state.pop("plugin")]
        if plugins is None:
            raise ValueError("cannot resume from state_dict: it has no `plugins` entry (not a "
                             "WasmLR state_dict)")
        if len(plugins) != len(self._drivers):
            raise ValueError(
                f"cannot resume from state_dict: it has {len(plugins)} plugin states, this "
                f"WasmLR runs {len(self._drivers)} (one per distinct group lr and parameters)")
        for d, saved in zip(self._drivers, plugins):
            d.load(saved, "state_dict")
        state.setdefault("_written", [None] * len(self._group_driver))
        state.setdefault("_others", [None] * len(self._group_driver))
        self.__dict__.update(state)
