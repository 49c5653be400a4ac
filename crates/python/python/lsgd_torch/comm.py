"""Gradient compression for ``DistributedDataParallel`` through lsgd-host's codec plugins.

``model.register_comm_hook(CodecState(None, "codec-top-k"), codec_hook)`` moves each DDP bucket
as ``lsgd-host run --codec`` moves its buckets (``crates/train/src/exchange/codec.rs``): the same
plugin, the same bucket metadata and seeds (``Codec.meta``), the same rounds, the same sum or
gather, the same error feedback (GRACE's residual: p = g + e; e <- p - decode(own payload)),
and for a stateful codec (contract 0.4: ``codec-powersgd``'s warm start) the same per-bucket
codec state (``Codec.next_state`` of what every rank received, the next step's
``BucketMeta.state``), kept as the trainer keeps it (``crates/train/src/exchange/carry.rs``). The exchange itself is
the host's, in Rust (``lsgd_runtime::exchange``, through ``Codec.exchange``); this module is
the DDP glue: buckets, residuals and states, the collectives over ``torch.distributed``, and a
thread that moves a bucket while autograd computes the next. ``Codec.round_trip`` is the same
exchange on one rank, as ``lsgd-host compare`` runs it.
"""

import logging
import queue
import threading
import time

import torch
import torch.distributed as dist

from . import _plugins
from ._native import Codec, blake3_hex
from .errors import PluginFault

__all__ = ["CodecState", "codec_hook"]

logger = logging.getLogger(__name__)

#: The lengths a rank sends in an agreement when its codec faulted in encode or in decode.
_ENCODE, _DECODE = -1, -2

#: A summable codec's element type (``Codec.element``) as the dtype its payloads are summed in.
_ELEMENTS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


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
    Error feedback starts at iteration ``start_iter`` (1: after the bucket
    rebuild DDP does after its first iteration; a residual kept before it would belong to
    another layout). ``names`` (the model, a ``{name: parameter}`` dict or pairs) gives the
    codec the parameters' names; without it they are ``param0``, ``param1``, ... per bucket.
    ``overlap=False`` exchanges every bucket on the caller's thread (see :func:`codec_hook`).

    A stateful codec (``codec.stateful``: ``codec-powersgd`` unless ``warm_start=false``) keeps
    a state per bucket from step 0 on, whatever ``start_iter`` says: the same bytes on every
    rank, as the codec computes them from what every rank received. A step's new residuals and
    states become the state only once its last bucket is through, and a bucket whose layout
    changed (DDP's rebuild) drops both its residual and its codec state.

    It pickles like PyTorch's ``PowerSGDState``: without the process group (``None`` after
    loading: the default group), with the residuals and codec states, and reloads the plugin,
    refusing one whose blake3 or parameters differ from the saved ones. ``names`` is not kept
    (parameters are identified by object); pass it again with :meth:`set_names`.
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
        "states",
        "layouts",
        "bytes_sent",
        "total_bytes_sent",
    )

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
        #: The bucket layout ((shape, offset) per tensor) each bucket's residual and codec state
        #: belong to, to tell a rebuilt bucket.
        self.layouts = {}
        #: Payload bytes this rank sent in the last step (every bucket and round).
        self.bytes_sent = 0
        #: The same over every step.
        self.total_bytes_sent = 0
        self._load()
        self.set_names(names)

    def _load(self):
        self.codec = Codec(self.plugin, self.settings, **self.limits)
        self._worker = _Worker()
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

    def set_names(self, names):
        """Names the parameters for the codec: the model, a ``{name: parameter}`` dict, or
        (name, parameter) pairs; ``None`` forgets them."""
        self._names = _param_names(names)

    def _rank_record(self):
        # check_ranks requires "state" to be equal on every rank. The residuals are not: each
        # rank keeps what its own codec dropped of its own gradients (the host keeps them "per
        # bucket and per rank" too). What every rank must share is the bucket layout the
        # residuals and codec states belong to (DDP syncs its rebuilt buckets from rank 0) and
        # a stateful codec's states, computed from what every rank received (the host compares
        # them in its consistency check); the residuals' own digest is reported beside it, for
        # a look, not for comparison.
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
        """Everything but the process group and the loaded plugin (reloaded when unpickled)."""
        logger.warning("NOTE: Process group is not serializable and excluded from a saved state.")
        state = {k: getattr(self, k) for k in self._PICKLED}
        state["codec_blake3"] = self.codec.blake3
        state["codec_params"] = self.codec.params
        return state

    def __setstate__(self, state):
        """Restores a pickled state: reloads the plugin, checks that it is the one saved, and
        leaves ``process_group`` None (the default group). A state pickled before codec states
        were kept has none."""
        logger.warning(
            "NOTE: Process group will be set to the default group. If a different group is "
            "desired, set `process_group` after the state is loaded."
        )
        saved = (state.pop("codec_blake3"), [tuple(p) for p in state.pop("codec_params")])
        state.setdefault("states", {})
        state.setdefault("overlap", True)
        # Saved before "mean" existed: True was GRACE's residual.
        state["error_feedback"] = _feedback(state["error_feedback"])
        for k, v in state.items():
            setattr(self, k, v)
        self.process_group = None
        self._load()
        self._names = {}
        loaded = (self.codec.blake3, [tuple(p) for p in self.codec.params])
        if loaded != saved:
            raise ValueError(
                f"codec {self.codec.label}: the state was saved with blake3 {saved[0]} and "
                f"params {saved[1]}, but the plugin loaded now has blake3 {loaded[0]} and "
                f"params {loaded[1]}; its residuals and codec states belong to the other one"
            )

    def _commit(self):
        for b, (residual, codec_state, layout) in self._staged.items():
            if self.layouts.get(b) != layout:
                # A rebuilt bucket: nothing kept for the old layout survives.
                self.residuals.pop(b, None)
                self.states.pop(b, None)
            if residual is not None:
                self.residuals[b] = residual
            if codec_state is not None:
                self.states[b] = codec_state
            self.layouts[b] = layout
        self.bytes_sent = self._step_bytes
        self.total_bytes_sent += self._step_bytes
        self.iter += 1
        self._reset_step()

    def _kept(self, b, layout):
        """Bucket ``b``'s residual (or None) and codec state (or ``b""``), both as if nothing
        were kept where what is kept belongs to another layout (the step's commit then drops
        it)."""
        e, kept_state = self.residuals.get(b), self.states.get(b, b"")
        if (e is None and not kept_state) or self.layouts.get(b) == layout:
            return e, kept_state
        # A dropped residual loses what the codec has not sent yet; a dropped codec state only
        # makes the codec start the bucket afresh (a state kept from step 0, before DDP's
        # rebuild, is expected to go).
        log = logger.warning if e is not None else logger.info
        log(
            "codec hook: bucket %s changed layout (a DDP bucket rebuild after its %s was "
            "kept); it is dropped",
            b,
            "residual" if e is not None else "codec state",
        )
        return None, b""


class _Mover:
    """The collectives of one bucket on the state's group, for ``Codec.exchange`` (the host's
    exchange, in Rust, calls ``lengths``, ``sum`` and ``gather`` with the GIL taken back)."""

    def __init__(self, state, group, meta_text):
        self.state = state
        self.group = group
        self.size = dist.get_world_size(group)
        self.where = meta_text
        self.codec = state.codec
        self._lens = []
        # Collectives run where the backend wants their tensors (NCCL: the current GPU).
        self.device = torch.device("cpu")
        if dist.get_backend(group) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())

    def agree(self, length):
        """Every rank's payload length, so that a fault on one rank (a length of ``_ENCODE`` or
        ``_DECODE``) stops every rank instead of leaving them waiting in the next collective (the
        host's ``agree_lengths``)."""
        mine = torch.tensor([length], dtype=torch.int64, device=self.device)
        lens = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(lens, mine, group=self.group)
        lens = [int(t.item()) for t in lens]
        failed = [(r, n) for r, n in enumerate(lens) if n < 0]
        if failed and length >= 0:
            rank, code = failed[0]
            call = "encode" if code == _ENCODE else "decode"
            raise PluginFault(
                self.codec.label,
                call,
                self.state.iter,
                f"codec {self.codec.label}: {call} failed on rank {rank} at step "
                f"{self.state.iter} ({self.where}); see that rank's error",
            )
        return lens

    def lengths(self, length):
        """``agree`` for the exchange: ``None`` when this rank's codec failed (in this round's
        encode, or in an earlier bucket's decode)."""
        if length is None:
            self._lens = self.agree(_DECODE if self.state._fault is not None else _ENCODE)
            return self._lens
        self._lens = self.agree(length)
        self.state._step_bytes += length
        return self._lens

    def sum(self, element, payload):
        """The sum over ranks of a summable payload (a bytearray of ``element``s), summed into
        it in place."""
        if not payload:
            return payload
        t = torch.frombuffer(payload, dtype=_ELEMENTS[element])
        if self.device.type == "cpu":
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        else:
            moved = t.to(self.device)
            dist.all_reduce(moved, op=dist.ReduceOp.SUM, group=self.group)
            t.copy_(moved.cpu())
        return payload

    def gather(self, payload):
        """Every rank's payload, in rank order (padded to the longest for the all-gather)."""
        lens = self._lens
        width = max(lens)
        mine = torch.zeros(width, dtype=torch.uint8)
        if payload:
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        mine = mine.to(self.device)
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(everyone, mine, group=self.group)
        return [t[:n].cpu().numpy().tobytes() for t, n in zip(everyone, lens)]


