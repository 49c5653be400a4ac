"""Gradient compression for ``DistributedDataParallel`` through lsgd-host's codec plugins.

``model.register_comm_hook(CodecState(None, "codec-top-k"), codec_hook)`` moves each DDP bucket
as ``lsgd-host run --codec`` moves its buckets (``crates/train/src/exchange/codec.rs``): the same
plugin, the same bucket metadata and seeds (``Codec.meta``), the same rounds, the same sum or
gather, the same error feedback (GRACE's residual: p = g + e; e <- p - decode(own payload)),
and for a stateful codec (contract 0.4: ``codec-powersgd``'s warm start) the same per-bucket
codec state (``Codec.next_state`` of what every rank received, the next step's
``BucketMeta.state``), kept as the trainer keeps it (``crates/train/src/exchange/carry.rs``). The exchange itself is
the host's, in Rust (``lsgd_runtime::exchange``, through ``Codec.exchange``); this module is
the DDP glue: buckets, residuals and states, and the resume onto DDP's first buckets; the
collectives over ``torch.distributed`` and the thread that moves a bucket while autograd
computes the next are ``_transport``'s. ``Codec.round_trip`` is the same
exchange on one rank, as ``lsgd-host compare`` runs it.
"""

import logging
import math
import time
import weakref

import torch
import torch.distributed as dist

from . import _plugins
from ._native import Codec, blake3_hex
from ._transport import _DECODE, _Mover, _Worker

__all__ = ["CodecState", "codec_hook"]

logger = logging.getLogger(__name__)


def _feedback(mode):
    """``error_feedback=`` as ``"own"``, ``"mean"`` or False."""
    if mode is True or mode == "own":
        return "own"
    if mode == "mean":
        return "mean"
    if mode is False or mode is None:
        return False
    raise ValueError(f'error_feedback must be True, "own", "mean" or False, not {mode!r}')


def _param_names(names):
    """``{id(parameter): name}`` from a module, a ``{name: parameter}`` dict or (name, parameter)
    pairs."""
    if names is None:
        return {}
    if isinstance(names, torch.nn.Module):
        names = names.named_parameters()
    elif isinstance(names, dict):
        names = names.items()
    out = {}
    for name, p in names:
        # DDP's own parameter names carry its wrapper's prefix; the codec sees the model's.
        out[id(p)] = name.removeprefix("module.")
    return out


class CodecState:
    """What :func:`codec_hook` keeps between calls: the codec plugin, the step counter, the
    error-feedback residual of every bucket, a stateful codec's state of every bucket, and the
    bytes sent.

    ``plugin`` is a codec plugin's path or name (``codec-top-k`` is found through
    ``LSGD_PLUGIN_PATH``), ``params`` its parameters as a dict (``{"density": 0.01}``), ``seed``
    the run's seed, from which the buckets' seeds derive as in ``lsgd-host run --seed``.
    ``limits`` are the sandbox's (``fuel_per_float``, ``deadline_ms``, ``memory_mb``,
    ``canonical_nans``). ``error_feedback`` is ``True`` (or ``"own"``: GRACE's residual,
    e <- p - decode(own payload)), ``"mean"`` (PyTorch ``powerSGD_hook``'s, e <- p - decode(sum)/k:
    the host's ``--error-feedback mean``, and one decode fewer per bucket) or ``False``.
    Error feedback starts at iteration ``start_iter`` (1, as PyTorch's PowerSGD hook: after the
    bucket rebuild DDP does after its first iteration). ``names`` (the model, a
    ``{name: parameter}`` dict or pairs) gives the codec the parameters' names; without it they
    are ``param0``, ``param1``, ... per bucket. ``overlap=False`` exchanges every bucket on the
    caller's thread (see :func:`codec_hook`).

    A stateful codec (``codec.stateful``: ``codec-powersgd`` unless ``warm_start=false``) keeps
    a state per bucket from step 0 on, whatever ``start_iter`` says: the same bytes on every
    rank, as the codec computes them from what every rank received. A step's new residuals and
    states become the state only once its last bucket is through.

    What is kept belongs to what a bucket holds, not to its index: ``layouts[b]`` lists bucket
    ``b``'s parameters (by name where ``names`` gives one, else by their order in the first
    buckets this state saw in its process, which DDP builds from the model's parameter order),
    shapes and offsets. A bucket that holds exactly what a kept one held gets its residual and
    codec state, whatever its index; a bucket that DDP regrouped gets its parameters' residuals
    slice by slice and starts its codec state afresh. A state loaded from a checkpoint taken
    once DDP had rebuilt its buckets exchanges the kept buckets themselves while the new
    process's DDP still hands over its first, pre-rebuild buckets, so the resumed run continues
    bit for bit.

    It pickles like PyTorch's ``PowerSGDState``, without the process group (``None`` after
    loading: the default group), with the residuals and codec states (as uint8 tensors), and
    loads under ``torch.load(weights_only=True)``; loading reloads the plugin and refuses one
    whose blake3 or parameters differ from the saved ones. Each rank's residuals are its own:
    save every rank's state. ``names`` is not kept; pass it again with :meth:`set_names`.
    """

    _PICKLED = (
        "plugin",
        "settings",
        "limits",
        "error_feedback",
        "overlap",
        "seed",
        "start_iter",
        "iter",
        "residuals",
        "layouts",
        "bytes_sent",
        "total_bytes_sent",
    )
    #: The pickled state's format: 2 keys what is kept by the buckets' contents.
    _FORMAT = 2

    def __init__(
        self,
        process_group,
        plugin,
        *,
        error_feedback=True,
        params=None,
        seed=0,
        start_iter=1,
        names=None,
        overlap=True,
        **limits,
    ):
        if start_iter < 0:
            raise ValueError(f"start_iter must be >= 0, not {start_iter}")
        self.process_group = process_group
        #: ``"own"``, ``"mean"`` or False.
        self.error_feedback = _feedback(error_feedback)
        #: Whether buckets move on the state's thread while autograd goes on (see codec_hook).
        self.overlap = bool(overlap)
        #: The plugin as given (a path or a name).
        self.plugin = str(plugin)
        #: Its parameters as the host's ``--set`` text.
        self.settings = _plugins.settings(params)
        self.limits = dict(limits)
        self.seed = int(seed)
        self.start_iter = int(start_iter)
        #: Completed steps (calls of the last bucket): the step the codec sees.
        self.iter = 0
        #: Each bucket index's residual e, float32, once error feedback has started.
        self.residuals = {}
        #: Each bucket index's codec state (bytes) for the next step, for a stateful codec.
        self.states = {}
        #: What each bucket of the last step held, ((parameter, shape, offset), ...): the
        #: parameter's name, or its number where it has none. Residuals and codec states belong
        #: to these contents.
        self.layouts = {}
        #: Payload bytes this rank sent in the last step (every bucket and round).
        self.bytes_sent = 0
        #: The same over every step.
        self.total_bytes_sent = 0
        self._resumed, self._loaded_from = False, None
        self._load()
        self.set_names(names)

    def _load(self):
        self.codec = Codec(self.plugin, self.settings, **self.limits)
        self._worker = _Worker()
        # Parameters without a name are numbered as this process first sees them: DDP's first
        # buckets, built from the model's parameter order, so the same numbers in every process
        # that builds the same model. id() alone would not do: an id is reused once its tensor
        # is gone, hence the weak reference beside it.
        self._numbers = {}
        self._next_number = 0
        self._steps_here = 0
        # DDP's buckets of this process's first step, until DDP rebuilds them (after its first
        # iteration, its second with static_graph), and whether a step waited for its last
        # bucket to exchange the kept buckets instead (see codec_hook).
        self._first_buckets = None
        self._rebuilt = False
        self._held_any = False
        self._reset_step()
        self._created = time.monotonic_ns()
        _plugins.register(self)

    def _reset_step(self):
        # A step's new residuals and codec states become the state only once its last bucket
        # is through, so a fault mid-step leaves the state (and a checkpoint of it) as before
        # the step: {bucket: (residual or None, codec state or None, layout)}.
        self._staged = {}
        self._step_bytes = 0
        # A decode fault of this rank, told to the others at the next agreement.
        self._fault = None
        # The kept buckets whose residual and codec state a bucket of this step took whole, and
        # the parameters whose residual slices were carried into a regrouped bucket.
        self._taken = set()
        self._carried = set()
        # DDP's buckets of this step as it handed them over, whether its first one has been,
        # and the buckets of a step that waits for its last one (see codec_hook).
        self._ddp = {}
        self._begun = False
        self._held = None

    def set_names(self, names):
        """Names the parameters for the codec: the model, a ``{name: parameter}`` dict, or
        (name, parameter) pairs; ``None`` forgets them."""
        self._names = _param_names(names)
        # Bucket index: (its parameters, its length, its tensors for Codec.meta, its layout).
        self._described = {}

    def _key(self, p):
        """The parameter as the kept layouts know it: its name, else its number."""
        name = self._names.get(id(p))
        if name is not None:
            return name
        known = self._numbers.get(id(p))
        if known is None or known[0]() is not p:
            known = (weakref.ref(p), self._next_number)
            self._next_number += 1
            self._numbers[id(p)] = known
        return known[1]

    def _rank_record(self):
        # check_ranks requires "state" to be equal on every rank. The residuals are not: each
        # rank keeps what its own codec dropped of its own gradients (the host keeps them "per
        # bucket and per rank" too). What every rank must share is the bucket layout the
        # residuals and codec states belong to (DDP syncs its rebuilt buckets from rank 0; the
        # parameters' names or numbers with it) and a stateful codec's states, computed from
        # what every rank received (the host compares them in its consistency check); the
        # residuals' own digest is reported beside it, for a look, not for comparison.
        shared = None
        if self.layouts or self.states:
            shared = repr(sorted(self.layouts.items())).encode()
            for b in sorted(self.states):
                state = self.states[b]
                shared += b"%d:%d:" % (b, len(state)) + state
        residuals = None
        if self.residuals:
            residuals = blake3_hex(
                b"".join(self.residuals[b].numpy().tobytes() for b in sorted(self.residuals))
            )
        return {
            "kind": "codec",
            "label": self.codec.label,
            "identity": self.codec.identity,
            "blake3": self.codec.blake3,
            "params": self.codec.params,
            "step": self.iter,
            "state": None if shared is None else blake3_hex(shared),
            "residuals": residuals,
        }

    def __getstate__(self):
        """Everything but the process group and the loaded plugin (reloaded when unpickled),
        in types ``torch.load(weights_only=True)`` accepts."""
        logger.warning("NOTE: Process group is not serializable and excluded from a saved state.")
        state = {k: getattr(self, k) for k in self._PICKLED}
        state["states"] = {b: _bytes_tensor(s) for b, s in self.states.items()}
        state["format"] = self._FORMAT
        state["rank"] = _rank(self.process_group)
        state["codec_blake3"] = self.codec.blake3
        state["codec_params"] = self.codec.params
        return state

    def __setstate__(self, state):
        """Restores a pickled state: reloads the plugin, checks that it is the one saved, and
        leaves ``process_group`` None (the default group). A state pickled before its residuals
        and codec states were keyed by the buckets' contents loads without them."""
        logger.warning(
            "NOTE: Process group will be set to the default group. If a different group is "
            "desired, set `process_group` after the state is loaded."
        )
        saved = (state.pop("codec_blake3"), [tuple(p) for p in state.pop("codec_params")])
        fmt = state.pop("format", 1)
        self._loaded_from = state.pop("rank", None)
        state.setdefault("states", {})
        state.setdefault("overlap", True)
        # Saved before "mean" existed: True was GRACE's residual.
        state["error_feedback"] = _feedback(state["error_feedback"])
        if fmt < self._FORMAT:
            # Kept by bucket index and (shape, offset) only: nothing tells which parameters
            # they belong to, and a resumed process's first buckets are not the saved ones.
            if state["residuals"] or state["states"]:
                logger.warning(
                    "codec hook: this state was saved by an older lsgd-torch, which kept "
                    "residuals and codec states by bucket index; they are dropped (error "
                    "feedback and the codec's state start afresh at step %d)",
                    state["iter"],
                )
            state["residuals"], state["states"], state["layouts"] = {}, {}, {}
        state["states"] = {b: _state_bytes(s) for b, s in state["states"].items()}
        for k, v in state.items():
            setattr(self, k, v)
        # Buckets kept from before the checkpoint, which DDP's first buckets of this process
        # are not (see codec_hook).
        self._resumed = bool(self.layouts)
        self.process_group = None
        self._load()
        self.set_names(None)
        loaded = (self.codec.blake3, [tuple(p) for p in self.codec.params])
        if loaded != saved:
            raise ValueError(
                f"codec {self.codec.label}: the state was saved with blake3 {saved[0]} and "
                f"params {saved[1]}, but the plugin loaded now has blake3 {loaded[0]} and "
                f"params {loaded[1]}; its residuals and codec states belong to the other one"
            )

    def _commit(self):
        rebuild = self._first_buckets is not None and not self._rebuilt
        rebuild = rebuild and self._ddp != self._first_buckets
        # Codec states of DDP's first buckets are expected to go at its rebuild.
        self._report_dropped(expected=rebuild and self.layouts == self._first_buckets)
        if rebuild:
            self._rebuilt = True
            if self._resumed and not self._held_any:
                # The saved buckets were DDP's first ones, and its rebuilt ones do not exist
                # before its rebuild: nothing could have told the steps before.
                since = self.iter - self._steps_here
                logger.warning(
                    "codec hook: DDP rebuilt its buckets for step %d; %s ran on DDP's first "
                    "buckets, which were the saved ones: the checkpoint was taken before DDP's "
                    "first rebuild, so an uninterrupted run may have had the rebuilt ones there, "
                    "and the runs differ from there on (a checkpoint saved after two steps or "
                    "more, three with static_graph, resumes bit for bit)",
                    self.iter,
                    f"step {since}" if since == self.iter - 1 else f"steps {since}-{self.iter - 1}",
                )
        if self._first_buckets is None:
            self._first_buckets = self._ddp
        self.layouts = {b: layout for b, (_, _, layout) in self._staged.items()}
        self.residuals = {b: r for b, (r, _, _) in self._staged.items() if r is not None}
        self.states = {b: s for b, (_, s, _) in self._staged.items() if s is not None}
        self.bytes_sent = self._step_bytes
        self.total_bytes_sent += self._step_bytes
        self.iter += 1
        self._steps_here += 1
        self._reset_step()

    def _report_dropped(self, expected):
        """Logs what was kept and no bucket of the step took: a residual is lost (what the codec
        had not sent of those parameters yet), a codec state only restarts its bucket (at
        DDP's first rebuild, when ``expected``, as information)."""
        lost = [
            key
            for b, e in self.residuals.items()
            if b not in self._taken
            for key, _, _ in self.layouts[b]
            if key not in self._carried
        ]
        if lost:
            logger.warning(
                "codec hook: step %d has no bucket holding parameters %s; their residuals "
                "are dropped",
                self.iter,
                lost,
            )
        restarted = [b for b in self.states if b not in self._taken]
        if restarted:
            log = logger.info if expected else logger.warning
            log(
                "codec hook: no bucket of step %d holds what kept bucket(s) %s held (DDP "
                "regrouped its buckets); their codec states are dropped and the codec starts "
                "those buckets afresh (residuals are carried parameter by parameter)",
                self.iter,
                restarted,
            )

    def _kept(self, b, layout, n, feedback):
        """The residual (or None; only when ``feedback``) and codec state (or ``b""``) of a
        bucket of ``n`` floats holding ``layout``: a kept bucket's whole where one held the same
        (bucket ``b`` first), else its parameters' residual slices and no codec state."""
        if self.layouts.get(b) == layout:
            found = b
        else:
            found = next((c for c, kept in self.layouts.items() if kept == layout), None)
        if found is not None:
            self._taken.add(found)
            return (self.residuals.get(found) if feedback else None), self.states.get(found, b"")
        if not feedback or not self.residuals:
            return None, b""
        where = {
            key: (c, offset)
            for c, kept in self.layouts.items()
            if c in self.residuals
            for key, _, offset in kept
        }
        e = None
        for key, shape, offset in layout:
            if key not in where:
                continue
            c, at = where[key]
            size = math.prod(shape)
            if e is None:
                e = torch.zeros(n, dtype=torch.float32)
            e[offset : offset + size] = self.residuals[c][at : at + size]
            self._carried.add(key)
        return e, b""

    def _owner_check(self, rank):
        """Warns when this rank goes on with residuals another rank saved."""
        if self._loaded_from is not None and self._loaded_from != rank and self.residuals:
            logger.warning(
                "codec hook: rank %d goes on with the residuals rank %d saved; each rank's "
                "residuals are its own (save every rank's CodecState to resume exactly)",
                rank,
                self._loaded_from,
            )


