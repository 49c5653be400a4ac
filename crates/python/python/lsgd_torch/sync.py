"""``WasmSync``: a sync plugin (contract 0.5: local SGD, post-local SGD, DiLoCo, your own)
around an inner optimizer over ``torch.distributed``, as ``lsgd-host run --sync`` applies it.

Each step the plugin plans how the step moves (the runtime's ``check_plan``: ``synchronous``
only at a window's start, and a ``local`` answer at the run's last step becomes ``average``):

- ``synchronous``: the gradients are averaged over the ranks before the inner step, as DDP's
  all-reduce does (by ``step()`` itself, or by :func:`sync_hook` inside DDP's backward);
- ``local``: the inner step on this rank's own gradient (the mean over its own shard: nothing
  divides it by the world size), nothing exchanged;
- ``average``: a local step, then the ranks average their weights (as torch's
  ``average_parameters`` does: θ_k / k summed), the pseudo-gradient Δ = θ_global − mean goes
  to the plugin's ``outer-step`` as per-tensor norms, and the outer step it returns (torch
  SGD's with dampening 0) moves θ_global; every rank then continues from θ_global.

The arithmetic is the trainer's (``crates/train/src/trainer/windows.rs``): plain averaging
(lr 1, momentum 0, no scales) takes the ranks' mean exactly; otherwise the momentum buffer is
created as Δ at the first outer step with momentum, then ``m = μ·m + Δ``, the direction is
``Δ + μ·m`` with Nesterov, else ``m``, and ``θ_global −= lr·scale_i·direction``, in the
operations of ``torch.optim.SGD``'s single-tensor step.
"""

import copy
import math

import torch
import torch.distributed as dist

from ._driver import around
from .layer_rate import describe_tensors

#: Where ``state_dict()`` keeps the plugin's identity, clock, window and snapshot, θ_global and
#: the outer momentum.
STATE_KEY = "sync"


