"""How a bucket's bytes move in the codec hook: ``_Mover``, the collectives of one bucket over
``torch.distributed`` that the host's exchange (``Codec.exchange``) calls back into, and
``_Worker``, the thread that runs a state's bucket exchanges while autograd goes on."""

import queue
import threading

import torch
import torch.distributed as dist

from .errors import PluginFault

#: The lengths a rank sends in an agreement when its codec faulted in encode or in decode.
_ENCODE, _DECODE = -1, -2

#: A summable codec's element type (``Codec.element``) as the dtype its payloads are summed in.
_ELEMENTS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


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