def _layout(bucket, buffer, names):
    """The bucket's tensors as ``Codec.meta`` takes them, and their layout."""
    base = buffer.storage_offset()
    tensors = []
    for i, (p, g) in enumerate(zip(bucket.parameters(), bucket.gradients())):
        # gradients() are views into the bucket's flat buffer: their offset is the slice's.
        name = names.get(id(p), f"param{i}")
        tensors.append((name, list(p.shape), 0, g.storage_offset() - base, p.numel()))
    layout = tuple((tuple(shape), offset) for _, shape, _, offset, _ in tensors)
    return tensors, layout


class _Worker:
    """Runs one state's bucket exchanges on a thread of its own, in the order DDP hands the
    buckets over (its bucket order, the same on every rank, so every rank makes the same
    collective calls in the same order), while autograd goes on computing the next buckets'
    gradients. The first exception of a step is kept for the step's last bucket to raise on the
    caller's thread: set on a future it would reach ``backward()`` as a RuntimeError without its
    type. Once a bucket has failed the step's later buckets are not exchanged: every rank stopped
    at the same agreement."""

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._thread = None
        self._error = None

    def submit(self, work, result):
        """A future of ``result``, set once ``work()`` has run (or been skipped after a
        failure)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lsgd-codec-hook", daemon=True)
            self._thread.start()
        fut = torch.futures.Future()
        self._jobs.put((work, result, fut))
        return fut

    def _run(self):
        while True:
            work, result, fut = self._jobs.get()
            if work is not None and self._error is None:
                try:
                    work()
                except BaseException as e:  # raised by the step's last bucket
                    self._error = e
            fut.set_result(result)

    def drain(self):
        """Waits until every bucket handed over is through; returns the step's first exception
        (or None) and forgets it."""
        if self._thread is not None:
            self.submit(None, None).wait()
        error, self._error = self._error, None
        return error


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

    Faults raise ``PluginFault`` on the rank where the plugin failed and on the others (naming
    that rank); the state is then as before the step.
    """
    if state.overlap and not bucket.is_last():
        return state._worker.submit(lambda: _exchange(state, bucket), bucket.buffer())
    error = state._worker.drain()
    try:
        if error is not None:
            raise error
        _exchange(state, bucket)
    except BaseException:
        state._reset_step()
        raise
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _exchange(state, bucket):
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    buffer = bucket.buffer()
    b = bucket.index()
    step = state.iter
    tensors, layout = _layout(bucket, buffer, state._names)
    n = buffer.numel()
    e, codec_state = state._kept(b, layout)
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
    if state.error_feedback and step >= state.start_iter:
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
        if residual is not None or next_state is not None:
            state._staged[b] = (residual, next_state, layout)
        if not direct:
            buffer.copy_(data)

    if bucket.is_last():
        _Mover(state, group, "the step's last agreement").agree(_DECODE if state._fault else 0)
        if state._fault is not None:
            raise state._fault
        state._commit()