def _world(group):
    """The number of ranks of ``group`` (the world by default), 1 without torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _by_kind(tensors):
    """The indices of ``tensors`` grouped by dtype and device, in order: one flat buffer each."""
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return list(groups.values())


def _mean_over_ranks(tensors, group, k):
    """``tensors`` averaged over the ``k`` ranks of ``group`` the way torch's
    ``average_parameters`` and DDP's ``allreduce_hook`` do (each value divided by k, then
    summed over the ranks, one flat buffer per dtype); new tensors, the inputs untouched."""
    out = [None] * len(tensors)
    for idx in _by_kind(tensors):
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        flat /= k
        dist.all_reduce(flat, group=group)
        offset = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = flat[offset:offset + n].view_as(tensors[i])
            offset += n
    return out


def _sum_in_rank_order(values, group, k):
    """Each of ``values`` (floats) summed over the ranks in rank order, in binary64: the same
    bits on every rank (an all-gather, as the trainer's)."""
    mine = torch.tensor(values, dtype=torch.float64)
    if k == 1:
        return [float(v) for v in mine.tolist()]
    everyone = [torch.empty_like(mine) for _ in range(k)]
    dist.all_gather(everyone, mine, group=group)
    totals = [0.0] * len(values)
    for row in everyone:
        for i, v in enumerate(row.tolist()):
            totals[i] += v
    return totals


def _l2(t):
    """The Euclidean norm of ``t`` reduced in binary64 (the host's ``l2``)."""
    return float(t.double().norm())


class WasmSync(torch.optim.Optimizer):
    """``inner`` (any ``torch.optim.Optimizer``: SGD, AdamW, …) whose ranks synchronise when a
    sync plugin says so: local SGD (``"local-sgd"``), post-local SGD (``"post-local-sgd"``),
    DiLoCo (``"diloco"``), ``"adaptive-period"`` or your own component.

    The wrapper shares ``inner``'s ``param_groups`` and ``state``, so learning-rate schedulers
    (``WasmLR`` included) take it as their optimizer and set the inner rate. Call ``step()``
    where you called ``inner.step()``, on every rank, with each rank's loss the mean over its
    own shard (as under DDP): the plugin's plan decides whether the gradients are averaged
    first (``synchronous``) and whether the step ends a window (``average``). Do not wrap the
    model in DDP with its default all-reduce: that would make every step synchronous. A plain
    module works (``step()`` averages the gradients of a synchronous step itself); a DDP module
    takes :func:`sync_hook` as its communication hook (the post-local SGD hook's role).

    ``plugin`` is a path or a reference plugin's name; ``params`` its parameters as a dict
    (the host's ``--set sync.KEY=VALUE``). ``model``, when given, names the tensors the plugin
    sees as ``model.named_parameters()`` does (BatchNorm's as ``batchnorm``), in name order as
    the host sorts them; without it they are ``param0``, ``param1``, … in group order.
    ``group`` is the process group the ranks average over (default: the world).

    ``steps_per_epoch``, ``epochs``, ``global_batch`` and ``reference_batch`` give the
    plugin's train-state its run shape, as ``lsgd-host run`` does, ``world_size`` is the
    group's size. Give the run's shape: the runtime's final-step rule (a ``local`` plan at the
    run's last step becomes ``average``, so the run ends with one model) needs its last step.
    Left out, the clock is one endless epoch of global batches of ``world_size ×
    reference_batch``. ``base_lr`` of the state is the first group's initial rate. The other
    keyword arguments are the sandbox's limits: ``fuel``, ``deadline_ms``, ``memory_mb``.

    Making the wrapper is a collective: every rank's parameters become rank 0's (as DDP's
    constructor does) and θ_global starts from them.

    A plugin's fault (a trap, its fuel spent, ``synchronous`` inside a window, an outer step
    out of range) raises ``lsgd_torch.PluginFault`` naming plugin, call and step, before any
    weight changes: at an ``average`` step the local update is undone (the weights and the
    inner optimizer's state put back). Every rank sees the same inputs and faults alike.
    """

    def __init__(self, inner, plugin, params=None, *, model=None, group=None,
                 steps_per_epoch=None, epochs=None, global_batch=None, world_size=None,
                 reference_batch=256, **limits):
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"WasmSync wraps a torch.optim.Optimizer, not {type(inner).__name__}")
        k = _world(group)
        if world_size is not None and world_size != k:
            raise ValueError(
                f"world_size={world_size}, but the process group has {k} rank(s): the ranks "
                f"that average are the group's"
            )
        self._ready = False
        self._inner = inner
        self._group = group
        self._k = k
        self._driver = around(
            inner, plugin, "sync", params, steps_per_epoch=steps_per_epoch, epochs=epochs,
            global_batch=global_batch, world_size=k, reference_batch=reference_batch,
            limits=limits,
        )
        super().__init__([p for g in inner.param_groups for p in g["params"]], inner.defaults)
        self._share()
        self._ready = True
        self._tensors = describe_tensors(inner, model)
        params_ = self._params()
        for p in params_:
            if p.is_sparse:
                raise TypeError("WasmSync: sparse parameters cannot be averaged")
        with torch.no_grad():
            if k > 1:
                src = 0 if group is None else dist.get_global_rank(group, 0)
                for idx in _by_kind(params_):
                    flat = torch.cat([params_[i].detach().reshape(-1) for i in idx])
                    dist.broadcast(flat, src=src, group=group)
                    offset = 0
                    for i in idx:
                        n = params_[i].numel()
                        params_[i].copy_(flat[offset:offset + n].view_as(params_[i]))
                        offset += n
            #: θ_global: the weights the ranks last agreed on, in the plugin's tensor order.
            self._global = [p.detach().clone() for p in params_]
        #: The outer momentum buffer per tensor (None until the first outer step with momentum).
        self._momentum = [None] * len(params_)
        # The step whose gradients sync_hook already averaged inside DDP's backward.
        self._hooked = None
        #: The last outer step: ``{"lr", "momentum", "nesterov", "lr_scale"}``, None before one.
        self.last_outer_step = None
        #: What the plugin's last ``outer-step`` was given: ``(name, shape, role, ‖θ_global‖, ‖Δ‖,
        #: sqrt(mean_k ‖Δ_k‖²), ‖m‖, ⟨Δ, m⟩)`` per tensor.
        self.last_drift = []

    def _share(self):
        self.param_groups = self._inner.param_groups
        self.state = self._inner.state
        self.defaults = self._inner.defaults

    def _params(self):
        return [p for _, p, _, _ in self._tensors]

    @property
    def inner(self):
        """The wrapped optimizer."""
        return self._inner

    @property
    def policy(self):
        """The loaded plugin (``lsgd_torch._native.Policy``): name, identity, clock, window."""
        return self._driver.policy

    @property
    def plan(self):
        """How the step about to be taken moves: ``"synchronous"``, ``"local"`` or
        ``"average"`` (asked of the plugin once per step; a fault raises ``PluginFault``).
        A script that must know before its backward pass (to scale its loss, or to skip an
        exchange of its own) asks here; ``step()`` asks the same."""
        return self._driver.plan()

    @property
    def synchronous(self):
        """Whether this step's gradients are averaged over the ranks before the inner step."""
        return self.plan == "synchronous"

    @property
    def window(self):
        """``(local_steps, windows)`` before the step about to be taken: local steps since the
        ranks last agreed on the weights, and windows ended so far."""
        return self.policy.window

    @property
    def global_params(self):
        """θ_global, one tensor per parameter in the plugin's order."""
        return list(self._global)

    @property
    def momentum_buffers(self):
        """The outer momentum buffers (None where none was created yet)."""
        return list(self._momentum)

    def observe(self, loss=None, metric=None):
        """Feeds the plugin: ``loss`` (this rank's) becomes ``last-loss`` once this step ends,
        if the step agrees (``synchronous`` or ``average``: the ranks' mean; a local step's
        loss stays unknown to the plugin, as in the host); ``metric`` ``last-metric`` from the
        next step on. Observe alike on every rank: the losses are averaged collectively."""
        self._driver.observe(loss, metric)

    @torch.no_grad()
    def step(self, closure=None):
        """One step as the plugin plans it; returns the closure's loss, if any."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            self._driver.observe(loss=loss)
        step = self.policy.step
        # A fault raises here (or was raised by sync_hook's ask and is raised again): nothing
        # has changed yet.
        kind = self._driver.plan()
        if kind == "synchronous" and self._hooked != step:
            self._average_gradients()
        before = self._rollback_point() if kind == "average" else None
        self._inner.step()
        agreed_loss = None
        if kind == "synchronous":
            _, agreed_loss = self._agree([])
            self._follow()
        elif kind == "average":
            try:
                agreed_loss = self._end_window()
            except BaseException:
                self._roll_back(before)
                raise
        self._driver._loss = agreed_loss
        self._driver.advance()
        self._hooked = None
        return loss

    # -- a synchronous step --------------------------------------------------------------

    def _average_gradients(self):
        """The gradients averaged over the ranks as DDP's all-reduce hook averages them."""
        if self._k == 1:
            return
        with_grad = [p for p in self._params() if p.grad is not None]
        grads = [p.grad for p in with_grad]
        if any(g.is_sparse for g in grads):
            raise TypeError("WasmSync: sparse gradients cannot be averaged")
        for p, mean in zip(with_grad, _mean_over_ranks(grads, self._group, self._k)):
            p.grad.copy_(mean)

    def _follow(self):
        """θ_global becomes the weights as they are now (every rank's, after a synchronous
        step)."""
        for g, p in zip(self._global, self._params()):
            g.copy_(p.detach())

    def _agree(self, values):
        """``values`` (this rank's floats) each summed over the ranks in rank order, and the
        ranks' mean of the observed loss (None unless every rank observed one), from one
        gather: ``(sums, loss)``."""
        mine = self._driver._loss
        values = [*values, 0.0 if mine is None else 1.0, 0.0 if mine is None else float(mine)]
        totals = _sum_in_rank_order(values, self._group, self._k)
        count, loss_sum = totals[-2:]
        return totals[:-2], (loss_sum / self._k if count == self._k else None)

    # -- an average step ---------------------------------------------------------------

    def _rollback_point(self):
        """The weights and inner optimizer state before the local update of an ``average``
        step, to put back if its window's end faults."""
        weights = [p.detach().clone() for p in self._params()]
        state = {
            p: {k: v.clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in s.items()}
            for p, s in self._inner.state.items()
        }
        return weights, state

    def _roll_back(self, before):
        weights, state = before
        for p, w in zip(self._params(), weights):
            p.copy_(w)
        self._inner.state.clear()
        self._inner.state.update(state)

    def _end_window(self):
        """The end of a window: the ranks' weights averaged, the drift measured, the plugin's
        outer step applied to θ_global and every rank set to it. Returns the agreed loss."""
        params = self._params()
        # Each rank's own drift ‖θ_global − θ_k‖², then the ranks' sum of them (with the loss).
        own = []
        for g, p in zip(self._global, params):
            n = _l2(g - p.detach())
            own.append(n * n)
        rank_sq, loss = self._agree(own)
        if self._k == 1:
            means = [p.detach().clone() for p in params]
        else:
            means = _mean_over_ranks(params, self._group, self._k)
        deltas = [g - m for g, m in zip(self._global, means)]
        drift = []
        for (name, _, shape, role), g, d, m, sq in zip(
                self._tensors, self._global, deltas, self._momentum, rank_sq):
            if m is None:
                m_norm, dot = 0.0, 0.0
            else:
                m_norm = _l2(m)
                dot = float(d.double().flatten().dot(m.double().flatten()))
            drift.append((name, shape, role, _l2(g), _l2(d), math.sqrt(sq / self._k), m_norm,
                          dot))
        lr, mu, nesterov, scales = self.policy.outer_step(drift)
        self.last_drift = drift
        self.last_outer_step = {"lr": lr, "momentum": mu, "nesterov": nesterov,
                                "lr_scale": list(scales)}
        self._outer(lr, mu, nesterov, scales, deltas, means)
        return loss

    def _outer(self, lr, mu, nesterov, scales, deltas, means):
        """θ_global moved by the outer step and copied into every rank's weights."""
        params = self._params()
        if lr == 1.0 and mu == 0.0 and all(s == 1.0 for s in scales):
            # Plain averaging: the ranks' mean itself, as torch's averager leaves it.
            for g, p, mean in zip(self._global, params, means):
                g.copy_(mean)
                p.copy_(mean)
            return
        for i, (g, p, delta) in enumerate(zip(self._global, params, deltas)):
            # torch.optim.SGD's single-tensor step with dampening 0 and no weight decay.
            direction = delta
            if mu != 0.0:
                buf = self._momentum[i]
                if buf is None:
                    buf = torch.clone(delta).detach()
                    self._momentum[i] = buf
                else:
                    buf.mul_(mu).add_(delta)
                direction = delta.add(buf, alpha=mu) if nesterov else buf
            rate = lr * (scales[i] if scales else 1.0)
            g.add_(direction, alpha=-rate)
            p.copy_(g)

    # -- the optimizer's protocol --------------------------------------------------------

    def zero_grad(self, set_to_none=True):
        """The inner optimizer's ``zero_grad``."""
        self._inner.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        """Not supported: θ_global and the plugin's tensors are fixed when the wrapper is made
        (as the host's are for a run)."""
        if not self._ready:
            return super().add_param_group(param_group)
        raise NotImplementedError(
            "WasmSync: add parameter groups to the inner optimizer before wrapping it"
        )

    def state_dict(self):
        """The inner optimizer's state dict plus, under ``"sync"``, the plugin's identity,
        clock, window and snapshot (of a stateful plugin), θ_global, the outer momentum and,
        inside a window, this rank's weights. Inside a window every rank's weights and inner
        state are its own: save every rank's ``state_dict()``, not rank 0's alone."""
        out = self._inner.state_dict()
        saved = self._driver.state()
        saved["tensors"] = [name for name, _, _, _ in self._tensors]
        saved["global"] = [g.clone() for g in self._global]
        saved["outer_momentum"] = [None if m is None else m.clone() for m in self._momentum]
        saved["world_size"] = self._k
        # Inside a window this rank's weights are its own: kept here too, so that a resume
        # does not depend on the order the model and the wrapper are loaded in (making a
        # wrapper gives every rank rank 0's weights).
        inside = saved["window"][0] > 0
        saved["weights"] = [p.detach().clone() for p in self._params()] if inside else None
        out[STATE_KEY] = saved
        return out

    def load_state_dict(self, state_dict):
        """Continues a saved run: the inner optimizer's state, the plugin's clock, window and
        snapshot, θ_global and the outer momentum, and inside a window this rank's weights. A state_dict of another plugin or other
        parameters is refused (``ValueError``) with the host's resume wording, one of other
        tensors or taken inside a window on another number of ranks likewise, before anything
        changes."""
        state_dict = dict(state_dict)
        saved = state_dict.pop(STATE_KEY, None)
        if saved is None:
            raise ValueError(
                f"cannot resume from state_dict: it has no `{STATE_KEY}` entry (not a "
                f"WasmSync state_dict)"
            )
        names = [name for name, _, _, _ in self._tensors]
        if list(saved["tensors"]) != names:
            raise ValueError(
                f"cannot resume from state_dict: it holds θ_global for {list(saved['tensors'])}, "
                f"this optimizer has {names}"
            )
        for name, g, t in zip(names, self._global, saved["global"]):
            if tuple(t.shape) != tuple(g.shape):
                raise ValueError(f"cannot resume from state_dict: θ_global of {name} has shape "
                                 f"{tuple(t.shape)}, the parameter {tuple(g.shape)}")
        window = saved.get("window")
        if window is not None and window[0] > 0 and saved["world_size"] != self._k:
            raise ValueError(
                f"cannot resume from state_dict: it was written {window[0]} local step(s) into "
                f"a sync window on {saved['world_size']} rank(s), each with weights of its own; "
                f"resume it on {saved['world_size']} ranks, or from a state at a window's end"
            )
        before = self._driver.state()
        self._driver.load(saved, "state_dict")
        try:
            self._inner.load_state_dict(state_dict)
        except Exception:
            self._driver.load(before, "state_dict")
            raise
        self._share()
        with torch.no_grad():
            for g, t in zip(self._global, saved["global"]):
                g.copy_(t)
            weights = saved.get("weights")
            if weights is not None:
                for p, w in zip(self._params(), weights):
                    p.copy_(w)
        self._momentum = [None if m is None else m.detach().clone().to(g.dtype)
                          for m, g in zip(saved["outer_momentum"], self._global)]
        self._hooked = None

    def __repr__(self):
        return f"WasmSync({self._driver.policy.label}, {self._inner!r})"


def sync_hook(state, bucket):
    """A DDP communication hook driven by a ``WasmSync`` (``ddp.register_comm_hook(sync,
    sync_hook)``): at a ``synchronous`` step the bucket is averaged over the ranks as DDP's
    default hook does; at any other step it is returned as it is, each rank's own gradient
    (torch's ``post_localSGD_hook`` with ``post_local_gradient_allreduce=False``, with the
    plugin deciding when). A fault of the plan is raised by the following ``step()``."""
    buffer = bucket.buffer()
    try:
        kind = state.plan
    except Exception:
        # Raised again by step(), on every rank alike, before anything changes.
        kind = None
    if kind == "synchronous" and state._k > 1:
        state._hooked = state.policy.step
        buffer.div_(state._k)
        fut = dist.all_reduce(buffer, group=state._group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut
