"""``WasmLayerRate``: a layer-rate plugin (LARS, LAMB, your own) around ``torch.optim.SGD`` or
``torch.optim.AdamW``, as ``lsgd-host run --layer-rate`` applies it.

Each step the plugin sees, per parameter tensor, what the host's ``Optimizer::norms`` gives it
(``crates/train/src/optim/``): ‖w‖, ‖g‖ of the gradient as it is (without weight decay), ‖u‖ of
the update the inner optimizer would apply at a learning rate of 1 (decay and momentum or the
Adam moments included), the tensor's role and its weight decay. Its multiplier ``s`` then
scales that tensor's learning rate: the inner optimizer takes its own step at ``lr·s``, exactly
the host's ``rate = lr * scale``.
"""

import math

import torch

from ._driver import around

#: Where ``state_dict()`` keeps the plugin's identity, clock and snapshot.
STATE_KEY = "layer_rate"


def describe_tensors(inner, model):
    """``[(name, param, shape, role)]`` of every parameter of the optimizer ``inner``, in the
    order a plugin sees them (the host's): with ``model``, named as ``model.named_parameters()``
    names them, in name order, a tensor of a module with a ``running_mean`` buffer in the
    ``batchnorm`` role; without it ``param0``, ``param1``, … in the order of the parameter
    groups. Otherwise a tensor of fewer than two dimensions is a ``bias``, the rest ``weight``."""
    params = [p for g in inner.param_groups for p in g["params"]]
    if model is None:
        named = [(f"param{i}", p, False) for i, p in enumerate(params)]
    else:
        owners = {}
        for module_name, module in model.named_modules():
            # The host's rule: a tensor of a module with a running mean is BatchNorm's.
            bn = hasattr(module, "running_mean")
            for short, p in module.named_parameters(recurse=False):
                name = f"{module_name}.{short}" if module_name else short
                owners.setdefault(id(p), (name, bn))
        missing = [i for i, p in enumerate(params) if id(p) not in owners]
        if missing:
            raise ValueError(
                f"parameters {missing} of the optimizer (in group order) are not "
                f"parameters of the model given as model="
            )
        named = sorted(((*owners[id(p)], p) for p in params), key=lambda t: t[0])
        named = [(name, p, bn) for name, bn, p in named]
    out = []
    for name, p, bn in named:
        role = "batchnorm" if bn else "bias" if p.dim() < 2 else "weight"
        out.append((name, p, [int(d) for d in p.shape], role))
    return out


class WasmLayerRate(torch.optim.Optimizer):
    """``inner`` (a ``torch.optim.SGD`` or ``torch.optim.AdamW``) with each tensor's learning
    rate multiplied by a layer-rate plugin's output: LARS is ``SGD`` + ``"lars"``, LAMB is
    ``AdamW`` + ``"lamb"``.

    The wrapper shares ``inner``'s ``param_groups`` and ``state``, so learning-rate schedulers
    (``WasmLR`` included) take it as their optimizer and set the rate ``inner`` uses. Call
    ``step()`` where you called ``inner.step()``; every parameter of ``inner`` is one tensor
    of the plugin's list, those without a gradient with ‖g‖ = ‖u‖ = 0 (as in the host; such a
    tensor is not updated whatever its multiplier).

    ``plugin`` is a path or a reference plugin's name; ``params`` its parameters as a dict
    (the host's ``--set layer_rate.KEY=VALUE``). ``model``, when given, names the tensors as
    ``model.named_parameters()`` does and gives BatchNorm tensors (of a module with a
    ``running_mean`` buffer) the ``batchnorm`` role; the list is then in name order, as the
    host sorts it. Without it the tensors are ``param0``, ``param1``, … in the order of the
    parameter groups, and a tensor of fewer than two dimensions is a ``bias``.

    ``steps_per_epoch``, ``epochs``, ``global_batch``, ``world_size`` and ``reference_batch``
    give the plugin's train-state its run shape, as ``lsgd-host run`` does; they matter only
    to a plugin that reads the state (``lars`` and ``lamb`` do not). Left out, the clock is
    one endless epoch of global batches of ``world_size × reference_batch``. ``base_lr`` of the
    state is the first group's initial learning rate. ``batch_size=`` (a ``WasmBatchSize``)
    makes the state carry the batch that controller chose for the step, and the clock count
    it. The other keyword arguments are the sandbox's limits: ``fuel``, ``deadline_ms``,
    ``memory_mb``.

    A plugin's fault (a trap, its fuel spent, a NaN or negative multiplier, a wrong count)
    raises ``lsgd_torch.PluginFault`` before any weight changes; a schedule or other
    non-layer-rate plugin, or bad parameters, raise ``ValueError``; another inner optimizer
    ``TypeError``.
    """

    def __init__(self, inner, plugin, params=None, *, model=None, steps_per_epoch=None,
                 epochs=None, global_batch=None, world_size=1, reference_batch=256,
                 batch_size=None, **limits):
        if not isinstance(inner, (torch.optim.SGD, torch.optim.AdamW)):
            raise TypeError(
                f"WasmLayerRate wraps a torch.optim.SGD (LARS) or torch.optim.AdamW (LAMB), "
                f"not {type(inner).__name__}: the update norm the plugin sees is defined for "
                f"those two"
            )
        self._ready = False
        self._inner = inner
        self._batch_size = batch_size
        self._driver = around(
            inner, plugin, "layer-rate", params, steps_per_epoch=steps_per_epoch, epochs=epochs,
            global_batch=global_batch, world_size=world_size, reference_batch=reference_batch,
            limits=limits,
        )
        # Optimizer.__init__ sets up the hooks and the step profiling that PyTorch's machinery
        # expects of an optimizer; its own copies of the groups and state are then dropped for
        # inner's, so that a scheduler's rate is the rate inner steps with.
        super().__init__([p for g in inner.param_groups for p in g["params"]], inner.defaults)
        self._share()
        self._ready = True
        self._tensors = self._describe(model)
        #: Each tensor's multiplier at the last step, by name.
        self.last_multipliers = {}
        #: What the plugin was given at the last step: ``(name, shape, role, ‖w‖, ‖g‖, ‖u‖,
        #: weight_decay)`` per tensor, in its order.
        self.last_tensors = []

    def _share(self):
        self.param_groups = self._inner.param_groups
        self.state = self._inner.state
        self.defaults = self._inner.defaults

    def _describe(self, model):
        """``[(name, param, shape, role)]`` of every parameter of the inner optimizer, in the
        order the plugin sees them."""
        return describe_tensors(self._inner, model)

    @property
    def inner(self):
        """The wrapped optimizer."""
        return self._inner

    @property
    def policy(self):
        """The loaded plugin (``lsgd_torch._native.Policy``): name, identity, clock."""
        return self._driver.policy

    def observe(self, loss=None, metric=None):
        """Feeds the plugin: ``loss`` becomes ``last-loss`` once this step ends (a closure's
        loss does that by itself), ``metric`` ``last-metric`` from the next step on."""
        self._driver.observe(loss, metric)

    @torch.no_grad()
    def step(self, closure=None):
        """One update: the plugin's multiplier for every tensor, then the inner optimizer's
        step with each tensor at its group's rate times its multiplier. Returns the closure's
        loss, if any."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            self._driver.observe(loss=loss)
        batch = None if self._batch_size is None else int(self._batch_size.global_batch)
        groups = {id(p): g for g in self.param_groups for p in g["params"]}
        tensors = self._norms(groups)
        # A fault raises here, before the inner step: the weights stay those before the step.
        scales = self._driver.policy.multipliers(tensors, batch)
        self.last_tensors = tensors
        self.last_multipliers = {t[0]: s for t, s in zip(tensors, scales)}
        by_param = {id(p): s for (_, p, _, _), s in zip(self._tensors, scales)}
        self._scaled_step(by_param)
        self._driver.advance(batch)
        return loss

    def _norms(self, groups):
        """The plugin's tensor records, the norms as the host's ``Optimizer::norms`` computes
        them (the same expressions in the same order, reduced in binary64)."""
        adam = isinstance(self._inner, torch.optim.AdamW)
        norms = []
        for _, p, _, _ in self._tensors:
            group = groups[id(p)]
            w, g = p.detach(), p.grad
            if g is None:
                norms += [w.double().norm(), w.new_zeros((), dtype=torch.float64),
                          w.new_zeros((), dtype=torch.float64)]
                continue
            if g.is_sparse:
                g = g.to_dense()
            if group.get("maximize", False):
                g = -g
            u = self._adamw_update(p, w, g, group) if adam else self._sgd_update(p, w, g, group)
            norms += [w.double().norm(), g.double().norm(), u.double().norm()]
        # One transfer for all of them, not one synchronisation per tensor.
        values = torch.stack(norms).tolist() if norms else []
        out = []
        for i, (name, p, shape, role) in enumerate(self._tensors):
            wd = float(groups[id(p)]["weight_decay"])
            out.append((name, shape, role, values[3 * i], values[3 * i + 1], values[3 * i + 2], wd))
        return out

    def _sgd_update(self, p, w, g, group):
        """``torch.optim.SGD``'s step direction at lr 1 (the host's ``unit_update``)."""
        wd, m = group["weight_decay"], group["momentum"]
        d = g + w * wd if wd != 0 else g
        if m == 0:
            return d
        buf = self.state.get(p, {}).get("momentum_buffer")
        if buf is None:
            v = d  # PyTorch's first step: the buffer starts as d, undamped
        elif group["dampening"] != 0:
            v = buf * m + d * (1 - group["dampening"])
        else:
            v = buf * m + d
        return d + v * m if group["nesterov"] else v

    def _adamw_update(self, p, w, g, group):
        """``torch.optim.AdamW``'s bias-corrected ``m̂/(√v̂+ε)`` with the moments the next step
        will have, plus ``λ·w`` (LAMB's ``r + λw``; the host's AdamW ``norms``)."""
        beta1, beta2 = (float(b) for b in group["betas"])
        state = self.state.get(p, {})
        t = float(state["step"]) + 1 if "step" in state else 1.0
        exp_avg = state.get("exp_avg")
        exp_avg_sq = state.get("exp_avg_sq")
        # Before the first step the moments are zeros, as the host's and torch's start.
        m = (torch.zeros_like(g) if exp_avg is None else exp_avg).lerp(g, 1 - beta1)
        sq = torch.zeros_like(g) if exp_avg_sq is None else exp_avg_sq
        v = sq * beta2 + g * g * (1 - beta2)
        if group.get("amsgrad", False):
            v_max = state.get("max_exp_avg_sq")
            v = v if v_max is None else torch.maximum(v_max, v)
        correction1 = 1 - beta1 ** t
        correction2_sqrt = math.sqrt(1 - beta2 ** t)
        r = m / correction1 / (v.sqrt() / correction2_sqrt + group["eps"])
        return r + w * group["weight_decay"]

    def _scaled_step(self, scales):
        """The inner optimizer's own step, each tensor at ``lr·s``: its groups are split by
        multiplier for the one call, so the update is PyTorch's own at the scaled rate (the
        state is keyed by tensor, so it is shared); at ``s == 1`` the group is the original."""
        groups = self._inner.param_groups
        split = []
        for group in groups:
            by_scale = {}
            for p in group["params"]:
                by_scale.setdefault(scales.get(id(p), 1.0), []).append(p)
            for s, params in by_scale.items():
                if s == 1.0 and len(params) == len(group["params"]):
                    split.append(group)
                    continue
                part = dict(group, params=params)
                if s != 1.0:
                    part["lr"] = group["lr"] * s
                split.append(part)
        if all(a is b for a, b in zip(split, groups)) and len(split) == len(groups):
            self._inner.step()
            return
        self._inner.param_groups = split
        try:
            self._inner.step()
        finally:
            self._inner.param_groups = groups

    def zero_grad(self, set_to_none=True):
        """The inner optimizer's ``zero_grad``."""
        self._inner.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        """Not supported: the plugin's list of tensors is fixed when the wrapper is made (as
        the host's is for a run)."""
        if not self._ready:
            # Optimizer.__init__ building the groups that _share then replaces.
            return super().add_param_group(param_group)
        raise NotImplementedError(
            "WasmLayerRate: add parameter groups to the inner optimizer before wrapping it"
        )

    def state_dict(self):
        """The inner optimizer's state dict plus, under ``"layer_rate"``, the plugin's
        identity, clock and snapshot (of a stateful plugin)."""
        out = self._inner.state_dict()
        out[STATE_KEY] = self._driver.state()
        return out

    def load_state_dict(self, state_dict):
        """Continues a saved run: the inner optimizer's state and the plugin's clock. A
        state_dict of another plugin or other parameters is refused (``ValueError``) with the
        host's resume wording, before anything changes."""
        state_dict = dict(state_dict)
        saved = state_dict.pop(STATE_KEY, None)
        if saved is None:
            raise ValueError(
                f"cannot resume from state_dict: it has no `{STATE_KEY}` entry (not a "
                f"WasmLayerRate state_dict)"
            )
        before = self._driver.state()
        self._driver.load(saved, "state_dict")
        try:
            self._inner.load_state_dict(state_dict)
        except Exception:
            self._driver.load(before, "state_dict")
            raise
        # The inner optimizer's load replaced its group and state objects.
        self._share()

    def __repr__(self):
        return f"WasmLayerRate({self._driver.policy.label}, {self._inner!r})"