def _bytes_tensor(b):
    """``bytes`` as a uint8 tensor (what ``torch.load(weights_only=True)`` reads back)."""
    if not b:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def _state_bytes(s):
    """A pickled codec state (a uint8 tensor; ``bytes`` before format 2) as bytes."""
    return s.numpy().tobytes() if isinstance(s, torch.Tensor) else bytes(s)


def _rank(group):
    """This process's rank in ``group`` (the default group for None), or None outside one."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(group if group is not None else dist.group.WORLD)


def _describe(state, params, grads, base):
    """The tensors of a bucket as ``Codec.meta`` takes them, and its layout (what it holds):
    ``grads`` are views into the flat buffer whose storage offset is ``base``."""
    tensors, layout = [], []
    for i, (p, g) in enumerate(zip(params, grads)):
        key = state._key(p)
        name = key if isinstance(key, str) else f"param{i}"
        # gradients() are views into the bucket's flat buffer: their offset is the slice's.
        offset = g.storage_offset() - base
        tensors.append((name, list(p.shape), 0, offset, p.numel()))
        layout.append((key, tuple(p.shape), offset))
    return tensors, tuple(layout)


def codec_hook(state, bucket):
    """A DDP communication hook that moves each gradient bucket through ``state``'s codec
    plugin: ``model.register_comm_hook(state, codec_hook)``. Returns a future of the averaged
    (decoded) bucket. A stateful codec's ``next_state`` is called after the bucket's decode;
    the step's new states are kept once its last bucket is through.

    Every bucket but the step's last is exchanged on the state's thread, so that DDP's backward
    pass goes on while it moves (a codec's rounds follow one another, each after the length
    agreement, so the bucket's whole exchange is the unit that overlaps). The last bucket waits
    for the others and is exchanged on the caller's thread: the backward pass has nothing left
    to compute then, and a fault is raised from there, with its type. With
    ``CodecState(..., overlap=False)`` every bucket is exchanged on the caller's thread, the
    backward pass waiting for it: no gain where the cores are already busy (two ranks on two
    cores: crates/python/bench/bench_comm.py --no-overlap), none lost to the thread hand-off.

    A state loaded from a checkpoint keeps the buckets of the step before it was saved. Until
    DDP rebuilds its buckets in the new process (after its first iteration, its second with
    ``static_graph``), it hands over its first ones (by default one bucket of every parameter);
    in those steps the hook waits for the step's last bucket and exchanges the kept buckets
    themselves, cut from DDP's, as the uninterrupted run did.

    Faults raise ``PluginFault`` on the rank where the plugin failed and on the others (naming
    that rank); the state is then as before the step.
    """
    buffer = bucket.buffer()
    b = bucket.index()
    params = bucket.parameters()
    # DDP hands over the same bucket step after step (its layout follows from its parameters
    # and their order); describing it costs microseconds per tensor on the backward pass.
    known = state._described.get(b)
    if known is not None:
        same = len(known[0]) == len(params) and known[1] == buffer.numel()
        if not (same and all(p is q for p, q in zip(params, known[0]))):
            known = None
    if known is None:
        # On the caller's thread, in DDP's bucket order: unnamed parameters are numbered here.
        tensors, layout = _describe(state, params, bucket.gradients(), buffer.storage_offset())
        known = state._described[b] = (params, buffer.numel(), tensors, layout)
    tensors, layout = known[2], known[3]
    state._ddp[b] = layout
    if not state._begun:
        state._begun = True
        if state._steps_here == 0:
            state._owner_check(_rank(state.process_group))
        # Until DDP rebuilds them, its buckets are the first ones of this process (the first
        # step's, or these again): where they are not the kept ones, the step waits.
        first = state._first_buckets is None or state._first_buckets.get(b) == layout
        if state._resumed and not state._rebuilt and first and state.layouts.get(b) != layout:
            state._held = []
            state._held_any = True
    if state._held is not None:
        fut = torch.futures.Future()
        state._held.append((b, buffer, params, bucket.gradients(), tensors, layout, fut))
        if not bucket.is_last():
            return fut
        held = state._held
        try:
            _resume_step(state, held)
        except BaseException:
            state._reset_step()
            raise
        finally:
            # Set even after a fault, so that nothing waits on them for ever.
            for _, buf, _, _, _, _, f in held:
                f.set_result(buf)
        return fut
    one = (b, buffer, tensors, layout)
    if state.overlap and not bucket.is_last():
        return state._worker.submit(lambda: _exchange(state, *one), buffer)
    error = state._worker.drain()
    try:
        if error is not None:
            raise error
        _exchange(state, *one)
        if bucket.is_last():
            _finish_step(state)
    except BaseException:
        state._reset_step()
        raise
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def _resume_step(state, held):
    """A step of a resumed state on DDP's first buckets (``held``), which are not the kept
    ones: each kept bucket, in index order, is gathered from DDP's buckets into a flat buffer
    laid out as it was, exchanged under its own index, and its result written back into DDP's
    buckets. Where DDP's buckets hold other parameters than the kept ones, they are exchanged
    as they are."""
    grads, shapes = {}, {}
    for _, _, params, gs, _, layout, _ in held:
        for p, g, (key, shape, _) in zip(params, gs, layout):
            grads[key] = (p, g)
            shapes[key] = shape
    kept = {key: shape for layout in state.layouts.values() for key, shape, _ in layout}
    count = sum(len(layout) for layout in state.layouts.values())
    if kept != shapes or count != len(kept):
        logger.warning(
            "codec hook: the state's kept buckets hold parameters %s, DDP's buckets of step %d "
            "hold %s (another model, or names given on one side only: pass names= again with "
            "set_names after loading); the step runs on DDP's buckets",
            sorted(map(str, kept)),
            state.iter,
            sorted(map(str, shapes)),
        )
        for b, buffer, _, _, tensors, layout, _ in held:
            _exchange(state, b, buffer, tensors, layout)
        _finish_step(state)
        return
    for b in sorted(state.layouts):
        parts = [grads[key] for key, _, _ in state.layouts[b]]
        flat = torch.cat([g.detach().reshape(-1).to("cpu", torch.float32) for _, g in parts])
        views, at = [], 0
        for p, _ in parts:
            views.append(flat[at : at + p.numel()].view(p.shape))
            at += p.numel()
        tensors, layout = _describe(state, [p for p, _ in parts], views, flat.storage_offset())
        _exchange(state, b, flat, tensors, layout)
        for (_, g), v in zip(parts, views):
            g.copy_(v)
    _finish_step(state)


def _finish_step(state):
    """The step's last agreement (a decode fault of any rank stops every rank) and its
    commit."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    _Mover(state, group, "the step's last agreement").agree(_DECODE if state._fault else 0)
    if state._fault is not None:
        raise state._fault
    state._commit()


def _exchange(state, b, buffer, tensors, layout):
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    step = state.iter
    n = buffer.numel()
    feedback = bool(state.error_feedback) and step >= state.start_iter
    e, codec_state = state._kept(b, layout, n, feedback)
    stateful = state.codec.stateful
    # The contract's state is always empty for a codec that is not stateful.
    meta = Codec.meta(state.seed, step, b, rank, n, tensors, codec_state if stateful else b"")

    direct = buffer.dtype == torch.float32 and buffer.device.type == "cpu"
    direct = direct and buffer.is_contiguous()
    # The bucket itself where it is a CPU float32 buffer (its .numpy() shares memory): the
    # codec reads it and the decode writes the result straight back into it.
    data = buffer if direct else buffer.detach().to("cpu", torch.float32).contiguous()
    # DDP's bucket holds the local gradient; the host's arrive divided by the rank count.
    data.div_(world)

    residual = None
    if feedback:
        if e is not None:
            data.add_(e)
        # A fresh tensor each step: a residual once committed is never written again, so a
        # reference to it (a checkpoint being written) stays what it was.
        residual = torch.empty(n, dtype=torch.float32)

    # The host's exchange (lsgd_runtime::exchange): rounds, agreement, sum or gather, decodes,
    # the residual and the next codec state; the decoded sum replaces ``data``.
    move = _Mover(state, group, f"bucket {b}")
    try:
        _, _, next_state, fault = state.codec.exchange(
            meta,
            data.numpy(),
            move,
            rank=rank,
            size=world,
            own="skip" if residual is None else {"own": "decode", "mean": "mean"}[state.error_feedback],
            failed=state._fault is not None,
            residual=None if residual is None else residual.numpy(),
        )
    except Exception:
        # Stopped at the agreement this rank failed in (an earlier bucket's decode): its own
        # fault is the one to raise.
        if state._fault is not None:
            raise state._fault from None
        raise
    if fault is not None:
        # Told to the other ranks at the next agreement (the next bucket's, or the step's last).
        state._fault = fault
    else:
        state._staged[b] = (residual, next_state, layout)
        if not direct:
            buffer.copy_(data)


# Checkpoints loaded with torch.load's default, weights_only=True, may hold a CodecState: its
# pickled state is made of what that loader accepts (tensors, dicts, tuples, str, numbers).
# Before torch 2.4 that loader had no allowlist (and weights_only was not the default).
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([CodecState])
